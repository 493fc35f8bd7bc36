//! The labs of `qpath lab`: experiments that reproduce a problem (a "seed": a
//! mailing-list thread or bug report with its numbers) or stress one mechanism, each run
//! against an embedded target in this process with the stack below, in one command,
//! printing a table, an SVG plot and JSON that carries each goal's ratio.
//!
//! ```text
//!  qpath lab NAME ──► lab module: cases ──► bench (job files, engines, reports)  ─┐
//!                         │                 host (contexts, heads, queue pairs)   ├─► embedded
//!                         │                 blk (shared tag sets)                 │   target
//!                         │                 target (ports, faults, ANA, budgets) ─┘   (loopback)
//!                         └──► result::LabResult ──► text table / SVG / JSON with goals
//! ```
//!
//! | lab | what it measures |
//! | --- | --- |
//! | [`seed_000`], [`mpath_delay`] | path selection: the policies against seed 000's reference selectors; one path delayed |
//! | [`seed_001`] | the block path against a user-owned queue pair |
//! | [`seed_002`] | 1, 2 and 4 subsystems of 2 paths each (tiobench) |
//! | [`seed_003`] | a WAL next to random-read hogs on one shared tag set, per tag policy |
//! | [`seed_004`] | 1 queue, N queues on one context, N contexts |
//! | [`fairness`], [`auth_stall`], [`auth_flood`] | a QD1 queue next to a flood, a DH-HMAC-CHAP step, a Negotiate flood |
//! | [`flaps`] | path flaps (link, port faults, ANA, Linux nvmet) that lose no write |
//! | [`spdk`] | side by side with SPDK: perf and qpath bench against nvmf_tgt and qpath target |
//! | [`baseline()`] | the machine's raw loopback TCP ping-pong and stream |
//!
//! The labs are the only users of the stack's baselines, which production builds
//! leave out: seed 000's reference path selectors and seed 003's tag-then-budget order
//! in `host`, the unfair shared tag policies in `blk` (their `lab-baselines` cargo
//! features), and the target's per-command port faults (its `fault-injection`
//! feature); this crate turns them on (`docs/design.md`, "Lab baselines").
//!
//! A lab's result, built and checked the way every lab builds its own:
//!
//! ```
//! use qpath_lab::result::{Cell, Goal, LabResult};
//!
//! let mut r = LabResult::new("seed-demo", "one queue against two");
//! r.columns(&["case", "IOPS"]);
//! r.row(vec![Cell::text("1 queue"), Cell::num(100_000.0, "IOPS")]);
//! r.row(vec![Cell::text("2 queues"), Cell::num(125_000.0, "IOPS")]);
//! r.goal(Goal::at_least("2 queues / 1 queue", 125_000.0, 100_000.0, 1.2));
//! assert!(r.all_goals_met());
//! ```
//!
//! Errors are the bench's ([`bench::Error`]): a lab fails where the jobs, engines or
//! embedded target it runs fail, and adds its own context with the same kinds.

#![forbid(unsafe_code)]

pub mod auth_flood;
pub mod auth_stall;
pub mod fairness;
pub mod flaps;
pub mod mpath_delay;
pub mod result;
pub mod seed_000;
pub mod seed_001;
pub mod seed_002;
pub mod seed_003;
pub mod seed_004;
pub mod spdk;

use std::io::Write;
use std::time::Duration;

use target::reactor::PollMode;

use bench::baseline::{self, BaselineOptions, Physical, Placement, WaitMode};
use bench::{Error, Result};

pub(crate) use bench::cmd::{default_cpus, parse_poll, pin_hook, place_jobs, seconds_up_to};

fn parse_wait(s: &str) -> std::result::Result<WaitMode, String> {
    match s {
        "busy" => Ok(WaitMode::Busy),
        "block" => Ok(WaitMode::Block),
        _ => Err(format!("{s:?}: busy or block")),
    }
}

fn parse_seconds(s: &str) -> std::result::Result<f64, String> {
    seconds_up_to::<86_400>(s)
}

/// The median of the finite values of `v` (the mean of the middle two for an even
/// count); `None` when there is none.
pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[m]),
        _ => Some(f64::midpoint(v[m - 1], v[m])),
    }
}

/// The embedded target's default reduced to one loopback port (ephemeral) and one
/// reactor on `reactor_cpu`, polling as `poll`: the target of the labs that put every
/// queue they measure on one reactor (fairness, seed-003, auth-stall, auth-flood).
pub(crate) fn one_reactor_target(reactor_cpu: Option<usize>, poll: PollMode) -> target::config::Config {
    let mut cfg = target::config::Config::embedded_default();
    cfg.ports.truncate(1);
    cfg.ports[0].addr = "127.0.0.1:0".into();
    cfg.reactor =
        target::reactor::ReactorOptions { reactors: 1, cpus: reactor_cpu.into_iter().collect(), poll, spin_us: 0 };
    cfg
}

/// Arguments of `qpath lab baseline`.
#[derive(Debug, Clone, clap::Args)]
pub struct LabBaselineArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// CPU of the server side (where a target reactor would run); default 0 on a multi-CPU machine.
    #[arg(long = "server-cpu")]
    pub server_cpu: Option<usize>,
    /// CPU of the client side (where a job would run); default 1 on a multi-CPU machine.
    #[arg(long = "client-cpu")]
    pub client_cpu: Option<usize>,
    /// How the server waits: busy or block.
    #[arg(long = "server-wait", default_value = "busy", value_parser = parse_wait)]
    pub server_wait: WaitMode,
    /// How the client waits: busy or block.
    #[arg(long = "client-wait", default_value = "busy", value_parser = parse_wait)]
    pub client_wait: WaitMode,
    /// Seconds each measurement runs.
    #[arg(long, default_value = "1", value_parser = parse_seconds)]
    pub seconds: f64,
}

/// Measure and print the physical baseline (`qpath lab baseline`).
pub fn baseline(args: &LabBaselineArgs, out: &mut dyn Write) -> Result<Physical> {
    let (server, client) = default_cpus(uring::online_cpus());
    let placement = Placement {
        server_cpu: args.server_cpu.or(server),
        client_cpu: args.client_cpu.or(client.first().copied()),
        server_wait: args.server_wait,
        client_wait: args.client_wait,
    };
    let time = Duration::from_secs_f64(args.seconds);
    let opts = BaselineOptions { placement, ping_pong_time: time, stream_time: time, ..BaselineOptions::default() };
    let p = baseline::measure(&opts)?;
    let text = if args.json {
        let mut s = String::new();
        bench::report::json::physical_json(&p).print(&mut s, 0);
        s.push('\n');
        s
    } else {
        bench::report::text::physical_text(&p)
    };
    out.write_all(text.as_bytes()).map_err(|e| Error::io("write baseline", e))?;
    Ok(p)
}
