//! The shape every `qpath lab seed-NNN` result takes: a table printed as text, a plot
//! written as SVG, and JSON carrying each goal's ratio, so a seed's experiment reads the
//! same way whichever seed it is.
//!
//! ```
//! use qpath_lab::result::{Cell, Goal, LabResult};
//!
//! let mut r = LabResult::new("seed-demo", "WAL throughput next to random-read hogs");
//! r.note("scaled to this machine: limits divided by 4");
//! r.columns(&["case", "WAL MB/s", "hog IOPS"]);
//! r.row(vec![Cell::text("alone"), Cell::num(29.0, "MB/s"), Cell::num(0.0, "IOPS")]);
//! r.row(vec![Cell::text("shared, fair"), Cell::num(28.1, "MB/s"), Cell::num(17_500.0, "IOPS")]);
//! r.goal(Goal::at_least("WAL shared+fair / alone", 28.1, 29.0, 0.95));
//! r.bars("WAL MB/s", &["alone", "shared, fair"], vec![("WAL".into(), vec![29.0, 28.1])]);
//! assert!(r.all_goals_met());
//! assert!(r.text().contains("met"));
//! assert!(r.svg().starts_with("<svg"));
//! assert_eq!(r.json()["goals"][0]["met"], true);
//! ```

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use bench::{Error, Result};

/// Options every lab takes: `--json`, `--plot FILE`, `--output FILE`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LabOutputArgs {
    /// Print JSON instead of the text table.
    #[arg(long)]
    pub json: bool,
    /// Where to write the SVG plot (default: <lab>.svg in the current directory).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Do not write a plot.
    #[arg(long = "no-plot", conflicts_with = "plot")]
    pub no_plot: bool,
    /// Write the text or JSON here instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// One table cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// A label.
    Text(String),
    /// A measured number and its unit (`"IOPS"`, `"MB/s"`, `"us"`, `""`).
    Num {
        /// The value.
        value: f64,
        /// Its unit, printed in JSON and in the column header's place.
        unit: &'static str,
    },
}

impl Cell {
    /// A label cell.
    pub fn text(s: impl Into<String>) -> Cell {
        Cell::Text(s.into())
    }

    /// A number cell.
    pub fn num(value: f64, unit: &'static str) -> Cell {
        Cell::Num { value, unit }
    }

    fn render(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Num { value, .. } => format_num(*value),
        }
    }

    fn json(&self) -> Value {
        match self {
            Cell::Text(s) => json!(s),
            Cell::Num { value, .. } => finite(*value),
        }
    }
}

/// A goal from the issue: `value / baseline` compared with a threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    /// What is compared, e.g. `"WAL shared+fair / alone"`.
    pub what: String,
    /// The measured value.
    pub value: f64,
    /// What it is divided by, measured in the same run.
    pub baseline: f64,
    /// `value / baseline`.
    pub ratio: f64,
    /// The ratio must be at least this (or at most, see `at_most`).
    pub threshold: f64,
    /// Whether the threshold is an upper bound.
    pub at_most: bool,
    /// Whether the goal was met.
    pub met: bool,
}

impl Goal {
    /// `value / baseline >= threshold`.
    pub fn at_least(what: impl Into<String>, value: f64, baseline: f64, threshold: f64) -> Goal {
        let ratio = ratio(value, baseline);
        Goal { what: what.into(), value, baseline, ratio, threshold, at_most: false, met: ratio >= threshold }
    }

    /// `value / baseline <= threshold`.
    pub fn at_most(what: impl Into<String>, value: f64, baseline: f64, threshold: f64) -> Goal {
        let ratio = ratio(value, baseline);
        Goal { what: what.into(), value, baseline, ratio, threshold, at_most: true, met: ratio <= threshold }
    }

    /// `Some(which side)` when the ratio could not be computed: the measured value or the
    /// baseline had no samples (NaN, or a baseline of zero).
    pub fn unmeasured(&self) -> Option<&'static str> {
        if self.ratio.is_finite() {
            None
        } else if !self.value.is_finite() {
            Some("the measurement")
        } else {
            Some("the baseline")
        }
    }
}

fn ratio(value: f64, baseline: f64) -> f64 {
    if baseline > 0.0 { value / baseline } else { f64::NAN }
}

/// A grouped bar chart: one group per x label, one bar per series.
#[derive(Debug, Clone, PartialEq)]
pub struct Bars {
    /// The y axis label.
    pub y_label: String,
    /// One label per group.
    pub groups: Vec<String>,
    /// `(series name, one value per group)`.
    pub series: Vec<(String, Vec<f64>)>,
}

