//! `qpath sim`: runs the deterministic simulator (`qpath-sim`) for one seed or a range.

/// Arguments of `qpath sim`.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// The seed to run (the whole schedule of I/Os, faults and timings follows from it).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// A range of seeds to sweep, A..B (B excluded); stops at the first that breaks an invariant.
    #[arg(long, value_name = "A..B")]
    seeds: Option<String>,
    /// Scheduler steps with faults before the run heals, drains and reads every block back.
    #[arg(long, default_value_t = 20_000)]
    steps: u64,
    /// Print every event of the run (one seed).
    #[arg(long)]
    trace: bool,
    /// Send an I/O whose connection was lost to another path at once, without waiting
    /// until the old path can no longer execute it (shows the lost-write hazard that wait
    /// prevents).
    #[arg(long)]
    no_failover_quiesce: bool,
    /// Let a seed's namespace shrinks happen while writes to the blocks cut off are in
    /// flight (the target waits out those at the backend, or refuses the shrink, and
    /// refuses the others' writes past the new end; off, the simulated operator waits).
    #[arg(long)]
    shrink_under_writes: bool,
    /// The fault families to draw: all (default), none, a list of families (only those:
    /// reset,crash) or a list with a leading - each (all but those: -crash,-namespace). The
    /// families: reset, stall, crash, ana, slow-disk, bit-flip, reservation, resize, outage,
    /// controller, namespace, key-rotation
    #[arg(long, default_value = "all", value_parser = qpath_sim::Faults::parse, allow_hyphen_values = true)]
    faults: qpath_sim::Faults,
}

/// The command that replays `seed` as `a` ran it, with every event.
fn replay_command(seed: u64, a: &SimArgs) -> String {
    let quiesce = if a.no_failover_quiesce { " --no-failover-quiesce" } else { "" };
    let shrink = if a.shrink_under_writes { " --shrink-under-writes" } else { "" };
    let faults =
        if a.faults == qpath_sim::Faults::ALL { String::new() } else { format!(" --faults={}", a.faults.to_arg()) };
    format!("qpath sim --seed {seed} --steps {}{quiesce}{shrink}{faults} --trace", a.steps)
}

fn parse_range(s: &str) -> Result<std::ops::Range<u64>, String> {
    let (a, b) = s.split_once("..").ok_or_else(|| format!("--seeds {s:?}: expected A..B, e.g. 0..500"))?;
    let n = |x: &str| x.trim().parse::<u64>().map_err(|e| format!("--seeds {s:?}: {x:?} is not a seed: {e}"));
    let r = n(a)?..n(b)?;
    if r.is_empty() {
        return Err(format!("--seeds {s:?}: the range is empty"));
    }
    Ok(r)
}

pub fn run(a: &SimArgs) -> Result<(), Box<dyn std::error::Error>> {
    let seeds = match (&a.seeds, a.seed) {
        (Some(s), _) => parse_range(s)?,
        (None, Some(s)) => s..s + 1,
        (None, None) => return Err("give --seed N or --seeds A..B".into()),
    };
    if a.faults != qpath_sim::Faults::ALL {
        println!("fault families drawn: {}", a.faults.to_arg());
    }
    let started = std::time::Instant::now();
    let (mut ios, mut runs) = (0u64, 0u64);
    for seed in seeds {
        let r = qpath_sim::run(qpath_sim::Options {
            seed,
            steps: a.steps,
            trace: a.trace,
            failover_quiesce: !a.no_failover_quiesce,
            shrink_under_writes: a.shrink_under_writes,
            faults: a.faults,
        });
        for line in &r.trace {
            println!("{line}");
        }
        println!("{}", r.summary_line());
        ios += r.summary.ios;
        runs += 1;
        if let Some(v) = &r.violation {
            println!("seed {seed}: invariant broken at step {}: {}", v.step, v.what);
            println!("replay: {}", replay_command(seed, a));
            return Err(format!("seed {seed} broke an invariant").into());
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!("{runs} seeds passed: {ios} simulated I/Os in {secs:.2} s ({:.0} I/Os per second)", ios as f64 / secs);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        sim: SimArgs,
    }

    /// The replay line a broken seed prints runs that seed the way it broke.
    #[test]
    fn the_replay_command_carries_the_options_that_broke_the_seed() {
        let parse = |args: &[&str]| T::try_parse_from(std::iter::once("sim").chain(args.iter().copied())).unwrap().sim;
        let a = parse(&["--seeds", "0..500", "--steps", "5000", "--no-failover-quiesce", "--shrink-under-writes"]);
        assert_eq!(
            replay_command(18, &a),
            "qpath sim --seed 18 --steps 5000 --no-failover-quiesce --shrink-under-writes --trace"
        );
        let again = replay_command(18, &a);
        let words: Vec<&str> = again.split(' ').skip(2).collect();
        let b = parse(&words);
        assert_eq!(
            (b.seed, b.steps, b.no_failover_quiesce, b.shrink_under_writes, b.trace),
            (Some(18), 5000, true, true, true)
        );
        assert_eq!(replay_command(3, &parse(&[])), "qpath sim --seed 3 --steps 20000 --trace");
        // With fewer fault families the replay draws the same ones.
        let c = parse(&["--seeds", "0..9", "--faults", "-crash,-namespace"]);
        let again = replay_command(4, &c);
        assert!(again.contains("--faults="), "{again}");
        let words: Vec<&str> = again.split(' ').skip(2).collect();
        assert_eq!(parse(&words).faults, c.faults);
        assert!(T::try_parse_from(["sim", "--seed", "1", "--faults", "crahs"]).is_err());
    }
}
