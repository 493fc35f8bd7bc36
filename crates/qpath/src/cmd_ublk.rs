//! `qpath ublk add|del|list` and `qpath host`: a namespace (one multipath head) as a Linux
//! block device, `/dev/ublkbN` (ublk_drv, Linux 6.0+), served by a `qpath host` process
//! (or by `qpath ublk add --foreground` itself).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use blockdev::host_config::HostConfig;
use blockdev::rpc::{RpcServer, call_socket};
use blockdev::service::{AddOptions, Service, default_state_dir};
use blockdev::ublk::device::{DEPTH_DEFAULT, delete_device, list_devices};
use serde_json::{Value, json};

use crate::head_args::HeadArgs;
use crate::sd_notify::{self, Notifier};

/// How long an RPC to `qpath host` may take (ublk_add connects and starts a device).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The default control socket of `qpath host`: `$QPATH_HOST_SOCKET`, else
/// `$XDG_RUNTIME_DIR/qpath-host.sock`, else `/tmp/qpath-host.sock`.
pub fn default_host_socket() -> PathBuf {
    if let Some(p) = std::env::var_os("QPATH_HOST_SOCKET") {
        return p.into();
    }
    let dir = std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    dir.join("qpath-host.sock")
}

/// The control socket of the packaged service (`qpath-host.service`,
/// `RuntimeDirectory=qpath-host`).
pub const SERVICE_HOST_SOCKET: &str = "/run/qpath-host/qpath-host.sock";

/// The socket `qpath ublk` talks to when none is given: the default
/// ([`default_host_socket`]) when it exists, else the service's when that exists, else the
/// default (whose absence the error names).
fn client_host_socket() -> PathBuf {
    crate::own_or_service_socket(default_host_socket(), "QPATH_HOST_SOCKET", SERVICE_HOST_SOCKET)
}

/// `qpath ublk`.
#[derive(clap::Args, Debug)]
pub struct UblkArgs {
    #[command(subcommand)]
    cmd: UblkCmd,
}

#[derive(clap::Subcommand, Debug)]
enum UblkCmd {
    /// Create /dev/ublkbN over a namespace's paths (served by `qpath host`, or here with --foreground).
    Add(Box<AddArgs>),
    /// Delete a ublk device (its I/O stops; its paths are disconnected).
    Del(DelArgs),
    /// List the machine's ublk devices.
    List(ListArgs),
}

