//! `qpath`: the command line. Subcommands parse arguments and call the
//! library crates; no logic lives here.

mod cmd_bench;
mod cmd_doc;
mod cmd_host;
#[cfg(feature = "lab")]
mod cmd_lab;
mod cmd_nbd;
mod cmd_resv;
mod cmd_rpc;
mod cmd_sim;
mod cmd_stats;
mod cmd_target;
mod cmd_tls;
mod cmd_ublk;
mod head_args;
mod sd_notify;
mod target_check;

use clap::{CommandFactory, Parser, Subcommand};

/// `qpath --version`: the crate version and the git commit it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("QPATH_GIT_COMMIT"), ")");

/// How to get logs, shown under `qpath --help`.
const AFTER_HELP: &str = "\
Logs go to stderr. RUST_LOG chooses what is logged (default: warn,qpath_target=info,qpath_blockdev=info):
  RUST_LOG=debug qpath target                 everything at debug level
  RUST_LOG=warn,qpath_host=debug qpath bench  one part at debug (qpath_target, qpath_host,
                                              qpath_blockdev, qpath_bench, nvme, uring, blk)

`qpath COMMAND --help` describes each command.";

/// qpath: a user-space, multi-queue, multipath NVMe/TCP stack (target, host, benchmark).
#[derive(Parser, Debug)]
#[command(name = "qpath", version = VERSION, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve NVMe/TCP subsystems (the embedded default when no --config is given).
    Target(cmd_target::TargetArgs),
    /// Call a running target's (or bench's) JSON-RPC control socket.
    Rpc(cmd_rpc::RpcArgs),
    /// Per-queue statistics of a running target or bench, from its RPC socket.
    Stats(cmd_stats::StatsArgs),
    /// Read a discovery controller's log (following referrals), like `nvme discover`.
    Discover(cmd_host::DiscoverArgs),
    /// Connect to a subsystem, print its controller and namespaces, disconnect.
    Connect(cmd_host::ConnectArgs),
    /// Discover, connect to every subsystem found and show controllers and paths.
    ListSubsys(cmd_host::ListSubsysArgs),
    /// Namespace reservations, as nvme-cli's resv-* (register, acquire, release, report).
    ///
    /// Also a one-block read or write, to see what a reservation leaves this host.
    Resv(cmd_resv::ResvArgs),
    /// Make a TLS pre-shared key in the PSK interchange format, like `nvme gen-tls-key`.
    GenTlsKey(cmd_tls::GenArgs),
    /// Check a TLS key (prints its hash and fingerprint, never the key), like `nvme check-tls-key`.
    CheckTlsKey(cmd_tls::CheckArgs),
    /// A namespace (one multipath head) as a Linux block device, /dev/ublkbN (add, del, list).
    Ublk(cmd_ublk::UblkArgs),
    /// Serve ublk devices for `qpath ublk add`, over a control socket; takes over the
    /// devices a previous `qpath host` left.
    Host(cmd_ublk::HostArgs),
    /// Export a namespace (one multipath head) over NBD: qemu-img, QEMU, the kernel's nbd.
    Nbd(cmd_nbd::NbdArgs),
    /// Run a fio job file (an embedded target when jobs have no filename).
    ///
    /// With the embedded target, the physical baseline of the machine and each job's
    /// ratio to it are reported too.
    Bench(bench::cmd::CmdArgs),
    /// Experiments against the stack's goals: path flaps, multipath, fairness, auth, seeds.
    ///
    /// Each lab prints a table, its goals and whether they were met, and writes a plot;
    /// `qpath lab baseline` measures the machine itself.
    #[cfg(feature = "lab")]
    Lab(cmd_lab::LabArgs),
    /// Replay failures from a seed: the real target and host code over a simulated network,
    /// disk and clock, with faults, checked against invariants.
    Sim(cmd_sim::SimArgs),
    /// Write the manual pages (qpath.1, qpath-target.1, ...) into a directory.
    #[command(hide = true)]
    Man(cmd_doc::ManArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(hide = true)]
    Completions(cmd_doc::CompletionsArgs),
}

fn main() {
    let cli = Cli::parse();
    // A simulation runs thousands of targets' lives a second: their logs only with RUST_LOG.
    let default_filter =
        if matches!(cli.command, Command::Sim(_)) { "off" } else { "warn,qpath_target=info,qpath_blockdev=info" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Target(a) => cmd_target::run(a),
        Command::Rpc(a) => cmd_rpc::run(a),
        Command::Stats(a) => cmd_stats::run(a),
        Command::Discover(a) => cmd_host::discover(a),
        Command::Connect(a) => cmd_host::connect(a),
        Command::ListSubsys(a) => cmd_host::list_subsys(a),
        Command::Resv(a) => cmd_resv::run(a),
        Command::GenTlsKey(a) => cmd_tls::generate(a),
        Command::CheckTlsKey(a) => cmd_tls::check(a),
        Command::Nbd(a) => cmd_nbd::run(a),
        Command::Ublk(a) => cmd_ublk::run(a),
        Command::Host(a) => cmd_ublk::host(a),
        Command::Bench(a) => cmd_bench::bench(&a),
        #[cfg(feature = "lab")]
        Command::Lab(a) => cmd_lab::run(&a),
        Command::Sim(a) => cmd_sim::run(&a),
        Command::Man(a) => cmd_doc::man(&a, Cli::command()),
        Command::Completions(a) => cmd_doc::completions(&a, Cli::command()),
    };
    if let Err(e) = result {
        eprintln!("qpath: {e}");
        std::process::exit(1);
    }
}

/// The socket of the packaged service (`qpath-target.service`, `RuntimeDirectory=qpath`).
pub const SERVICE_RPC_SOCKET: &str = "/run/qpath/qpath.sock";

/// The socket a client (`qpath rpc`, `qpath stats`) talks to when none is given: the
/// default a `qpath target` started by hand binds ([`default_rpc_socket`]) when it exists,
/// else the service's, when that exists; else the default (whose absence the error names).
pub fn client_rpc_socket() -> std::path::PathBuf {
    own_or_service_socket(default_rpc_socket(), "QPATH_RPC_SOCKET", SERVICE_RPC_SOCKET)
}

/// `own` (a default socket, or the one `env` names) when it exists or `env` is set; else
/// `service`'s when that exists; else `own`, whose absence the caller's error names.
pub fn own_or_service_socket(own: std::path::PathBuf, env: &str, service: &str) -> std::path::PathBuf {
    if std::env::var_os(env).is_none() && !own.exists() && std::path::Path::new(service).exists() {
        return service.into();
    }
    own
}

/// The default RPC socket path: `$QPATH_RPC_SOCKET`, else `$XDG_RUNTIME_DIR/qpath.sock`, else `/tmp/qpath.sock`.
pub fn default_rpc_socket() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("QPATH_RPC_SOCKET") {
        return p.into();
    }
    let dir = std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    dir.join("qpath.sock")
}
