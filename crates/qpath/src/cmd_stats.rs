//! `qpath stats`: per-queue tables from a target's or a host's RPC socket.

use std::path::PathBuf;

use serde_json::Value;

/// Arguments of `qpath stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// RPC socket of a `qpath target` or of a host process (`qpath bench --rpc-socket`).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// On a host process's socket: the statistics of its embedded target instead of the host's.
    #[arg(long)]
    target: bool,
    /// Print the raw JSON.
    #[arg(long)]
    json: bool,
}

fn lat(q: &Value, dir: &str, key: &str) -> String {
    q["latency"][dir][key].as_f64().map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
}

/// The last `n` characters of `s` (NQNs differ at the end).
fn tail(s: &str, n: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    chars[chars.len().saturating_sub(n)..].iter().collect()
}

pub fn run(a: StatsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let socket = a.socket.unwrap_or_else(crate::client_rpc_socket);
    let method = if a.target { "target_stats" } else { "stats" };
    let v = target::rpc::client_call(&socket, method, serde_json::json!({}))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let side = v["side"].as_str().unwrap_or("?");
    let host = side == "host";
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
        // A host talks to one subsystem through several addresses: name the address too.
        let name =
            if host { format!("{} {}", tail(name, 14), q["traddr"].as_str().unwrap_or("")) } else { name.into() };
        println!(
            "{:<32} {:>6} {:>4} {:>11} {:>6} {:>6} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}",
            tail(&name, 32),
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
    if let Some(ctrls) = v["controllers"].as_array() {
        println!("\ncontrollers");
        for c in ctrls {
            println!(
                "  ctrl {:>3}: {} {} cntlid {} {}, {} reconnects, {} re-authentications ({} failed), {}/{} queues used, {} I/Os, {} errors, {} queue failures",
                c["ctrl"],
                c["traddr"].as_str().unwrap_or(""),
                c["subnqn"].as_str().unwrap_or(""),
                c["cntlid"],
                c["state"].as_str().unwrap_or("?"),
                c["reconnects"],
                c["reauths"].as_u64().unwrap_or(0) + c["reauth_failures"].as_u64().unwrap_or(0),
                c["reauth_failures"],
                c["queues_used"],
                c["io_queues"],
                c["ios"],
                c["errors"],
                c["failures"],
            );
        }
    }
    if let Some(paths) = v["paths"].as_array() {
        println!("\npaths");
        for p in paths {
            println!(
                "  {} nsid {} via ctrl {} ({}): {} I/Os, {} bytes, {} errors, rd p99 {} us, wr p99 {} us",
                p["subnqn"].as_str().unwrap_or(""),
                p["nsid"],
                p["ctrl"],
                p["traddr"].as_str().unwrap_or("?"),
                p["ios"],
                p["bytes"],
                p["errors"],
                lat(p, "read", "p99_us"),
                lat(p, "write", "p99_us"),
            );
        }
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
    if let Some(reactors) = v["reactors"].as_array() {
        println!("\nreactors (data buffer pools)");
        for r in reactors {
            let kib = |k: &str| r[k].as_u64().unwrap_or(0) / 1024;
            println!(
                "  reactor {:>2}: {} KiB out, {} KiB cached, {} allocated, {} released",
                r["reactor"],
                kib("buffer_outstanding_bytes"),
                kib("buffer_cached_bytes"),
                r["buffer_allocations"],
                r["buffer_released"]
            );
        }
    }
    if let Some(a) = v["auth"].as_object() {
        println!("\nauthentication (DH-HMAC-CHAP)");
        let n = |k: &str| a.get(k).and_then(Value::as_u64).unwrap_or(0);
        let (submitted, computed, abandoned) =
            (n("dh_steps_submitted"), n("dh_steps_computed"), n("dh_steps_abandoned"));
        println!(
            "  {submitted} DH steps: {computed} computed, {abandoned} skipped (connection closed), {} pending; {} hosts waiting",
            submitted.saturating_sub(computed + abandoned),
            n("dh_hosts_waiting"),
        );
        println!(
            "  transactions: {} accepted ({} re-authentications), {} refused ({} re-authentications)",
            n("transactions_accepted"),
            n("reauthentications_accepted"),
            n("transactions_refused"),
            n("reauthentications_refused"),
        );
    }
    if let Some(nss) = v["namespaces"].as_array() {
        println!("\nnamespaces");
        for n in nss {
            let c = &n["counters"];
            let paths = if host { format!(" ({} paths)", n["paths"]) } else { String::new() };
            println!(
                "  {} nsid {}{paths}: {} reads ({} B), {} writes ({} B), {} errors",
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