#[derive(clap::Args, Debug)]
struct AddArgs {
    #[command(flatten)]
    head: HeadArgs,
    /// Device number (/dev/ublkbN); the kernel picks the first free one by default.
    #[arg(long = "id")]
    dev_id: Option<u32>,
    /// A name for the device (letters, digits, '.', '_', '-', ':'): how a `qpath host
    /// --config` names it in its file, its log and `qpath ublk del --name`.
    #[arg(long, conflicts_with = "foreground")]
    name: Option<String>,
    /// Queues: each is one thread with its own completion context and I/O queue per path.
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Tags (requests in flight) per queue.
    #[arg(long, default_value_t = DEPTH_DEFAULT)]
    depth: u16,
    /// Largest request in bytes (capped by the controller's MDTS); each tag holds a buffer
    /// of this size.
    #[arg(long, default_value_t = blockdev::device::TRANSFER_CAP_DEFAULT)]
    max_transfer: u32,
    /// Serve the device read-only.
    #[arg(long)]
    read_only: bool,
    /// Serve the device from this process until SIGINT or SIGTERM (then delete it),
    /// instead of asking the `qpath host` on --rpc-socket.
    #[arg(long)]
    foreground: bool,
    /// Control socket of the `qpath host` that serves the device.
    #[arg(long)]
    rpc_socket: Option<PathBuf>,
    /// With --foreground: where the device's state file goes.
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct DelArgs {
    /// Device number (/dev/ublkbN).
    #[arg(short = 'n', long = "id", required_unless_present = "name", conflicts_with = "name")]
    dev_id: Option<u32>,
    /// The name of a device a `qpath host --config` serves (or failed to create): it is
    /// deleted and taken out of the configuration.
    #[arg(long)]
    name: Option<String>,
    /// Control socket of the `qpath host` serving it (used when one answers there).
    #[arg(long)]
    rpc_socket: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ListArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Control socket of a `qpath host` (its devices are shown with their namespace);
    /// without it, the default socket is asked if a `qpath host` answers there.
    #[arg(long, conflicts_with = "kernel")]
    rpc_socket: Option<PathBuf>,
    /// Only what the kernel reports (no `qpath host` is asked).
    #[arg(long)]
    kernel: bool,
}

/// `qpath host`.
#[derive(clap::Args, Debug)]
#[command(after_help = HOST_AFTER_HELP)]
pub struct HostArgs {
    /// TOML file of the ublk devices to serve: one [[ublk]] table each, with the keys of
    /// `ublk_add` (paths, subnqn, nsid, id, name, queues, ...). At start each is taken over
    /// if a previous qpath host left it, else created; one that cannot be created is
    /// logged and listed (qpath ublk list) with the reason, and the others are served.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Save the --config file after every `ublk add` / `ublk del` (RPC ublk_add,
    /// ublk_del), before it answers: atomically, the previous file kept as FILE.bak.
    /// Without it the file is only read.
    #[arg(long, requires = "config")]
    persist: bool,
    /// Check the --config file and print the devices it would serve, then exit: nothing
    /// is connected, created or locked.
    #[arg(long, requires = "config")]
    check: bool,
    /// Control socket (default: $QPATH_HOST_SOCKET, else $XDG_RUNTIME_DIR/qpath-host.sock,
    /// else /tmp/qpath-host.sock).
    #[arg(long)]
    rpc_socket: Option<PathBuf>,
    /// Where device state files live (default: $QPATH_STATE_DIR, else
    /// $XDG_RUNTIME_DIR/qpath, else /run/qpath).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Do not take over the devices a previous qpath host left.
    #[arg(long)]
    no_recover: bool,
    /// Delete the devices at exit instead of leaving them for the next qpath host.
    #[arg(long)]
    delete_on_exit: bool,
}

const HOST_AFTER_HELP: &str = "\
Signals: SIGINT and SIGTERM stop serving and leave the devices to the next qpath host
(--delete-on-exit deletes them). SIGHUP re-reads the --config file and creates the devices
it lists that are not served (new ones, and those that failed); a device no longer listed
goes on being served (`qpath ublk del` deletes it): an edit never deletes a device.

A configured device whose paths did not connect is tried again every reconnect_delay
seconds until ctrl_loss_tmo passes (for ever with ctrl_loss_tmo = -1); any other failure
(no ublk driver, no such namespace) is tried again at the next start or SIGHUP. Under
--persist a device `ublk add` could not create stays in the file until `ublk del --name`.";

type R = Result<(), Box<dyn std::error::Error>>;

pub fn run(a: UblkArgs) -> R {
    match a.cmd {
        UblkCmd::Add(x) => add(*x),
        UblkCmd::Del(x) => del(&x),
        UblkCmd::List(x) => list(&x),
    }
}

fn stop_on_signals() -> Result<Arc<AtomicBool>, Box<dyn std::error::Error>> {
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    Ok(stop)
}

fn add(a: AddArgs) -> R {
    let spec = a.head.spec()?;
    let opts = AddOptions {
        dev_id: a.dev_id,
        queues: a.queues,
        depth: a.depth,
        max_transfer: a.max_transfer,
        read_only: a.read_only,
    };
    if !a.foreground {
        let sock = a.rpc_socket.clone().unwrap_or_else(client_host_socket);
        let mut params = serde_json::to_value(&spec)?;
        if let Some(m) = params.as_object_mut() {
            if let Some(n) = &a.name {
                m.insert("name".into(), json!(n));
            }
            m.insert("queues".into(), json!(opts.queues));
            m.insert("depth".into(), json!(opts.depth));
            m.insert("max_transfer".into(), json!(opts.max_transfer));
            m.insert("read_only".into(), json!(opts.read_only));
            if let Some(id) = opts.dev_id {
                m.insert("dev_id".into(), json!(id));
            }
        }
        if std::os::unix::net::UnixStream::connect(&sock).is_err() {
            return Err(format!(
                "no qpath host answers on {}: start one (`qpath host`), or add --foreground to serve the device from this process",
                sock.display()
            )
            .into());
        }
        let r = call_socket(&sock, "ublk_add", &params, CALL_TIMEOUT)?;
        println!("{}", r["path"].as_str().unwrap_or("?"));
        return Ok(());
    }
    let stop = stop_on_signals()?;
    let svc = Service::new(a.state_dir.clone().unwrap_or_else(default_state_dir));
    let r = svc.ublk_add(&spec, &opts)?;
    println!(
        "{} ready: namespace {} of {} ({} bytes, {} B blocks, {} path(s), iopolicy {}); SIGINT or SIGTERM deletes it",
        r["path"].as_str().unwrap_or("?"),
        spec.nsid,
        spec.subnqn,
        r["size"],
        r["block_size"],
        r["paths"],
        spec.iopolicy
    );
    while !stop.load(Ordering::Relaxed) && !svc.served().is_empty() {
        std::thread::sleep(Duration::from_millis(100));
        svc.reap();
    }
    svc.delete_all();
    Ok(())
}

fn del(a: &DelArgs) -> R {
    let sock = a.rpc_socket.clone().unwrap_or_else(client_host_socket);
    let answers = std::os::unix::net::UnixStream::connect(&sock).is_ok();
    match (&a.name, a.dev_id) {
        (Some(name), _) => {
            if !answers {
                return Err(format!("no qpath host answers on {}: a name is that host's", sock.display()).into());
            }
            call_socket(&sock, "ublk_del", &json!({"name": name}), CALL_TIMEOUT)?;
            println!("deleted {name:?}");
        }
        (None, Some(id)) => {
            if answers {
                call_socket(&sock, "ublk_del", &json!({"dev_id": id}), CALL_TIMEOUT)?;
            } else {
                delete_device(id)?;
            }
            println!("deleted /dev/ublkb{id}");
        }
        (None, None) => return Err("give --id or --name".into()),
    }
    Ok(())
}

fn list(a: &ListArgs) -> R {
    let v: Value = if a.kernel {
        serde_json::to_value(list_devices()?)?
    } else if let Some(sock) = &a.rpc_socket {
        call_socket(sock, "ublk_list", &json!({}), CALL_TIMEOUT)?
    } else {
        match call_socket(&client_host_socket(), "ublk_list", &json!({}), CALL_TIMEOUT) {
            Ok(v) => v,
            Err(_) => serde_json::to_value(list_devices()?)?,
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print!("{}", table(&v));
    Ok(())
}

/// `qpath ublk list`'s table of `ublk_list`'s answer: a line per device; a configured
/// device that is not there, or one whose takeover waits for its paths, says why on a
/// line of its own.
fn table(v: &Value) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "{:<14} {:<9} {:>7} {:>6} {:>5} {:>14} {:>6}  namespace\n",
        "device", "state", "pid", "queues", "depth", "bytes", "block"
    );
    let ns = |d: &Value| match d.get("subnqn") {
        Some(n) => format!("{} nsid {} via {}", n.as_str().unwrap_or("?"), d["nsid"], d["paths"]),
        None => String::new(),
    };
    for d in v.as_array().map_or(&[][..], Vec::as_slice) {
        if d["state"] == "not created" {
            // Configured, not created: the columns of a device it does not have stay empty.
            let _ = writeln!(
                out,
                "{:<14} {:<9} {:>7} {:>6} {:>5} {:>14} {:>6}  {}",
                d["name"].as_str().unwrap_or("?"),
                if d["retrying"] == true { "retrying" } else { "failed" },
                "-",
                "-",
                "-",
                "-",
                "-",
                ns(d)
            );
            let tries = d["attempts"].as_u64().unwrap_or(0);
            let word = if tries == 1 { "attempt" } else { "attempts" };
            let _ =
                writeln!(out, "{:<14} not created after {tries} {word}: {}", "", d["error"].as_str().unwrap_or("?"));
            continue;
        }
        let _ = writeln!(
            out,
            "/dev/ublkb{:<4} {:<9} {:>7} {:>6} {:>5} {:>14} {:>6}  {}",
            d["dev_id"],
            d["state"].as_str().unwrap_or("?"),
            d["pid"],
            d["queues"],
            d["depth"],
            d["size"],
            d["block_size"],
            ns(d)
        );
        if d["takeover"] == "retrying" {
            let _ = writeln!(out, "{:<14} takeover waits for its paths: {}", "", d["error"].as_str().unwrap_or("?"));
        }
    }
    out
}

pub fn host(a: HostArgs) -> R {
    let cfg = match &a.config {
        Some(p) => Some(HostConfig::load(p)?),
        None => None,
    };
    if a.check {
        return check(a.config.as_deref(), cfg.as_ref());
    }
    let stop = stop_on_signals()?;
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&hup))?;
    let state_dir = a.state_dir.clone().unwrap_or_else(default_state_dir);
    let _one_host = blockdev::ublk::lock_state_dir(&state_dir)?;
    let svc = Service::new(state_dir.clone());
    if let (Some(file), Some(cfg)) = (&a.config, cfg) {
        svc.set_config(file.clone(), a.persist, cfg);
    }
    if !a.no_recover {
        for (id, r) in svc.recover_all() {
            match r {
                Ok(path) => println!("{path}: taken over (the previous server's I/O resumes)"),
                Err(why) => println!("/dev/ublkb{id}: not taken over: {why}"),
            }
        }
    }
    for (name, r) in svc.start_configured() {
        match r {
            Ok(path) => println!("{name}: {path}"),
            Err(why) => eprintln!("qpath host: configured device {name:?} not created: {why}"),
        }
    }
    let sock = a.rpc_socket.clone().unwrap_or_else(default_host_socket);
    let rpc = RpcServer::start(&sock, Arc::clone(&svc))?;
    println!("qpath host: control socket {}, state in {}", sock.display(), state_dir.display());
    if a.persist
        && let Some(f) = &a.config
    {
        println!("persisting every ublk add and del to {}", f.display());
    }
    // Under systemd (Type=notify): ready once the control socket answers and every
    // configured device was tried.
    let notifier = Notifier::from_env();
    let notify = |state: &str| {
        if let Some(n) = &notifier {
            n.notify(state);
        }
    };
    notify(&format!("READY=1\n{}", sd_notify::status(&svc.status())));
    let mut shown = svc.status();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if hup.swap(false, Ordering::Relaxed) {
            notify("RELOADING=1");
            match svc.reload() {
                Ok(r) => eprintln!("qpath host: configuration reloaded: {r}"),
                Err(e) => eprintln!("qpath host: configuration not reloaded, nothing changed: {e}"),
            }
            shown = svc.status();
            notify(&format!("READY=1\n{}", sd_notify::status(&shown)));
        }
        svc.retry_due();
        let now = svc.status();
        if now != shown {
            notify(&sd_notify::status(&now));
            shown = now;
        }
    }
    notify(&format!("STOPPING=1\n{}", sd_notify::status("shutting down")));
    rpc.stop();
    if a.delete_on_exit {
        svc.delete_all();
    } else {
        let left = svc.served();
        svc.detach_all();
        if !left.is_empty() {
            println!("left {} ublk device(s) for the next qpath host to take over", left.len());
        }
    }
    Ok(())
}

