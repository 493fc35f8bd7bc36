//! The labs (`qpath lab ...`): experiments that run jobs or connections against an
//! embedded target and print a table and JSON with their goals. Each lab is one module;
//! [`baseline`] measures the machine's physical baseline.

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

use std::io::Write;
use std::time::Duration;

use target::reactor::PollMode;

use crate::baseline::{self, BaselineOptions, Physical, Placement, WaitMode};
use crate::cmd::{default_cpus, seconds_up_to};
use crate::error::{Error, Result};

pub(crate) use crate::cmd::{parse_poll, pin_hook, place_jobs};
pub(crate) use crate::embedded_target as embedded;

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
        crate::report::json::physical_json(&p).print(&mut s, 0);
        s.push('\n');
        s
    } else {
        crate::report::text::physical_text(&p)
    };
    out.write_all(text.as_bytes()).map_err(|e| Error::io("write baseline", e))?;
    Ok(p)
}
