//! The side-by-side table's arithmetic: the workloads, the four client → target columns,
//! each cell's median and spread over its rounds, and the acceptance checks (ratios against
//! SPDK's own pair, spread per cell) with their PASS/FAIL. Pure: nothing here runs I/O.

use std::fmt::Write as _;

/// What a workload's cells are compared by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Average latency of one I/O in µs: lower is better.
    LatencyUs,
    /// I/Os per second: higher is better.
    Iops,
    /// Bandwidth in MiB/s: higher is better.
    MibPerSec,
}

impl Metric {
    /// The unit as printed.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::LatencyUs => "us",
            Metric::Iops => "IOPS",
            Metric::MibPerSec => "MiB/s",
        }
    }

    /// Whether a smaller value is the better one.
    pub fn lower_is_better(self) -> bool {
        self == Metric::LatencyUs
    }
}

/// The access pattern, in fio's and spdk_nvme_perf's shared words (`rw=`, `-w`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential reads.
    Read,
}

impl Pattern {
    /// fio's `rw=` value, which is also spdk_nvme_perf's `-w` value.
    pub fn word(self) -> &'static str {
        match self {
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::Read => "read",
        }
    }

    /// Whether offsets are drawn at random (perf draws each with `rand_r`, keeping no map
    /// of the blocks done: bench runs these with fio's `norandommap`, which does the same).
    pub fn random(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::RandWrite)
    }
}

/// One row of the table: a workload both clients run the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// As printed.
    pub name: &'static str,
    /// Access pattern.
    pub pattern: Pattern,
    /// Bytes per I/O.
    pub bs: u32,
    /// I/Os kept outstanding.
    pub qd: u32,
    /// What the row reports.
    pub metric: Metric,
}

/// The five rows.
pub const WORKLOADS: [Workload; 5] = [
    Workload { name: "4k randread QD1", pattern: Pattern::RandRead, bs: 4096, qd: 1, metric: Metric::LatencyUs },
    Workload { name: "4k randread QD32", pattern: Pattern::RandRead, bs: 4096, qd: 32, metric: Metric::Iops },
    Workload { name: "4k randread QD128", pattern: Pattern::RandRead, bs: 4096, qd: 128, metric: Metric::Iops },
    Workload { name: "4k randwrite QD32", pattern: Pattern::RandWrite, bs: 4096, qd: 32, metric: Metric::Iops },
    Workload { name: "128k read QD16", pattern: Pattern::Read, bs: 128 << 10, qd: 16, metric: Metric::MibPerSec },
];

/// Which client drives the I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// SPDK's `spdk_nvme_perf`.
    Perf,
    /// `qpath bench`'s qpath engine (the qpath host).
    Bench,
}

/// Which target serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// SPDK's `nvmf_tgt`.
    Spdk,
    /// `qpath target`.
    Qpath,
}

/// One column: a client against a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// The client.
    pub client: Client,
    /// The target.
    pub target: TargetKind,
}

impl Column {
    /// SPDK's own pair, what every ratio is taken against.
    pub const PERF_SPDK: Column = Column { client: Client::Perf, target: TargetKind::Spdk };
    /// SPDK's client against the qpath target: the target alone.
    pub const PERF_QPATH: Column = Column { client: Client::Perf, target: TargetKind::Qpath };
    /// The qpath host against SPDK's target: the host alone.
    pub const BENCH_SPDK: Column = Column { client: Client::Bench, target: TargetKind::Spdk };
    /// The qpath host against the qpath target: the full stack.
    pub const BENCH_QPATH: Column = Column { client: Client::Bench, target: TargetKind::Qpath };
    /// In the order.
    pub const ALL: [Column; 4] = [Column::PERF_SPDK, Column::PERF_QPATH, Column::BENCH_SPDK, Column::BENCH_QPATH];

    /// The header, e.g. `perf → SPDK tgt`.
    pub fn name(self) -> &'static str {
        match (self.client, self.target) {
            (Client::Perf, TargetKind::Spdk) => "SPDK perf → SPDK tgt",
            (Client::Perf, TargetKind::Qpath) => "perf → qpath tgt",
            (Client::Bench, TargetKind::Spdk) => "qpath bench → SPDK tgt",
            (Client::Bench, TargetKind::Qpath) => "qpath bench → qpath tgt",
        }
    }

    /// A short key for JSON.
    pub fn key(self) -> &'static str {
        match (self.client, self.target) {
            (Client::Perf, TargetKind::Spdk) => "perf_spdk",
            (Client::Perf, TargetKind::Qpath) => "perf_qpath",
            (Client::Bench, TargetKind::Spdk) => "bench_spdk",
            (Client::Bench, TargetKind::Qpath) => "bench_qpath",
        }
    }
}

