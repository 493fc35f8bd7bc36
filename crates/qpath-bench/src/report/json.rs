//! fio 3.33's JSON output (`stat.c`: `show_thread_status_json`,
//! `add_ddir_status_json`, `add_ddir_lat_json`, `json.c` printing): the same keys,
//! nesting, units and number formats (`%lld` integers, `%f` floats, `"key" : value`).
//! Extras live under the top-level key `"qpath"`, which fio does not use.

use std::fmt::Write as _;

use super::time::{ctime, epoch_secs_ms};
use super::{Baseline, GroupStats, JobRatios, JobReport, Ratio, Report, agg_percent, calc_dist, calc_lat};
use crate::baseline::Physical;
use crate::stats::{DirStats, LatHist, LatStat};

/// A JSON value that prints the way fio's json.c prints.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `%lld`.
    Int(i128),
    /// `%f` (six decimals).
    Float(f64),
    /// A string.
    Str(String),
    /// An object with ordered keys.
    Obj(Vec<(String, Json)>),
    /// An array.
    Arr(Vec<Json>),
}

impl Json {
    fn obj() -> Json {
        Json::Obj(Vec::new())
    }

    fn put(&mut self, key: impl Into<String>, value: Json) {
        if let Json::Obj(v) = self {
            v.push((key.into(), value));
        }
    }

    fn int(&mut self, key: &str, v: impl Into<i128>) {
        self.put(key, Json::Int(v.into()));
    }

    fn float(&mut self, key: &str, v: f64) {
        self.put(key, Json::Float(v));
    }

    /// fio drops string pairs whose value is empty (json.c `strdup_escape` returns NULL).
    fn str(&mut self, key: &str, v: &str) {
        if !v.is_empty() {
            self.put(key, Json::Str(v.to_string()));
        }
    }

    /// Print with fio's layout starting at nesting `level`.
    pub fn print(&self, out: &mut String, level: usize) {
        match self {
            Json::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Json::Float(f) => {
                let f = if f.is_finite() { *f } else { 0.0 };
                let _ = write!(out, "{f:.6}");
            }
            Json::Str(s) => {
                out.push('"');
                escape(out, s);
                out.push('"');
            }
            Json::Obj(pairs) => {
                out.push_str("{\n");
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        out.push_str(",\n");
                    }
                    indent(out, level + 1);
                    out.push('"');
                    escape(out, k);
                    out.push_str("\" : ");
                    v.print(out, level + 1);
                }
                out.push('\n');
                indent(out, level);
                out.push('}');
            }
            Json::Arr(items) => {
                out.push_str("[\n");
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(",\n");
                    }
                    indent(out, level + 1);
                    v.print(out, level + 1);
                }
                out.push('\n');
                indent(out, level);
                out.push(']');
            }
        }
    }
}