/// A lab's result: notes, table, goals, plot, and any extra JSON.
#[derive(Debug, Clone)]
pub struct LabResult {
    /// The lab's name (`seed-003`), also the plot's default file stem.
    pub lab: String,
    /// One line saying what was measured.
    pub title: String,
    /// How the seed was scaled to this machine, what ran where, anything a reader needs.
    pub notes: Vec<String>,
    /// Column headers.
    pub columns: Vec<String>,
    /// Rows, each as long as `columns`.
    pub rows: Vec<Vec<Cell>>,
    /// The issue's goals.
    pub goals: Vec<Goal>,
    /// The plot, if any.
    pub plot: Option<Bars>,
    /// Lab-specific JSON (per-path counts, raw samples, fio JSON of each case ...).
    pub extra: serde_json::Map<String, Value>,
}

impl LabResult {
    /// An empty result.
    pub fn new(lab: impl Into<String>, title: impl Into<String>) -> LabResult {
        LabResult {
            lab: lab.into(),
            title: title.into(),
            notes: Vec::new(),
            columns: Vec::new(),
            rows: Vec::new(),
            goals: Vec::new(),
            plot: None,
            extra: serde_json::Map::new(),
        }
    }

    /// Add a note line.
    pub fn note(&mut self, s: impl Into<String>) {
        self.notes.push(s.into());
    }

    /// Set the column headers.
    pub fn columns(&mut self, names: &[&str]) {
        self.columns = names.iter().map(|s| (*s).to_string()).collect();
    }

    /// Add a row.
    ///
    /// # Panics
    ///
    /// If the row's length differs from the number of columns.
    pub fn row(&mut self, cells: Vec<Cell>) {
        assert_eq!(cells.len(), self.columns.len(), "a lab row has one cell per column");
        self.rows.push(cells);
    }

    /// Add a goal.
    pub fn goal(&mut self, g: Goal) {
        self.goals.push(g);
    }

    /// Set the plot.
    pub fn bars(&mut self, y_label: &str, groups: &[&str], series: Vec<(String, Vec<f64>)>) {
        self.plot = Some(Bars {
            y_label: y_label.to_string(),
            groups: groups.iter().map(|s| (*s).to_string()).collect(),
            series,
        });
    }

    /// Whether every goal was met (true when there are none).
    pub fn all_goals_met(&self) -> bool {
        self.goals.iter().all(|g| g.met)
    }

    /// The text report: title, notes, aligned table, goals.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{}: {}", self.lab, self.title);
        for n in &self.notes {
            let _ = writeln!(s, "  {n}");
        }
        s.push('\n');
        let cells: Vec<Vec<String>> = self.rows.iter().map(|r| r.iter().map(Cell::render).collect()).collect();
        let mut width: Vec<usize> = self.columns.iter().map(|c| c.chars().count()).collect();
        for r in &cells {
            for (i, c) in r.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let line = |out: &mut String, r: &[String], numeric: &dyn Fn(usize) -> bool| {
            for (i, c) in r.iter().enumerate() {
                let pad = width[i] - c.chars().count();
                if i > 0 {
                    out.push_str("  ");
                }
                if numeric(i) {
                    out.push_str(&" ".repeat(pad));
                    out.push_str(c);
                } else {
                    out.push_str(c);
                    if i + 1 < r.len() {
                        out.push_str(&" ".repeat(pad));
                    }
                }
            }
            out.push('\n');
        };
        let is_num = |i: usize| self.rows.first().is_some_and(|r| matches!(r[i], Cell::Num { .. }));
        line(&mut s, &self.columns, &is_num);
        let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
        line(&mut s, &rule, &|_| false);
        for r in &cells {
            line(&mut s, r, &is_num);
        }
        if !self.goals.is_empty() {
            s.push('\n');
        }
        for g in &self.goals {
            if let Some(which) = g.unmeasured() {
                // No ratio to compare: say why instead of printing NaN against the bound.
                let _ = writeln!(
                    s,
                    "goal: {} ({} {}): not measured, {which} had no samples (the host may have been idle \
                     or the run too short)",
                    g.what,
                    if g.at_most { "<=" } else { ">=" },
                    g.threshold
                );
                continue;
            }
            let _ = writeln!(
                s,
                "goal: {} = {} / {} = {:.3} ({} {}) {}",
                g.what,
                format_num(g.value),
                format_num(g.baseline),
                g.ratio,
                if g.at_most { "<=" } else { ">=" },
                g.threshold,
                if g.met { "met" } else { "NOT MET" }
            );
        }
        s
    }