/// What one client run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measure {
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_s: f64,
    /// Average latency per I/O, µs.
    pub lat_us: f64,
}

impl Measure {
    /// The number `metric` compares.
    pub fn value(&self, metric: Metric) -> f64 {
        match metric {
            Metric::LatencyUs => self.lat_us,
            Metric::Iops => self.iops,
            Metric::MibPerSec => self.mib_s,
        }
    }
}

/// One run of one workload in one column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Index into [`WORKLOADS`].
    pub workload: usize,
    /// The column.
    pub column: Column,
    /// The round (0-based).
    pub round: u32,
    /// What it measured.
    pub measure: Measure,
}

/// The largest max/min of a cell's rounds that the acceptance allows.
pub const SPREAD_MAX: f64 = 1.15;

/// One cell: the rounds of one workload in one column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CellStats {
    /// The median of its rounds (mean of the middle two for an even count).
    pub median: f64,
    /// The smallest round.
    pub min: f64,
    /// The largest round.
    pub max: f64,
    /// Rounds that measured a finite value.
    pub rounds: usize,
}

impl CellStats {
    /// The statistics of `values` (non-finite values are left out); `None` when none is left.
    pub fn of(values: &[f64]) -> Option<CellStats> {
        let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        let median = crate::median(v.clone())?;
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(CellStats { median, min, max, rounds: v.len() })
    }

    /// max / min: 1.0 for identical rounds; NaN when the smallest is not positive.
    pub fn spread(&self) -> f64 {
        if self.min > 0.0 { self.max / self.min } else { f64::NAN }
    }

    /// Whether the spread is within [`SPREAD_MAX`] (a NaN spread is not).
    pub fn spread_ok(&self) -> bool {
        self.spread() <= SPREAD_MAX
    }
}

/// The statistics of every cell that has samples: `[workload][column in Column::ALL order]`.
pub fn cells(samples: &[Sample]) -> Vec<[Option<CellStats>; 4]> {
    WORKLOADS
        .iter()
        .enumerate()
        .map(|(w, wl)| {
            Column::ALL.map(|c| {
                let v: Vec<f64> = samples
                    .iter()
                    .filter(|s| s.workload == w && s.column == c)
                    .map(|s| s.measure.value(wl.metric))
                    .collect();
                CellStats::of(&v)
            })
        })
        .collect()
}

fn column_index(c: Column) -> usize {
    Column::ALL.iter().position(|x| *x == c).expect("every column is in Column::ALL")
}

/// Which comparison an acceptance check makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// qpath bench → qpath target against perf → SPDK target.
    FullStack,
    /// perf → qpath target against perf → SPDK target.
    TargetAlone,
    /// qpath bench → SPDK target against perf → SPDK target.
    HostAlone,
}

impl Scope {
    /// In the order the checks are printed.
    pub const ALL: [Scope; 3] = [Scope::FullStack, Scope::TargetAlone, Scope::HostAlone];

    /// As printed.
    pub fn name(self) -> &'static str {
        match self {
            Scope::FullStack => "full stack",
            Scope::TargetAlone => "target alone",
            Scope::HostAlone => "host alone",
        }
    }

    /// The column compared with SPDK's own pair.
    pub fn column(self) -> Column {
        match self {
            Scope::FullStack => Column::BENCH_QPATH,
            Scope::TargetAlone => Column::PERF_QPATH,
            Scope::HostAlone => Column::BENCH_SPDK,
        }
    }

    /// The bound on `column / perf → SPDK` for `metric`: an upper bound for latency, a
    /// lower one otherwise. The acceptance: the full stack at most 0.75× SPDK's
    /// QD1 latency and at least 1.2× its IOPS and bandwidth; each half at least level.
    pub fn bound(self, metric: Metric) -> f64 {
        match (self, metric.lower_is_better()) {
            (Scope::FullStack, true) => 0.75,
            (Scope::FullStack, false) => 1.2,
            (_, _) => 1.0,
        }
    }
}

/// One acceptance check's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// Index into [`WORKLOADS`].
    pub workload: usize,
    /// What is checked.
    pub kind: CheckKind,
    /// The measured ratio (NaN when a side was not measured).
    pub ratio: f64,
    /// The bound it is held to.
    pub bound: f64,
    /// Whether the bound is an upper one.
    pub at_most: bool,
}

/// What a [`Check`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckKind {
    /// A column's median against perf → SPDK's.
    Ratio(Scope),
    /// One cell's max/min over its rounds.
    Spread(Column),
}

impl Check {
    /// Whether it passed: false when the ratio could not be measured.
    pub fn pass(&self) -> bool {
        if self.at_most { self.ratio <= self.bound } else { self.ratio >= self.bound }
    }

