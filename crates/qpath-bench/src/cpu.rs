//! Per-thread CPU usage from `/proc/thread-self` (fio uses `getrusage(RUSAGE_THREAD)`;
//! reading procfs keeps this crate free of `unsafe`).
//!
//! `utime`/`stime` in `/proc/*/stat` are in USER_HZ ticks, which Linux fixes at 100
//! for userspace on every architecture, so CPU times have 10 ms resolution.

use std::time::Duration;

/// CPU usage counters of the calling thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThreadUsage {
    /// Kernel thread id.
    pub tid: u32,
    /// User CPU time.
    pub user: Duration,
    /// System CPU time.
    pub system: Duration,
    /// Voluntary + involuntary context switches.
    pub ctx: u64,
    /// Minor page faults.
    pub minflt: u64,
    /// Major page faults.
    pub majflt: u64,
}

/// A hook returning the calling thread's usage, `None` if unknown.
pub type UsageFn = fn() -> Option<ThreadUsage>;

const USER_HZ: u64 = 100;

/// Read the calling thread's usage from `/proc/thread-self/{stat,status}`.
pub fn proc_thread_usage() -> Option<ThreadUsage> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    parse(&stat, &status)
}

fn parse(stat: &str, status: &str) -> Option<ThreadUsage> {
    let tid = stat.split_whitespace().next()?.parse().ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); field k (1-based, proc(5)) is fields[k - 3].
    let field = |k: usize| -> Option<u64> { fields.get(k - 3)?.parse().ok() };
    let ticks = |t: u64| Duration::from_millis(t * (1000 / USER_HZ));
    let mut ctx = 0;
    for line in status.lines() {
        if let Some(v) =
            line.strip_prefix("voluntary_ctxt_switches:").or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
        {
            ctx += v.trim().parse::<u64>().unwrap_or(0);
        }
    }
    Some(ThreadUsage {
        tid,
        user: ticks(field(14)?),
        system: ticks(field(15)?),
        ctx,
        minflt: field(10)?,
        majflt: field(12)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_with_odd_comm() {
        let stat = "1234 (we (ird) n) R 1 2 3 4 5 6 77 8 99 10 250 30 0 0 20 0 1 0";
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t5\nnonvoluntary_ctxt_switches:\t2\n";
        let u = parse(stat, status).unwrap();
        assert_eq!(u.tid, 1234);
        assert_eq!(u.minflt, 77);
        assert_eq!(u.majflt, 99);
        assert_eq!(u.user, Duration::from_millis(2500));
        assert_eq!(u.system, Duration::from_millis(300));
        assert_eq!(u.ctx, 7);
    }

    #[test]
    fn reads_this_thread() {
        let u = proc_thread_usage().expect("procfs is available on Linux");
        assert!(u.tid > 0);
    }
}