/// `qpath host --check`: what the file would serve.
fn check(file: Option<&std::path::Path>, cfg: Option<&HostConfig>) -> R {
    let (Some(file), Some(cfg)) = (file, cfg) else { return Err("--check needs --config".into()) };
    for e in &cfg.ublk {
        let dev =
            e.opts.dev_id.map_or_else(|| "/dev/ublkb? (the kernel picks)".to_string(), |i| format!("/dev/ublkb{i}"));
        println!(
            "{}: {dev} over namespace {} of {} via {} (iopolicy {}, {} queue(s) of depth {}{}{})",
            e.label(),
            e.spec.nsid,
            e.spec.subnqn,
            e.spec.paths.join(", "),
            e.spec.iopolicy,
            e.opts.queues,
            e.opts.depth,
            if e.opts.read_only { ", read-only" } else { "" },
            if e.spec.ctrl_loss_tmo < 0 { ", reconnects for ever" } else { "" },
        );
        for f in
            [&e.spec.dhchap_secret_file, &e.spec.dhchap_ctrl_secret_file, &e.spec.tls_key_file].into_iter().flatten()
        {
            if let Err(err) = std::fs::metadata(f) {
                println!("  warning: {}: {err}", f.display());
            }
        }
    }
    println!("{}: configuration OK, {} device(s); nothing was started", file.display(), cfg.ublk.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_says_why_a_device_is_not_served() {
        let v = json!([
            {"dev_id": 0, "state": "live", "pid": 7, "queues": 2, "depth": 64, "size": 268435456, "block_size": 512,
             "subnqn": "nqn.x:y", "nsid": 1, "paths": ["a:4420"]},
            {"dev_id": 1, "state": "quiesced", "pid": -1, "queues": 1, "depth": 128, "size": 4096, "block_size": 512,
             "takeover": "retrying", "error": "connecting nqn.x:y failed: a:4420: refused",
             "subnqn": "nqn.x:y", "nsid": 2, "paths": ["a:4420"]},
            {"name": "db", "state": "not created", "retrying": true, "attempts": 1, "error": "no ublk driver",
             "subnqn": "nqn.x:y", "nsid": 3, "paths": ["a:4420"]},
        ]);
        let t = table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 6, "{t}");
        assert!(
            lines[1].starts_with("/dev/ublkb0")
                && lines[1].contains("live")
                && lines[1].ends_with("nsid 1 via [\"a:4420\"]"),
            "{t}"
        );
        assert!(lines[2].starts_with("/dev/ublkb1") && lines[2].contains("quiesced"), "{t}");
        assert_eq!(lines[3].trim_start(), "takeover waits for its paths: connecting nqn.x:y failed: a:4420: refused");
        assert!(lines[4].starts_with("db ") && lines[4].contains("retrying"), "{t}");
        assert_eq!(lines[5].trim_start(), "not created after 1 attempt: no ublk driver");
    }
}
