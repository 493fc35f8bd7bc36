//! `qpath stats`: per-queue tables from a target's or a host's RPC socket.

use std::path::PathBuf;

use serde_json::Value;

/// Arguments of `qpath stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// RPC socket of a `qpath target` or of a host process (`qpath bench --rpc-socket`).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Print the raw JSON.
    #[arg(long)]
    json: bool,
}

fn lat(q: &Value, dir: &str, key: &str) -> String {
    q["latency"][dir][key].as_f64().map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
}

pub fn run(a: StatsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let socket = a.socket.unwrap_or_else(crate::default_rpc_socket);
    let v = target::rpc::client_call(&socket, "stats", serde_json::json!({}))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let side = v["side"].as_str().unwrap_or("?");
    println!("{side} queues");
    println!(
        "{:<32} {:>6} {:>4} {:>11} {:>6} {:>6} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}",
        "subsystem / address",
        "cntlid",
        "qid",
        "commands",
        "inflt",
        "errors",
        "reads",
        "writes",
        "rd p50us",
        "rd p99us",
        "wr p50us",
        "wr p99us"
    );
    for q in v["queues"].as_array().into_iter().flatten() {
        let name = q["subnqn"].as_str().or_else(|| q["traddr"].as_str()).unwrap_or("-");
        let name: String = name.chars().rev().take(32).collect::<Vec<_>>().into_iter().rev().collect();
        println!(
            "{:<32} {:>6} {:>4} {:>11} {:>6} {:>6} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}",
            name,
            q["cntlid"],
            q["qid"],
            q["commands"],
            q["outstanding"],
            q["errors"],
            q["reads"],
            q["writes"],
            lat(q, "read", "p50_us"),
            lat(q, "read", "p99_us"),
            lat(q, "write", "p50_us"),
            lat(q, "write", "p99_us"),
        );
    }
    if let Some(ports) = v["ports"].as_array() {
        println!("\nports");
        for p in ports {
            println!(
                "  port {:>3}: {} connections, {} I/Os, {} bytes, {} errors",
                p["port"], p["connections"], p["ios"], p["bytes"], p["errors"]
            );
        }
    }
    if let Some(nss) = v["namespaces"].as_array() {
        println!("\nnamespaces");
        for n in nss {
            let c = &n["counters"];
            println!(
                "  {} nsid {}: {} reads ({} B), {} writes ({} B), {} errors",
                n["subnqn"].as_str().unwrap_or(""),
                c["nsid"],
                c["reads"],
                c["read_bytes"],
                c["writes"],
                c["write_bytes"],
                c["errors"]
            );
        }
    }
    Ok(())
}
