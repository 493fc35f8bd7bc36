//! The live status line fio prints while jobs run (eta.c `display_thread_status`):
//!
//! ```text
//! Jobs: 1 (f=1): [r(1)][40.0%][r=245MiB/s][r=490 IOPS][eta 00m:09s]
//! ```
//!
//! We print it to stderr, and only when stderr is a terminal (fio uses stdout).

use crate::report::num2str::{Unit, num2str};

/// fio `eta_to_str`: `00m:09s`, `01h:02m:03s`, `01d:02h:03m:04s`.
pub fn eta_to_str(eta_sec: u64) -> String {
    let s = eta_sec % 60;
    let m = (eta_sec / 60) % 60;
    let h = (eta_sec / 3600) % 24;
    let d = eta_sec / 86400;
    let mut out = String::new();
    if d > 0 {
        out.push_str(&format!("{d:02}d:"));
    }
    if h > 0 || d > 0 {
        out.push_str(&format!("{h:02}h:"));
    }
    out.push_str(&format!("{m:02}m:{s:02}s"));
    out
}

/// fio `update_condensed_str`: `rr_` becomes `r(2),_(1)`.
pub fn condense(run_str: &str) -> String {
    let mut out = String::new();
    let mut chars = run_str.chars().peekable();
    while let Some(c) = chars.next() {
        let mut n = 1;
        while chars.peek() == Some(&c) {
            chars.next();
            n += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&format!("{c}({n})"));
    }
    out
}

/// One status snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Threads doing I/O.
    pub running: usize,
    /// One letter per thread (fio's run_str, uncondensed).
    pub run_str: String,
    /// Fraction done, 0..=1, if known.
    pub done: Option<f64>,
    /// Read and write bandwidth over the last interval, KiB/s.
    pub rate_kib: [u64; 2],
    /// Read and write IOPS over the last interval.
    pub iops: [u64; 2],
    /// Seconds left, if known.
    pub eta_sec: Option<u64>,
}

/// Formats snapshots, padding each line to cover the previous one.
#[derive(Debug, Default)]
pub struct StatusLine {
    last_len: usize,
}

impl StatusLine {
    /// The text to print (ends with `\r`, no newline).
    pub fn render(&mut self, s: &Snapshot) -> String {
        let mut line = format!("Jobs: {} (f={})", s.running, s.running);
        if s.running > 0 {
            let perc = match s.done {
                Some(p) => format!("{:3.1}%", p * 100.0),
                None => "-.-%".to_string(),
            };
            line.push_str(&format!(": [{}][{perc}]", condense(&s.run_str)));
            let has: Vec<usize> = (0..2).filter(|&d| s.rate_kib[d] > 0 || s.iops[d] > 0).collect();
            if !has.is_empty() {
                let letters = ['r', 'w'];
                let rates: Vec<String> = has
                    .iter()
                    .map(|&d| format!("{}={}", letters[d], num2str(s.rate_kib[d], 4, 1024, true, Unit::BytePerSec)))
                    .collect();
                let iops: Vec<String> = has
                    .iter()
                    .map(|&d| format!("{}={}", letters[d], num2str(s.iops[d], 4, 1, false, Unit::None)))
                    .collect();
                line.push_str(&format!("[{}][{} IOPS]", rates.join(","), iops.join(",")));
            }
            let eta = s.eta_sec.map_or_else(|| "--".to_string(), eta_to_str);
            line.push_str(&format!("[eta {eta}]"));
        }
        let len = line.len();
        if len < self.last_len {
            line.push_str(&" ".repeat(self.last_len - len));
        }
        self.last_len = len;
        line.push('\r');
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_fio() {
        let mut st = StatusLine::default();
        let snap = Snapshot {
            running: 1,
            run_str: "r".into(),
            done: Some(0.4),
            rate_kib: [251_170, 0],
            iops: [490, 0],
            eta_sec: Some(9),
        };
        assert_eq!(st.render(&snap), "Jobs: 1 (f=1): [r(1)][40.0%][r=245MiB/s][r=490 IOPS][eta 00m:09s]\r");
        let short = Snapshot { running: 0, ..snap };
        let out = st.render(&short);
        assert!(out.starts_with("Jobs: 0 (f=0)   "), "{out:?}");
    }

    #[test]
    fn eta_and_condense() {
        assert_eq!(eta_to_str(9), "00m:09s");
        assert_eq!(eta_to_str(3723), "01h:02m:03s");
        assert_eq!(eta_to_str(90061), "01d:01h:01m:01s");
        assert_eq!(condense("rr_W"), "r(2),_(1),W(1)");
        assert_eq!(condense(""), "");
    }
}
