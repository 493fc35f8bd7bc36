//! `qpath nbd serve`: a namespace (one multipath head) exported over NBD, for QEMU,
//! `qemu-img`, the kernel's `nbd` and anything else that speaks it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use blockdev::device::{DeviceInfo, LIVE_WAIT_DEFAULT, TRANSFER_CAP_DEFAULT, wait_live};
use blockdev::nbd::server::{CLIENTS_MAX_DEFAULT, Listen, NbdServer, ServeOptions};
use host::context::ContextOptions;

use crate::head_args::HeadArgs;

/// `qpath nbd`.
#[derive(clap::Args, Debug)]
pub struct NbdArgs {
    #[command(subcommand)]
    cmd: NbdCmd,
}

#[derive(clap::Subcommand, Debug)]
enum NbdCmd {
    /// Connect to a namespace's paths and export it over NBD until SIGINT or SIGTERM.
    ///
    /// qemu-img and qemu-io reach it as nbd+unix:///NAME?socket=PATH (or
    /// nbd://HOST:PORT/NAME over TCP); the kernel's nbd with nbd-client.
    Serve(ServeArgs),
}

/// `qpath nbd serve`.
#[derive(clap::Args, Debug)]
struct ServeArgs {
    #[command(flatten)]
    head: HeadArgs,
    /// Serve on a Unix socket at this path (a stale socket is replaced, nothing else).
    #[arg(long, conflicts_with = "listen", required_unless_present = "listen")]
    socket: Option<PathBuf>,
    /// Serve on TCP at IP:PORT (NBD's port is 10809).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// The export's name (clients may also ask for the default, empty name).
    #[arg(long, default_value = "qpath")]
    name: String,
    /// Refuse writes, trims and zeroing.
    #[arg(long)]
    read_only: bool,
    /// Clients at once (each takes one I/O queue of every path).
    #[arg(long, default_value_t = CLIENTS_MAX_DEFAULT)]
    clients: usize,
    /// Largest NVMe command in bytes (capped by the controller's MDTS).
    #[arg(long, default_value_t = TRANSFER_CAP_DEFAULT)]
    max_transfer: u32,
}

type R = Result<(), Box<dyn std::error::Error>>;

pub fn run(a: NbdArgs) -> R {
    match a.cmd {
        NbdCmd::Serve(s) => serve(s),
    }
}

fn serve(a: ServeArgs) -> R {
    let spec = a.head.spec()?;
    let (ctrls, head) = spec.connect()?;
    let result = (|| -> R {
        wait_live(&head, LIVE_WAIT_DEFAULT)?;
        let info = DeviceInfo::probe(&head, a.max_transfer)?;
        let listen = match (&a.socket, a.listen) {
            (Some(p), _) => Listen::Unix(p.clone()),
            (None, Some(l)) => Listen::Tcp(l),
            (None, None) => return Err("--socket or --listen is required".into()),
        };
        let opts = ServeOptions {
            name: a.name.clone(),
            listen,
            clients_max: a.clients.max(1),
            context: ContextOptions::default(),
            read_only: a.read_only,
        };
        let server = NbdServer::start(Arc::clone(&head), info.clone(), opts)?;
        let stop = server.stop_flag();
        signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
        signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
        println!(
            "serving {} namespace {} ({} bytes, {} B blocks, {} path(s), iopolicy {}) as NBD export {:?} on {}",
            info.subnqn,
            info.nsid,
            info.size,
            info.block_size(),
            head.path_count(),
            spec.iopolicy,
            a.name,
            server.listen()
        );
        let stats = Arc::clone(&server.stats);
        server.wait();
        println!(
            "stopped: {} client(s), {} request(s), {} error(s), {} refused client(s), {} protocol error(s)",
            stats.clients_total.load(Ordering::Relaxed),
            stats.requests_total.load(Ordering::Relaxed),
            stats.errors_total.load(Ordering::Relaxed),
            stats.refused_clients_total.load(Ordering::Relaxed),
            stats.protocol_errors_total.load(Ordering::Relaxed),
        );
        Ok(())
    })();
    blockdev::spec::disconnect(&ctrls);
    result
}
