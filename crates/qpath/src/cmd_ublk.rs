//! `qpath ublk add|del|list` and `qpath host`: a namespace (one multipath head) as a Linux
//! block device, `/dev/ublkbN` (ublk_drv, Linux 6.0+), served by a `qpath host` process
//! (or by `qpath ublk add --foreground` itself).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use blockdev::rpc::{RpcServer, call_socket};
use blockdev::service::{AddOptions, Service, default_state_dir};
use blockdev::ublk::device::{DEPTH_DEFAULT, delete_device, list_devices};
use serde_json::{Value, json};

use crate::head_args::HeadArgs;

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
    #[arg(short = 'n', long = "id")]
    dev_id: u32,
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
pub struct HostArgs {
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
        let sock = a.rpc_socket.clone().unwrap_or_else(default_host_socket);
        let mut params = serde_json::to_value(&spec)?;
        if let Some(m) = params.as_object_mut() {
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
    let sock = a.rpc_socket.clone().unwrap_or_else(default_host_socket);
    if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
        call_socket(&sock, "ublk_del", &json!({"dev_id": a.dev_id}), CALL_TIMEOUT)?;
    } else {
        delete_device(a.dev_id)?;
    }
    println!("deleted /dev/ublkb{}", a.dev_id);
    Ok(())
}

fn list(a: &ListArgs) -> R {
    let v: Value = if a.kernel {
        serde_json::to_value(list_devices()?)?
    } else if let Some(sock) = &a.rpc_socket {
        call_socket(sock, "ublk_list", &json!({}), CALL_TIMEOUT)?
    } else {
        match call_socket(&default_host_socket(), "ublk_list", &json!({}), CALL_TIMEOUT) {
            Ok(v) => v,
            Err(_) => serde_json::to_value(list_devices()?)?,
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<14} {:<9} {:>7} {:>6} {:>5} {:>14} {:>6}  namespace",
        "device", "state", "pid", "queues", "depth", "bytes", "block"
    );
    for d in v.as_array().map_or(&[][..], Vec::as_slice) {
        let ns = match d.get("subnqn") {
            Some(n) => format!("{} nsid {} via {}", n.as_str().unwrap_or("?"), d["nsid"], d["paths"]),
            None => String::new(),
        };
        println!(
            "/dev/ublkb{:<4} {:<9} {:>7} {:>6} {:>5} {:>14} {:>6}  {ns}",
            d["dev_id"],
            d["state"].as_str().unwrap_or("?"),
            d["pid"],
            d["queues"],
            d["depth"],
            d["size"],
            d["block_size"]
        );
    }
    Ok(())
}

pub fn host(a: HostArgs) -> R {
    let stop = stop_on_signals()?;
    let state_dir = a.state_dir.clone().unwrap_or_else(default_state_dir);
    let _one_host = blockdev::ublk::lock_state_dir(&state_dir)?;
    let svc = Service::new(state_dir.clone());
    if !a.no_recover {
        for (id, r) in svc.recover_all() {
            match r {
                Ok(path) => println!("{path}: taken over (the previous server's I/O resumes)"),
                Err(why) => println!("/dev/ublkb{id}: not taken over: {why}"),
            }
        }
    }
    let sock = a.rpc_socket.clone().unwrap_or_else(default_host_socket);
    let rpc = RpcServer::start(&sock, Arc::clone(&svc))?;
    println!("qpath host: control socket {}, state in {}", sock.display(), state_dir.display());
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
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
