//! `qpath resv`: nvme-cli's `resv-register`, `resv-acquire`, `resv-release` and
//! `resv-report` for a user-space host, plus a one-block read or write that shows what
//! the reservation leaves this host. Each call connects (a user queue pair, outside the
//! block core), sends one command, prints its status and disconnects; the exit status
//! is non-zero when the command failed, so scripts can test for a Reservation Conflict.

use std::time::Duration;

use host::controller::{ConnectOptions, Controller};
use host::passthru::QueuePair;
use host::queue::DataDir;
use host::reservation::{self, ReservationStatus};
use nvme::nqn::hex;
use nvme::opcode::io;
use nvme::{Cid, Nsid, SglDescriptor, Sqe, Status};
use uring::IoBuf;

use crate::cmd_host::Transport;

/// How long one command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// The report's size (nvme-cli asks for 4 KiB too): a 64-byte header and 63 registrants.
const REPORT_BYTES: u32 = 4096;

fn parse_key(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?}: {e}"))
}

/// `qpath resv`.
#[derive(clap::Args, Debug)]
pub struct ResvArgs {
    #[command(flatten)]
    transport: Transport,
    /// Subsystem NQN.
    #[arg(short = 'n', long)]
    nqn: String,
    /// Namespace ID.
    #[arg(long = "namespace-id", default_value_t = 1)]
    nsid: u32,
    /// Print JSON (the report, or the command's status).
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Reservation Register: register a key (rrega 0), unregister (1) or replace it (2).
    Register {
        /// Current reservation key.
        #[arg(short = 'c', long, default_value = "0", value_parser = parse_key)]
        crkey: u64,
        /// New reservation key.
        #[arg(short = 'k', long, default_value = "0", value_parser = parse_key)]
        nrkey: u64,
        /// Action: 0 register, 1 unregister, 2 replace.
        #[arg(short = 'r', long, default_value_t = 0)]
        rrega: u8,
        /// Ignore the current key (unregister, replace).
        #[arg(short = 'i', long)]
        iekey: bool,
        /// Persist through power loss: 0 no change, 2 off, 3 on (a namespace with a ptpl_file).
        #[arg(short = 'p', long, default_value_t = 0)]
        cptpl: u8,
    },
    /// Reservation Acquire: acquire (racqa 0), preempt (1), preempt and abort (2).
    Acquire {
        /// Current reservation key.
        #[arg(short = 'c', long, default_value = "0", value_parser = parse_key)]
        crkey: u64,
        /// Key to preempt.
        #[arg(short = 'p', long, default_value = "0", value_parser = parse_key)]
        prkey: u64,
        /// Type: 1 write exclusive, 2 exclusive access, 3/4 the same for registrants only,
        /// 5/6 for all registrants.
        #[arg(short = 't', long)]
        rtype: u8,
        /// Action: 0 acquire, 1 preempt, 2 preempt and abort.
        #[arg(short = 'a', long, default_value_t = 0)]
        racqa: u8,
    },
    /// Reservation Release: release (rrela 0) or clear every registration (1).
    Release {
        /// Current reservation key.
        #[arg(short = 'c', long, default_value = "0", value_parser = parse_key)]
        crkey: u64,
        /// Type of the reservation released.
        #[arg(short = 't', long, default_value_t = 0)]
        rtype: u8,
        /// Action: 0 release, 1 clear.
        #[arg(short = 'a', long, default_value_t = 0)]
        rrela: u8,
    },
    /// Reservation Report (extended: 128-bit Host Identifiers).
    Report,
    /// Read one block: whether the reservation lets this host read.
    Read {
        /// Block address.
        #[arg(long, default_value_t = 0)]
        slba: u64,
    },
    /// Write one block of zeros: whether the reservation lets this host write.
    Write {
        /// Block address.
        #[arg(long, default_value_t = 0)]
        slba: u64,
    },
}

type R = Result<(), Box<dyn std::error::Error>>;

/// The controller and its user queue pair, disconnected when dropped.
struct Queue {
    ctrl: std::sync::Arc<Controller>,
    qp: Option<QueuePair>,
}

impl Queue {
    fn run(&mut self, sqe: Sqe, buf: IoBuf, len: u32, dir: DataDir) -> Result<(Status, Option<IoBuf>), String> {
        let qp = self.qp.as_mut().ok_or("no queue pair")?;
        let done = qp.execute(sqe, Some(buf), len, dir, COMMAND_TIMEOUT).map_err(|e| e.to_string())?;
        Ok((done.cqe.status, done.buf))
    }