fn indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn escape(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

fn opts_obj(opts: &[(String, Option<String>)]) -> Option<Json> {
    let mut o = Json::obj();
    for (k, v) in opts {
        if let Some(v) = v {
            o.str(k, v);
        }
    }
    match &o {
        Json::Obj(v) if v.is_empty() => None,
        _ => Some(o),
    }
}

/// fio `add_ddir_lat_json`.
fn lat_json(stat: &LatStat, hist: Option<&LatHist>, percentiles: bool, list: &[f64], plus: bool) -> Json {
    let mut o = Json::obj();
    let s = stat.summary();
    o.int("min", s.map_or(0, |s| s.min));
    o.int("max", s.map_or(0, |s| s.max));
    o.float("mean", s.map_or(0.0, |s| s.mean));
    o.float("stddev", s.map_or(0.0, |s| s.dev));
    o.int("N", stat.samples);
    if percentiles
        && stat.samples > 0
        && let Some(h) = hist.filter(|h| !h.is_empty())
    {
        let mut p = Json::obj();
        for (pc, v) in list.iter().zip(h.percentiles(list)) {
            p.int(&format!("{pc:.6}"), v);
        }
        o.put("percentile", p);
        if plus {
            let mut bins = Json::obj();
            for (v, c) in h.bins() {
                bins.int(&v.to_string(), c);
            }
            o.put("bins", bins);
        }
    }
    o
}

/// fio `add_ddir_status_json` for read/write/trim.
fn ddir_json(r: &JobReport, g: &GroupStats, d: usize, plus: bool) -> Json {
    let empty = DirStats::default();
    let ds = if d < 2 { &r.stat.dirs[d] } else { &empty };
    let mut o = Json::obj();
    let (bw_bytes, bw, iops) = match (1000 * ds.io_bytes).checked_div(ds.runtime_ms) {
        Some(bwb) => {
            #[allow(clippy::cast_precision_loss)]
            let iops = 1000.0 * ds.total_ios as f64 / ds.runtime_ms as f64;
            (bwb, bwb / 1024, iops)
        }
        None => (0, 0, 0.0),
    };
    o.int("io_bytes", ds.io_bytes);
    o.int("io_kbytes", ds.io_bytes >> 10);
    o.int("bw_bytes", bw_bytes);
    o.int("bw", bw);
    o.float("iops", iops);
    o.int("runtime", ds.runtime_ms);
    o.int("total_ios", ds.total_ios);
    o.int("short_ios", ds.short_ios);
    o.int("drop_ios", ds.drop_ios);
    let list = &r.percentile_list;
    o.put("slat_ns", lat_json(&ds.slat, ds.slat_hist.as_ref(), r.slat_percentiles, list, plus));
    o.put("clat_ns", lat_json(&ds.clat, ds.clat_hist.as_ref(), r.clat_percentiles, list, plus));
    o.put("lat_ns", lat_json(&ds.lat, ds.lat_hist.as_ref(), r.lat_percentiles, list, plus));
    let (bmin, bmax, bagg, bmean, bdev) = match ds.bw.summary() {
        Some(s) => (s.min, s.max, agg_percent(g, d.min(2), s.mean), s.mean, s.dev),
        None => (0, 0, 0.0, 0.0, 0.0),
    };
    o.int("bw_min", bmin);
    o.int("bw_max", bmax);
    o.float("bw_agg", bagg);
    o.float("bw_mean", bmean);
    o.float("bw_dev", bdev);
    o.int("bw_samples", ds.bw.samples);
    let (imin, imax, imean, idev) = match ds.iops.summary() {
        Some(s) => (s.min, s.max, s.mean, s.dev),
        None => (0, 0, 0.0, 0.0),
    };
    o.int("iops_min", imin);
    o.int("iops_max", imax);
    o.float("iops_mean", imean);
    o.float("iops_stddev", idev);
    o.int("iops_samples", ds.iops.samples);
    o
}

fn dist_obj(vals: &[f64], keys: &[&str]) -> Json {
    let mut o = Json::obj();
    for (k, v) in keys.iter().zip(vals) {
        o.float(k, *v);
    }
    o
}

/// fio `show_thread_status_json`.
fn job_json(r: &JobReport, g: &GroupStats, elapsed: u64, plus: bool) -> Json {
    let st = &r.stat;
    let mut o = Json::obj();
    o.str("jobname", &r.name);
    o.int("groupid", u64::try_from(r.groupid).unwrap_or(0));
    o.int("error", r.error);
    o.int("eta", 0);
    o.int("elapsed", elapsed);
    if let Some(opts) = opts_obj(&r.options) {
        o.put("job options", opts);
    }
    o.put("read", ddir_json(r, g, 0, plus));
    o.put("write", ddir_json(r, g, 1, plus));
    o.put("trim", ddir_json(r, g, 2, plus));
    let mut sync = Json::obj();
    sync.int("total_ios", st.sync_total);
    sync.put(
        "lat_ns",
        lat_json(&st.sync, st.sync_hist.as_ref(), r.lat_percentiles || r.clat_percentiles, &r.percentile_list, plus),
    );
    o.put("sync", sync);
    #[allow(clippy::cast_precision_loss)]
    let (usr, sys) = if st.total_run_time_ms > 0 {
        let t = st.total_run_time_ms as f64;
        ((st.usr_us / 1000) as f64 * 100.0 / t, (st.sys_us / 1000) as f64 * 100.0 / t)
    } else {
        (0.0, 0.0)
    };
    o.int("job_runtime", st.total_run_time_ms);
    o.float("usr_cpu", usr);
    o.float("sys_cpu", sys);
    o.int("ctx", st.ctx);
    o.int("majf", st.majf);
    o.int("minf", st.minf);
    let total = st.total_ios();
    o.put("iodepth_level", dist_obj(&calc_dist(&st.io_u_map, total), &["1", "2", "4", "8", "16", "32", ">=64"]));
    let batch_keys = ["0", "4", "8", "16", "32", "64", ">=64"];
    o.put("iodepth_submit", dist_obj(&calc_dist(&st.io_u_submit, st.total_submit), &batch_keys));
    o.put("iodepth_complete", dist_obj(&calc_dist(&st.io_u_complete, st.total_complete), &batch_keys));
    let nu = ["2", "4", "10", "20", "50", "100", "250", "500", "750", "1000"];
    let m = ["2", "4", "10", "20", "50", "100", "250", "500", "750", "1000", "2000", ">=2000"];
    o.put("latency_ns", dist_obj(&calc_lat(&st.lat_n, total), &nu));
    o.put("latency_us", dist_obj(&calc_lat(&st.lat_u, total), &nu));
    o.put("latency_ms", dist_obj(&calc_lat(&st.lat_m, total), &m));
    if r.latency_depth > 0 {
        o.int("latency_depth", r.latency_depth);
        o.int("latency_target", 0);
        o.float("latency_percentile", 100.0);
        o.int("latency_window", 0);
    }
    if let Some(d) = &r.description {
        o.str("desc", d);
    }
    o
}

fn baseline_json(r: &JobReport, baselines: &[Baseline]) -> Option<Json> {
    let (rw, bs, qd) = &r.shape;
    let b = baselines.iter().find(|b| &b.rw == rw && b.bs == *bs && b.iodepth == *qd)?;
    let iops = r.workload_iops();
    let mut o = Json::obj();
    o.str("label", &b.label);
    o.float("iops", b.iops);
    o.float("iops_ratio", if b.iops > 0.0 { iops / b.iops } else { 0.0 });
    if let Some(lat) = b.lat_mean_ns {
        let ours = r.stat.dirs.iter().find(|d| d.lat.samples > 0).map(|d| d.lat.mean);
        if let Some(ours) = ours {
            o.float("lat_mean_ns", lat);
            o.float("lat_ratio", ours / lat);
        }
    }
    Some(o)
}

/// The physical baseline as JSON (under `qpath.baseline`, and `qpath lab baseline --json`).
pub fn physical_json(p: &Physical) -> Json {
    let mut o = Json::obj();
    o.str("label", &p.describe());
    let pl = &p.placement;
    let cpu = |c: Option<usize>| c.map_or(-1i128, |c| i128::try_from(c).unwrap_or(-1));
    o.int("server_cpu", cpu(pl.server_cpu));
    o.int("client_cpu", cpu(pl.client_cpu));
    o.str("server_wait", pl.server_wait.name());
    o.str("client_wait", pl.client_wait.name());
    o.str("tcp_congestion", p.tcp_congestion.unwrap_or("system"));
    let pp = &p.ping_pong;
    let mut ping = Json::obj();
    ping.int("request_bytes", crate::baseline::REQUEST_BYTES as u64);
    ping.int("reply_bytes", crate::baseline::REPLY_BYTES as u64);
    ping.int("round_trips", pp.round_trips);
    ping.float("lat_mean_ns", pp.lat_mean_ns);
    ping.int("lat_min_ns", pp.lat_min_ns);
    ping.int("lat_p50_ns", pp.lat_p50_ns);
    ping.int("lat_p99_ns", pp.lat_p99_ns);
    ping.int("lat_p999_ns", pp.lat_p999_ns);
    ping.int("lat_max_ns", pp.lat_max_ns);
    o.put("ping_pong", ping);
    let mut st = Json::obj();
    st.int("write_bytes", crate::baseline::STREAM_WRITE_BYTES as u64);
    st.int("bytes", p.stream.bytes);
    st.float("seconds", p.stream.seconds);
    st.float("bw_bytes", p.stream.bw_bytes);
    o.put("stream", st);
    o
}

fn ratio_json(r: &Ratio, job_key: &str, base_key: &str) -> Json {
    let mut o = Json::obj();
    o.float(job_key, r.job);
    o.float(base_key, r.baseline);
    o.float("ratio", r.ratio());
    o
}

fn ratios_json(r: &JobRatios) -> Json {
    let mut o = Json::obj();
    if let Some(x) = &r.lat_mean {
        o.put("lat_mean", ratio_json(x, "job_ns", "ping_pong_ns"));
    }
    if let Some(x) = &r.lat_p99 {
        o.put("lat_p99", ratio_json(x, "job_ns", "ping_pong_ns"));
    }
    if let Some(x) = &r.bw {
        o.put("bw", ratio_json(x, "job_bytes", "stream_bytes"));
    }
    o
}

/// A multipath job's policy and per-path counts (under `qpath.jobs[].multipath`).
fn multipath_json(m: &crate::engine::mpath::MultipathStats) -> Json {
    let mut o = Json::obj();
    o.str("policy", &m.policy);
    let total = m.total_ios();
    let paths = m
        .paths
        .iter()
        .map(|p| {
            let mut po = Json::obj();
            po.str("traddr", &p.traddr);
            po.int("ios", p.ios);
            po.int("io_bytes", p.bytes);
            #[allow(clippy::cast_precision_loss)] // counts well below 2^53
            po.float("ios_pct", if total > 0 { 100.0 * p.ios as f64 / total as f64 } else { 0.0 });
            po
        })
        .collect();
    o.put("paths", Json::Arr(paths));
    o
}

fn qpath_json(report: &Report) -> Json {
    let mut q = Json::obj();
    q.str("version", &report.version);
    if let Some(t) = &report.target {
        q.str("target", t);
    }
    if let Some(p) = &report.physical {
        q.put("baseline", physical_json(p));
    }
    let mut jobs = Vec::new();
    for r in &report.jobs {
        let mut j = Json::obj();
        j.str("jobname", &r.name);
        j.int("groupid", u64::try_from(r.groupid).unwrap_or(0));
        j.put("engines", Json::Arr(r.engines.iter().map(|e| Json::Str(e.clone())).collect()));
        j.put("targets", Json::Arr(r.targets.iter().map(|t| Json::Str(t.clone())).collect()));
        if r.error != 0 {
            j.str("error_message", &r.verror);
        }
        let v = &r.stat.verify;
        if v.checked > 0 || v.failures > 0 {
            let mut vo = Json::obj();
            vo.int("checked", v.checked);
            vo.int("failures", v.failures);
            if let Some(f) = &v.first_failure {
                vo.str("first_failure", f);
            }
            j.put("verify", vo);
        }
        if let Some(p) = &report.physical {
            let ratios = JobRatios::of(r, p);
            if !ratios.is_empty() {
                j.put("ratios", ratios_json(&ratios));
            }
        }
        if let Some(m) = &r.multipath {
            j.put("multipath", multipath_json(m));
        }
        if let Some(p) = &r.page_cache {
            let state = match p {
                crate::run::worker::PageCache::Invalidated => "invalidated",
                crate::run::worker::PageCache::Kept => "kept",
                crate::run::worker::PageCache::Failed(_) => "not invalidated",
            };
            j.str("page_cache", state);
        }
        if let Some(t) = r.fast_io_fail_tmo_s {
            j.put("fast_io_fail_tmo_s", Json::Int(t.into()));
        }
        if let Some(b) = baseline_json(r, &report.baselines) {
            j.put("reference", b);
        }
        jobs.push(j);
    }
    q.put("jobs", Json::Arr(jobs));
    if !report.notes.is_empty() {
        q.put("notes", Json::Arr(report.notes.iter().map(|n| Json::Str(n.clone())).collect()));
    }
    q
}

/// The JSON document; `plus` adds latency `bins` (`--output-format=json+`).
pub fn build(report: &Report, plus: bool) -> Json {
    let (secs, ms) = epoch_secs_ms(report.time);
    let mut root = Json::obj();
    root.str("fio version", &report.version);
    root.int("timestamp", secs);
    root.int("timestamp_ms", ms);
    root.str("time", &ctime(report.time));
    if let Some(g) = opts_obj(&report.global_options) {
        root.put("global options", g);
    }
    let jobs = report.jobs.iter().map(|r| job_json(r, &report.groups[r.groupid], report.elapsed_sec, plus)).collect();
    root.put("jobs", Json::Arr(jobs));
    root.put("qpath", qpath_json(report));
    root
}

/// The JSON text, ending with a newline, as fio prints it.
pub fn render(report: &Report, plus: bool) -> String {
    let mut out = String::new();
    build(report, plus).print(&mut out, 0);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_like_fio_json_c() {
        let mut o = Json::obj();
        o.str("fio version", "qpath-0.1.0");
        o.int("n", 3u64);
        o.float("f", 0.5);
        o.str("empty", "");
        let mut inner = Json::obj();
        inner.int("a", 1u64);
        o.put("obj", inner);
        o.put("arr", Json::Arr(vec![Json::Int(1), Json::Str("x\"y".into())]));
        let mut s = String::new();
        o.print(&mut s, 0);
        let want = "{\n  \"fio version\" : \"qpath-0.1.0\",\n  \"n\" : 3,\n  \"f\" : 0.500000,\n  \"obj\" : {\n    \"a\" : 1\n  },\n  \"arr\" : [\n    1,\n    \"x\\\"y\"\n  ]\n}";
        assert_eq!(s, want);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["f"], serde_json::json!(0.5));
    }
}