    /// `PASS` or `FAIL`.
    pub fn verdict(&self) -> &'static str {
        if self.pass() { "PASS" } else { "FAIL" }
    }

    /// What is compared, as printed.
    pub fn what(&self) -> String {
        let w = WORKLOADS[self.workload];
        match self.kind {
            CheckKind::Ratio(s) => {
                format!(
                    "{}: {} ({} / {}, {})",
                    w.name,
                    s.name(),
                    s.column().name(),
                    Column::PERF_SPDK.name(),
                    w.metric.unit()
                )
            }
            CheckKind::Spread(c) => format!("{}: spread of {} (max / min)", w.name, c.name()),
        }
    }
}

/// Every acceptance check the cells allow: the three ratios per workload when SPDK's pair
/// and the compared column were measured, and the spread of every measured cell.
pub fn checks(cells: &[[Option<CellStats>; 4]]) -> Vec<Check> {
    let mut out = Vec::new();
    for (w, row) in cells.iter().enumerate() {
        let metric = WORKLOADS[w].metric;
        let base = row[column_index(Column::PERF_SPDK)];
        for scope in Scope::ALL {
            let (Some(b), Some(v)) = (base, row[column_index(scope.column())]) else { continue };
            let ratio = if b.median > 0.0 { v.median / b.median } else { f64::NAN };
            out.push(Check {
                workload: w,
                kind: CheckKind::Ratio(scope),
                ratio,
                bound: scope.bound(metric),
                at_most: metric.lower_is_better(),
            });
        }
        // One round has no spread to judge.
        for (c, cell) in Column::ALL.iter().zip(row) {
            if let Some(s) = cell.filter(|s| s.rounds >= 2) {
                out.push(Check {
                    workload: w,
                    kind: CheckKind::Spread(*c),
                    ratio: s.spread(),
                    bound: SPREAD_MAX,
                    at_most: true,
                });
            }
        }
    }
    out
}