    /// The JSON report.
    pub fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let mut o = serde_json::Map::new();
                for (c, v) in self.columns.iter().zip(r) {
                    o.insert(c.clone(), v.json());
                }
                Value::Object(o)
            })
            .collect();
        let goals: Vec<Value> = self
            .goals
            .iter()
            .map(|g| {
                json!({
                    "what": g.what,
                    "value": finite(g.value),
                    "baseline": finite(g.baseline),
                    "ratio": finite(g.ratio),
                    "threshold": g.threshold,
                    "bound": if g.at_most { "at_most" } else { "at_least" },
                    "met": g.met,
                    "measured": g.unmeasured().is_none(),
                })
            })
            .collect();
        let units: serde_json::Map<String, Value> = self
            .columns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match self.rows.first().map(|r| &r[i]) {
                Some(Cell::Num { unit, .. }) if !unit.is_empty() => Some((c.clone(), json!(unit))),
                _ => None,
            })
            .collect();
        let mut v = json!({
            "lab": self.lab,
            "title": self.title,
            "notes": self.notes,
            "columns": self.columns,
            "units": units,
            "rows": rows,
            "goals": goals,
            "all_goals_met": self.all_goals_met(),
        });
        if let Value::Object(o) = &mut v {
            for (k, x) in &self.extra {
                o.insert(k.clone(), x.clone());
            }
        }
        v
    }

    /// The plot as an SVG document (an empty chart when there is no plot).
    pub fn svg(&self) -> String {
        let empty = Bars { y_label: String::new(), groups: Vec::new(), series: Vec::new() };
        bars_svg(&format!("{}: {}", self.lab, self.title), self.plot.as_ref().unwrap_or(&empty))
    }

    /// Print the report as the options ask and write the plot. Returns the plot's path
    /// when one was written.
    pub fn emit(&self, opts: &LabOutputArgs) -> Result<Option<PathBuf>> {
        let plot = if opts.no_plot || self.plot.is_none() {
            None
        } else {
            let path = opts.plot.clone().unwrap_or_else(|| PathBuf::from(format!("{}.svg", self.lab)));
            write_file(&path, self.svg().as_bytes())?;
            Some(path)
        };
        let mut body = if opts.json {
            let mut s = serde_json::to_string_pretty(&self.json()).expect("a lab's JSON serialises");
            s.push('\n');
            s
        } else {
            let mut s = self.text();
            if let Some(p) = &plot {
                let _ = writeln!(s, "plot: {}", p.display());
            }
            s
        };
        match &opts.output {
            Some(p) => write_file(p, body.as_bytes())?,
            None => {
                let mut out = std::io::stdout().lock();
                out.write_all(body.as_bytes()).map_err(|e| Error::io("write lab report", e))?;
                body.clear();
            }
        }
        Ok(plot)
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// NaN and infinities are not JSON; they become `null`.
fn finite(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { Value::Null }
}

/// Three significant digits for large numbers, up to three decimals for small ones;
/// whole numbers (counts) without decimals.
fn format_num(v: f64) -> String {
    if !v.is_finite() {
        return "-".to_string();
    }
    let a = v.abs();
    if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A round axis maximum at or above `max`: 1, 2 or 5 times a power of ten.
fn nice_max(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= max {
            return m * p;
        }
    }
    10.0 * p
}

const PALETTE: [&str; 8] = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"];

/// A grouped bar chart as a standalone SVG document.
pub fn bars_svg(title: &str, b: &Bars) -> String {
    let (w, h) = (760.0_f64, 420.0_f64);
    let (left, right, top, bottom) = (80.0, 20.0, 40.0, 90.0);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let max = b.series.iter().flat_map(|(_, v)| v.iter().copied()).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let ymax = nice_max(max);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#, w / 2.0, escape(title));
    for i in 0..=5 {
        let v = ymax * f64::from(i) / 5.0;
        let y = top + plot_h - plot_h * f64::from(i) / 5.0;
        let _ = writeln!(s, r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/>"##, left + plot_w);
        let _ =
            writeln!(s, r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#, left - 6.0, y + 4.0, format_num(v));
    }
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">{}</text>"#,
        top + plot_h / 2.0,
        top + plot_h / 2.0,
        escape(&b.y_label)
    );
    let ng = b.groups.len().max(1);
    let ns = b.series.len().max(1);
    let group_w = plot_w / ng as f64;
    let bar_w = group_w * 0.8 / ns as f64;
    for (gi, g) in b.groups.iter().enumerate() {
        let gx = left + group_w * gi as f64;
        for (si, (_, vals)) in b.series.iter().enumerate() {
            let v = vals.get(gi).copied().unwrap_or(f64::NAN);
            if !v.is_finite() {
                continue;
            }
            let bh = plot_h * (v / ymax).clamp(0.0, 1.0);
            let x = gx + group_w * 0.1 + bar_w * si as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{}</title></rect>"#,
                top + plot_h - bh,
                bar_w * 0.95,
                PALETTE[si % PALETTE.len()],
                format_num(v)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            gx + group_w / 2.0,
            top + plot_h + 18.0,
            escape(g)
        );
    }
    let _ = writeln!(
        s,
        r#"<line x1="{left}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="black"/>"#,
        left + plot_w,
        top + plot_h,
        top + plot_h
    );
    for (si, (name, _)) in b.series.iter().enumerate() {
        let x = left + 150.0 * (si % 4) as f64;
        let y = h - 40.0 + 18.0 * (si / 4) as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{}" y="{y:.1}">{}</text>"#,
            y - 10.0,
            PALETTE[si % PALETTE.len()],
            x + 16.0,
            escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LabResult {
        let mut r = LabResult::new("seed-x", "a < b & c");
        r.columns(&["case", "IOPS"]);
        r.row(vec![Cell::text("one queue"), Cell::num(100_000.0, "IOPS")]);
        r.row(vec![Cell::text("n queues"), Cell::num(125_000.0, "IOPS")]);
        r.goal(Goal::at_least("n / one", 125_000.0, 100_000.0, 1.2));
        r.goal(Goal::at_most("p99 loaded / alone", 3.0, 1.0, 2.0));
        r.bars("IOPS", &["one queue", "n queues"], vec![("4k".into(), vec![100_000.0, 125_000.0])]);
        r
    }

    #[test]
    fn numbers_keep_three_digits_and_counts_none() {
        let f: Vec<String> =
            [3.0, 18.0, 0.0, 1.25, 12.34, 0.1234, 137.4, f64::NAN].into_iter().map(format_num).collect();
        assert_eq!(f, ["3", "18", "0", "1.25", "12.3", "0.123", "137", "-"]);
    }

    #[test]
    fn goals_compare_ratios_with_their_bound() {
        let r = sample();
        assert!(r.goals[0].met);
        assert!((r.goals[0].ratio - 1.25).abs() < 1e-9);
        assert!(!r.goals[1].met, "3.0 is above the 2.0 upper bound");
        assert!(!r.all_goals_met());
        assert!(!Goal::at_least("x", 1.0, 0.0, 0.5).met, "a zero baseline meets nothing");
    }

    #[test]
    fn text_aligns_numbers_right_and_names_goals() {
        let t = sample().text();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines.iter().any(|l| l.ends_with("100000") && l.starts_with("one queue")), "{t}");
        assert!(t.contains("goal: n / one = 125000 / 100000 = 1.250 (>= 1.2) met"), "{t}");
        assert!(t.contains("NOT MET"), "{t}");
    }

    #[test]
    fn a_goal_without_samples_says_so_instead_of_nan() {
        let mut r = sample();
        r.goal(Goal::at_most("p99 with flood / alone", f64::NAN, 20.0, 2.0));
        r.goal(Goal::at_least("IOPS / baseline", 5.0, 0.0, 0.5));
        let t = r.text();
        assert!(!t.contains("NaN") && !t.contains("inf"), "{t}");
        assert!(t.contains("goal: p99 with flood / alone (<= 2): not measured, the measurement had no samples"), "{t}");
        assert!(t.contains("goal: IOPS / baseline (>= 0.5): not measured, the baseline had no samples"), "{t}");
        let v = r.json();
        assert_eq!(v["goals"][2]["measured"], false);
        assert_eq!(v["goals"][2]["met"], false, "an unmeasured goal is not met");
        assert_eq!(v["goals"][0]["measured"], true);
    }

    #[test]
    fn json_has_rows_by_column_units_and_goals() {
        let mut r = sample();
        r.extra.insert("per_path".into(), json!([1, 2]));
        let v = r.json();
        assert_eq!(v["rows"][1]["IOPS"], json!(125_000.0));
        assert_eq!(v["units"]["IOPS"], "IOPS");
        assert_eq!(v["goals"][1]["bound"], "at_most");
        assert_eq!(v["all_goals_met"], false);
        assert_eq!(v["per_path"], json!([1, 2]));
        assert_eq!(finite(f64::NAN), Value::Null);
    }

    #[test]
    fn svg_is_escaped_and_has_a_bar_per_value() {
        let svg = sample().svg();
        assert!(svg.contains("a &lt; b &amp; c"));
        assert_eq!(svg.matches("<title>").count(), 2);
        assert_eq!(nice_max(125_000.0), 200_000.0);
        assert_eq!(nice_max(0.0), 1.0);
    }

    #[test]
    fn emit_writes_the_plot_and_the_report() {
        let dir = std::env::temp_dir().join(format!("qpath-lab-result-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = LabOutputArgs {
            json: true,
            plot: Some(dir.join("p.svg")),
            no_plot: false,
            output: Some(dir.join("r.json")),
        };
        let p = sample().emit(&opts).unwrap();
        assert_eq!(p.as_deref(), Some(dir.join("p.svg").as_path()));
        let v: Value = serde_json::from_slice(&std::fs::read(dir.join("r.json")).unwrap()).unwrap();
        assert_eq!(v["lab"], "seed-x");
        assert!(std::fs::read_to_string(dir.join("p.svg")).unwrap().ends_with("</svg>\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