    fn command(&mut self, c: reservation::Command) -> Result<(Status, Option<IoBuf>), String> {
        self.run(c.sqe, c.data, c.len, c.dir)
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        drop(self.qp.take());
        self.ctrl.delete();
    }
}

pub fn run(a: ResvArgs) -> R {
    let addr = a.transport.addr(nvme::tcp::IO_PORT)?;
    let (hostnqn, hostid) = a.transport.identity();
    let mut o = ConnectOptions::new(addr, &a.nqn);
    o.hostnqn = hostnqn;
    o.hostid = hostid;
    o.nr_io_queues = 1;
    o.nr_user_queues = 1;
    o.ctrl_loss_tmo = Some(Duration::ZERO);
    let ctrl = Controller::connect(o)?;
    let nsid = Nsid(a.nsid);
    let block_size = ctrl.namespaces().iter().find(|n| n.nsid == nsid).map(|n| n.block_size());
    let qp = QueuePair::new(&ctrl)?;
    let mut q = Queue { ctrl, qp: Some(qp) };
    let (name, status, data) = match a.action {
        Action::Register { crkey, nrkey, rrega, iekey, cptpl } => {
            let (s, _) = q.command(reservation::register(nsid, rrega, crkey, nrkey, iekey).cptpl(cptpl))?;
            ("resv-register", s, None)
        }
        Action::Acquire { crkey, prkey, rtype, racqa } => {
            let (s, _) = q.command(reservation::acquire(nsid, racqa, rtype, crkey, prkey))?;
            ("resv-acquire", s, None)
        }
        Action::Release { crkey, rtype, rrela } => {
            let (s, _) = q.command(reservation::release(nsid, rrela, rtype, crkey))?;
            ("resv-release", s, None)
        }
        Action::Report => {
            let (s, buf) = q.command(reservation::report(nsid, REPORT_BYTES))?;
            ("resv-report", s, buf)
        }
        Action::Read { slba } | Action::Write { slba } => {
            let write = matches!(a.action, Action::Write { .. });
            let bs = block_size.ok_or_else(|| format!("namespace {} not found", a.nsid))?;
            let opcode = if write { io::WRITE } else { io::READ };
            let s = Sqe::rw(opcode, Cid(0), nsid, slba, 0, SglDescriptor::transport(bs));
            let mut b = IoBuf::new(usize::try_from(bs)?.next_multiple_of(4096));
            b.set_len(usize::try_from(bs)?);
            b.fill(0);
            let dir = if write { DataDir::ToController } else { DataDir::FromController };
            let (st, _) = q.run(s, b, bs, dir)?;
            (if write { "write" } else { "read" }, st, None)
        }
    };
    drop(q);
    if let (true, Some(buf)) = (status.is_success(), data) {
        print_report(&buf, a.json);
    } else if a.json {
        println!(
            "{}",
            serde_json::json!({ "command": name, "status": status.to_string(), "success": status.is_success() })
        );
    } else {
        println!("{name}: {status}");
    }
    if status.is_success() { Ok(()) } else { Err(format!("{name}: {status}").into()) }
}

fn print_report(b: &[u8], json: bool) {
    let Some(r) = ReservationStatus::parse(b) else {
        println!("resv-report: {} bytes, shorter than the report's header", b.len());
        return;
    };
    if json {
        let regctlext: Vec<serde_json::Value> = r
            .registrants
            .iter()
            .map(|e| {
                serde_json::json!({
                    "cntlid": e.cntlid, "rcsts": u8::from(e.holds), "rkey": e.rkey, "hostid": hex(&e.hostid),
                })
            })
            .collect();
        let v = serde_json::json!({
            "gen": r.generation, "rtype": r.rtype, "regctl": r.regctl, "ptpls": u8::from(r.ptpls),
            "regctlext": regctlext,
        });
        println!("{v}");
        return;
    }
    println!("NVMe Reservation status:\n");
    println!("gen       : {}", r.generation);
    println!("rtype     : {}", r.rtype);
    println!("regctl    : {}", r.regctl);
    println!("ptpls     : {}", u8::from(r.ptpls));
    for (i, e) in r.registrants.iter().enumerate() {
        println!("regctlext[{i}] :");
        println!("  cntlid     : {:x}", e.cntlid);
        println!("  rcsts      : {:x}", u8::from(e.holds));
        println!("  rkey       : {:#x}", e.rkey);
        println!("  hostid     : {}", hex(&e.hostid));
    }
}