/// A number as the table prints it: whole for large values, two decimals below 100.
pub fn format_value(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The text table: one row per workload, per column the median and (max/min spread).
pub fn text_table(cells: &[[Option<CellStats>; 4]]) -> String {
    let mut header = vec!["workload".to_string(), "unit".to_string()];
    header.extend(Column::ALL.iter().map(|c| c.name().to_string()));
    let mut rows = vec![header];
    for (w, row) in cells.iter().enumerate() {
        let wl = WORKLOADS[w];
        let mut r = vec![wl.name.to_string(), wl.metric.unit().to_string()];
        for cell in row {
            r.push(match cell {
                Some(s) if s.rounds < 2 => format!("{} (1 round)", format_value(s.median)),
                Some(s) => format!("{} (×{:.2})", format_value(s.median), s.spread()),
                None => "not run".into(),
            });
        }
        rows.push(r);
    }
    let cols = rows[0].len();
    let width: Vec<usize> = (0..cols).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut s = String::new();
    for (n, r) in rows.iter().enumerate() {
        for (i, c) in r.iter().enumerate() {
            let pad = " ".repeat(width[i] - c.chars().count());
            if i < 2 {
                let _ = write!(s, "{c}{pad}  ");
            } else {
                let _ = write!(s, "{pad}{c}  ");
            }
        }
        let trimmed = s.trim_end().len();
        s.truncate(trimmed);
        s.push('\n');
        if n == 0 {
            let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
            s.push_str(&rule.join("  "));
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(v: f64) -> Measure {
        Measure { iops: v, mib_s: v / 256.0, lat_us: v }
    }

    fn sample(workload: usize, column: Column, round: u32, v: f64) -> Sample {
        Sample { workload, column, round, measure: m(v) }
    }

    #[test]
    fn median_min_max_and_spread_of_a_cell() {
        let s = CellStats::of(&[110.0, 100.0, 105.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.rounds), (105.0, 100.0, 110.0, 3));
        assert!((s.spread() - 1.1).abs() < 1e-12);
        assert!(s.spread_ok());
        let even = CellStats::of(&[1.0, 4.0, 2.0, 3.0]).unwrap();
        assert_eq!(even.median, 2.5);
        assert_eq!(even.spread(), 4.0);
        assert!(!even.spread_ok());
        // A round that measured nothing is left out; a cell with no round has no stats.
        assert_eq!(CellStats::of(&[f64::NAN, 7.0]).unwrap().rounds, 1);
        assert!(CellStats::of(&[f64::NAN]).is_none());
        assert!(CellStats::of(&[]).is_none());
        // Zero as the smallest round: no spread to speak of, and it does not pass.
        let z = CellStats::of(&[0.0, 5.0]).unwrap();
        assert!(z.spread().is_nan() && !z.spread_ok());
    }

    #[test]
    fn cells_take_the_metric_of_their_workload() {
        // Workload 4 reports MiB/s: 2560 IOPS of 128k are 10 MiB/s in `m`.
        let samples = [
            sample(4, Column::PERF_SPDK, 0, 2560.0),
            sample(4, Column::PERF_SPDK, 1, 5120.0),
            sample(4, Column::PERF_SPDK, 2, 2560.0),
            sample(0, Column::BENCH_QPATH, 0, 30.0),
        ];
        let c = cells(&samples);
        assert_eq!(c.len(), WORKLOADS.len());
        let s = c[4][0].unwrap();
        assert_eq!((s.median, s.min, s.max), (10.0, 10.0, 20.0));
        assert_eq!(c[0][3].unwrap().median, 30.0);
        assert!(c[0][0].is_none() && c[4][3].is_none(), "cells without samples are empty");
    }

    fn full_row(perf_spdk: f64, perf_qpath: f64, bench_spdk: f64, bench_qpath: f64) -> [Option<CellStats>; 4] {
        [perf_spdk, perf_qpath, bench_spdk, bench_qpath].map(|v| CellStats::of(&[v, v]))
    }

    fn ratio_check(all: &[Check], w: usize, s: Scope) -> &Check {
        all.iter().find(|c| c.workload == w && c.kind == CheckKind::Ratio(s)).unwrap()
    }

    #[test]
    fn latency_ratios_are_upper_bounds_and_throughput_ratios_lower_ones() {
        let mut rows = vec![[None; 4]; WORKLOADS.len()];
        // QD1 latency: qpath 30 us against SPDK's 40: 0.75 exactly passes the full stack.
        rows[0] = full_row(40.0, 41.0, 39.0, 30.0);
        // QD32 IOPS: the full stack at 1.19× fails, the target at 1.0× passes, the host below fails.
        rows[1] = full_row(100_000.0, 100_000.0, 99_000.0, 119_000.0);
        let all = checks(&rows);
        let c = ratio_check(&all, 0, Scope::FullStack);
        assert!(c.at_most && c.bound == 0.75 && (c.ratio - 0.75).abs() < 1e-12 && c.pass());
        let c = ratio_check(&all, 0, Scope::TargetAlone);
        assert!(c.at_most && c.bound == 1.0 && !c.pass(), "41 us is slower than 40: {c:?}");
        assert!(ratio_check(&all, 0, Scope::HostAlone).pass());
        let c = ratio_check(&all, 1, Scope::FullStack);
        assert!(!c.at_most && c.bound == 1.2 && !c.pass() && c.verdict() == "FAIL");
        let c = ratio_check(&all, 1, Scope::TargetAlone);
        assert!(c.pass() && c.verdict() == "PASS");
        assert!(!ratio_check(&all, 1, Scope::HostAlone).pass());
        // Two measured rows: 3 ratios + 4 spreads each; the other rows have nothing to check.
        assert_eq!(all.len(), 14);
        assert!(all.iter().all(|c| c.workload < 2));
    }

    #[test]
    fn without_spdk_only_spreads_are_checked() {
        let mut rows = vec![[None; 4]; WORKLOADS.len()];
        rows[2][3] = CellStats::of(&[100.0, 120.0]);
        // A cell of one round has no spread to check.
        rows[3][3] = CellStats::of(&[100.0]);
        let all = checks(&rows);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].kind, CheckKind::Spread(Column::BENCH_QPATH));
        assert!((all[0].ratio - 1.2).abs() < 1e-12);
        assert!(!all[0].pass(), "1.2 > 1.15");
    }

    #[test]
    fn an_unmeasured_baseline_fails_rather_than_passes() {
        let mut rows = vec![[None; 4]; WORKLOADS.len()];
        rows[1] = full_row(0.0, 10.0, 10.0, 10.0);
        let all = checks(&rows);
        let c = ratio_check(&all, 1, Scope::FullStack);
        assert!(c.ratio.is_nan() && !c.pass());
    }

    #[test]
    fn the_text_table_shows_medians_spreads_and_missing_cells() {
        let mut rows = vec![[None; 4]; WORKLOADS.len()];
        rows[1][3] = CellStats::of(&[800_000.0, 820_000.0, 810_000.0]);
        rows[0][3] = CellStats::of(&[31.5, 30.0, 33.0]);
        let t = text_table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("workload") && lines[0].contains("qpath bench → qpath tgt"), "{t}");
        assert!(lines[2].contains("31.50 (×1.10)"), "{t}");
        assert!(lines[3].contains("810000 (×1.02)") && lines[3].contains("not run"), "{t}");
        rows[4][3] = CellStats::of(&[300.0]);
        assert!(text_table(&rows).lines().nth(6).unwrap().ends_with("300 (1 round)"));
        assert_eq!(lines.len(), 2 + WORKLOADS.len());
    }
}
