//! fio 3.33's normal text output (`stat.c`: `show_thread_status_normal`,
//! `show_ddir_status`, `show_clat_percentiles`, `show_latencies`,
//! `show_group_stats`), line for line for the fields we produce. `Disk stats` is not
//! produced.

use std::fmt::Write as _;

use super::num2str::{Unit, num2str};
use super::time::ctime;
use super::{GroupStats, JobReport, Report, agg_percent, calc_dist, calc_lat};
use crate::job::JobSpec;
use crate::stats::{DirStats, LatHist, LatStat, Summary};

/// The lines fio prints while setting jobs up: one per job (`...` for its second clone,
/// nothing for further clones), the version, and `Starting N threads`.
pub fn job_headers(jobs: &[(&JobSpec, &str)], version: &str) -> String {
    let mut out = String::new();
    for (j, engine) in jobs {
        match j.place.clone {
            0 => {
                let i2p = j.kb_base == 1024;
                let fmt = |v: u64| num2str(v, j.sig_figs as usize, 1, i2p, Unit::Byte);
                let _ = writeln!(
                    out,
                    "{}: (g={}): rw={}, bs=(R) {}-{}, (W) {}-{}, (T) {}-{}, ioengine={}, iodepth={}",
                    j.name,
                    j.place.groupid,
                    j.rw_str(),
                    fmt(j.bs[0].0),
                    fmt(j.bs[0].1),
                    fmt(j.bs[1].0),
                    fmt(j.bs[1].1),
                    fmt(j.bs[0].0),
                    fmt(j.bs[0].1),
                    engine,
                    j.iodepth
                );
            }
            1 => out.push_str("...\n"),
            _ => {}
        }
    }
    let n = jobs.len();
    let _ = writeln!(out, "{version}");
    let _ = writeln!(out, "Starting {n} thread{}", if n == 1 { "" } else { "s" });
    out
}

/// fio `nsec_to_msec` / `nsec_to_usec`: pick the unit and scale.
fn scale_lat(s: Summary) -> (&'static str, Summary) {
    let Summary { min, max, mean, dev } = s;
    if min > 2_000_000 && max > 99_999_999 && dev > 1_000_000.0 {
        ("(msec)", Summary { min: min / 1_000_000, max: max / 1_000_000, mean: mean / 1e6, dev: dev / 1e6 })
    } else if min > 2000 && max > 99_999 && dev > 1000.0 {
        ("(usec)", Summary { min: min / 1000, max: max / 1000, mean: mean / 1e3, dev: dev / 1e3 })
    } else {
        ("(nsec)", s)
    }
}

fn display_lat(out: &mut String, name: &str, stat: &LatStat) {
    let Some(s) = stat.summary() else { return };
    let (base, s) = scale_lat(s);
    let _ = writeln!(
        out,
        "    {name} {base}: min={}, max={}, avg={:5.2}, stdev={:5.2}",
        num2str(s.min, 6, 1, false, Unit::None),
        num2str(s.max, 6, 1, false, Unit::None),
        s.mean,
        s.dev
    );
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
fn log10_width(v: u64) -> usize {
    // fio: (int)(log10(maxv / divisor) + 1), at least 5.
    if v == 0 {
        return 5;
    }
    ((v as f64).log10() + 1.0) as usize
}

/// fio `show_clat_percentiles`.
fn show_percentiles(out: &mut String, hist: &LatHist, list: &[f64], precision: usize, pre: &str) {
    if hist.is_empty() || list.is_empty() {
        return;
    }
    let mut vals = hist.percentiles(list);
    let minv = vals.iter().copied().min().unwrap_or(0);
    let maxv = vals.iter().copied().max().unwrap_or(0);
    let (scale_down, divisor, unit) = if minv > 2_000_000 && maxv > 99_999_999 {
        (2, 1_000_000, "msec")
    } else if minv > 2000 && maxv > 99_999 {
        (1, 1000, "usec")
    } else {
        (0, 1, "nsec")
    };
    let _ = write!(out, "    {pre} percentiles ({unit}):\n     |");
    let time_width = log10_width(maxv / divisor).max(5);
    let per_line = (80 - 7) / (precision + 10 + time_width);
    let len = vals.len();
    for (j, (p, v)) in list.iter().zip(vals.iter_mut()).enumerate() {
        if j != 0 && j % per_line == 0 {
            out.push_str("     |");
        }
        let is_last = j == len - 1;
        for _ in 0..scale_down {
            *v = v.div_ceil(1000);
        }
        let _ = write!(
            out,
            " {p:>w$.prec$}th=[{v:>tw$}]{}",
            if is_last { '\n' } else { ',' },
            w = precision + 3,
            prec = precision,
            tw = time_width
        );
        if is_last {
            break;
        }
        if j % per_line == per_line - 1 {
            out.push('\n');
        }
    }
}

fn ddir_status(out: &mut String, r: &JobReport, g: &GroupStats, d: usize) {
    let ds: &DirStats = &r.stat.dirs[d];
    if ds.runtime_ms == 0 {
        return;
    }
    let i2p = g.kb_base == 1024;
    let runt = ds.runtime_ms;
    let bw = 1000 * ds.io_bytes / runt;
    let sig = r.sig_figs as usize;
    let iops = 1000 * ds.total_ios / runt;
    let name = if d == 0 { "read" } else { "write" };
    let post = if d == 1 { "; 0 zone resets" } else { "" };
    let _ = writeln!(
        out,
        "  {name}: IOPS={}, BW={} ({})({}/{runt}msec){post}",
        num2str(iops, sig, 1, false, Unit::None),
        num2str(bw, sig, 1, i2p, Unit::BytePerSec),
        num2str(bw, sig, 1, !i2p, Unit::BytePerSec),
        num2str(ds.io_bytes, sig, 1, i2p, Unit::Byte),
    );
    display_lat(out, "slat", &ds.slat);
    display_lat(out, "clat", &ds.clat);
    display_lat(out, " lat", &ds.lat);
    let (list, prec) = (&r.percentile_list, r.percentile_precision);
    if r.slat_percentiles
        && ds.slat.samples > 0
        && let Some(h) = &ds.slat_hist
    {
        show_percentiles(out, h, list, prec, "slat");
    }
    if r.clat_percentiles
        && ds.clat.samples > 0
        && let Some(h) = &ds.clat_hist
    {
        show_percentiles(out, h, list, prec, "clat");
    }
    if r.lat_percentiles
        && ds.lat.samples > 0
        && let Some(h) = &ds.lat_hist
    {
        show_percentiles(out, h, list, prec, "lat");
    }
    if let Some(s) = ds.bw.summary() {
        let kb = f64::from(g.kb_base);
        let per = agg_percent(g, d, s.mean);
        let (mut min, mut max, mut mean, mut dev) = (s.min, s.max, s.mean, s.dev);
        let mut unit = if i2p { "KiB" } else { "kB" };
        if mean > kb * kb {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            {
                min = (min as f64 / kb) as u64;
                max = (max as f64 / kb) as u64;
            }
            mean /= kb;
            dev /= kb;
            unit = "MiB";
        }
        let _ = writeln!(
            out,
            "   bw ({unit:>5}/s): min={min:5}, max={max:5}, per={per:3.2}%, avg={mean:5.2}, stdev={dev:5.2}, samples={}",
            ds.bw.samples
        );
    }
    if let Some(s) = ds.iops.summary() {
        let _ = writeln!(
            out,
            "   iops        : min={:5}, max={:5}, avg={:5.2}, stdev={:5.2}, samples={}",
            s.min, s.max, s.mean, s.dev, ds.iops.samples
        );
    }
}

fn show_lat_line(out: &mut String, vals: &[f64], ranges: &[&str], unit: &str) {
    let mut new_line = true;
    let mut shown = false;
    let mut line = 0;
    for (v, r) in vals.iter().zip(ranges) {
        if *v <= 0.0 {
            continue;
        }
        shown = true;
        if new_line {
            if line > 0 {
                out.push('\n');
            }
            let _ = write!(out, "  lat ({unit})   : ");
            new_line = false;
            line = 0;
        }
        if line > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{r}{v:3.2}%");
        line += 1;
        if line == 5 {
            new_line = true;
        }
    }
    if shown {
        out.push('\n');
    }
}

const RANGES_NU: [&str; 10] = ["2=", "4=", "10=", "20=", "50=", "100=", "250=", "500=", "750=", "1000="];
const RANGES_M: [&str; 12] =
    ["2=", "4=", "10=", "20=", "50=", "100=", "250=", "500=", "750=", "1000=", "2000=", ">=2000="];

#[allow(clippy::cast_precision_loss)]
fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 * 100.0 / whole as f64 }
}

/// One job's block (fio `show_thread_status_normal`).
pub fn job_status(out: &mut String, r: &JobReport, g: &GroupStats, time: &str) {
    let st = &r.stat;
    if st.dirs.iter().all(|d| d.io_bytes == 0) && st.total_ios() == 0 {
        return;
    }
    if r.error == 0 {
        let _ = writeln!(
            out,
            "{}: (groupid={}, jobs={}): err={:2}: pid={}: {time}",
            r.name, r.groupid, r.members, r.error, r.pid
        );
    } else {
        let _ = writeln!(
            out,
            "{}: (groupid={}, jobs={}): err={:2} ({}): pid={}: {time}",
            r.name, r.groupid, r.members, r.error, r.verror, r.pid
        );
    }
    if let Some(desc) = r.description.as_deref().filter(|d| !d.is_empty()) {
        let _ = writeln!(out, "  Description  : [{desc}]");
    }
    for d in 0..2 {
        if st.dirs[d].io_bytes > 0 {
            ddir_status(out, r, g, d);
        }
    }
    let total = st.total_ios();
    show_lat_line(out, &calc_lat(&st.lat_n, total), &RANGES_NU, "nsec");
    show_lat_line(out, &calc_lat(&st.lat_u, total), &RANGES_NU, "usec");
    show_lat_line(out, &calc_lat(&st.lat_m, total), &RANGES_M, "msec");
    if st.sync.samples > 0 {
        out.push_str("  fsync/fdatasync/sync_file_range:\n");
        display_lat(out, "sync", &st.sync);
        if let Some(h) = &st.sync_hist {
            show_percentiles(out, h, &r.percentile_list, r.percentile_precision, "sync");
        }
    }
    let (usr, sys) = if st.total_run_time_ms > 0 {
        (pct(st.usr_us / 1000, st.total_run_time_ms), pct(st.sys_us / 1000, st.total_run_time_ms))
    } else {
        (0.0, 0.0)
    };
    let _ = writeln!(
        out,
        "  cpu          : usr={usr:3.2}%, sys={sys:3.2}%, ctx={}, majf={}, minf={}",
        st.ctx, st.majf, st.minf
    );
    let m = calc_dist(&st.io_u_map, total);
    let _ = writeln!(
        out,
        "  IO depths    : 1={:3.1}%, 2={:3.1}%, 4={:3.1}%, 8={:3.1}%, 16={:3.1}%, 32={:3.1}%, >=64={:3.1}%",
        m[0], m[1], m[2], m[3], m[4], m[5], m[6]
    );
    for (label, map, n) in
        [("submit    ", &st.io_u_submit, st.total_submit), ("complete  ", &st.io_u_complete, st.total_complete)]
    {
        let m = calc_dist(map, n);
        let _ = writeln!(
            out,
            "     {label}: 0={:3.1}%, 4={:3.1}%, 8={:3.1}%, 16={:3.1}%, 32={:3.1}%, 64={:3.1}%, >=64={:3.1}%",
            m[0], m[1], m[2], m[3], m[4], m[5], m[6]
        );
    }
    let (r0, r1) = (&st.dirs[0], &st.dirs[1]);
    let _ = writeln!(
        out,
        "     issued rwts: total={},{},0,{} short={},{},0,0 dropped={},{},0,0",
        r0.total_ios, r1.total_ios, st.sync_total, r0.short_ios, r1.short_ios, r0.drop_ios, r1.drop_ios
    );
    if r.latency_depth > 0 {
        let _ = writeln!(out, "     latency   : target=0, window=0, percentile=100.00%, depth={}", r.latency_depth);
    }
}

/// fio `show_group_stats`.
pub fn group_status(out: &mut String, g: &GroupStats) {
    let _ = write!(out, "\nRun status group {} (all jobs):\n", g.groupid);
    let i2p = g.kb_base == 1024;
    let sig = g.sig_figs as usize;
    for (d, label) in ["   READ", "  WRITE", "   TRIM"].iter().enumerate() {
        if g.max_run[d] == 0 {
            continue;
        }
        let f = |v: u64, p: bool, u: Unit| num2str(v, sig, 1, p, u);
        let _ = writeln!(
            out,
            "{label}: bw={} ({}), {}-{} ({}-{}), io={} ({}), run={}-{}msec",
            f(g.agg[d], i2p, Unit::BytePerSec),
            f(g.agg[d], !i2p, Unit::BytePerSec),
            f(g.min_bw[d], i2p, Unit::BytePerSec),
            f(g.max_bw[d], i2p, Unit::BytePerSec),
            f(g.min_bw[d], !i2p, Unit::BytePerSec),
            f(g.max_bw[d], !i2p, Unit::BytePerSec),
            f(g.io_bytes[d], i2p, Unit::Byte),
            f(g.io_bytes[d], !i2p, Unit::Byte),
            g.min_run[d],
            g.max_run[d]
        );
    }
}

/// The whole end-of-run text report (fio `__show_run_stats` for normal output):
/// a blank line, each job, each group, then a qpath section if any job verified.
pub fn render(report: &Report) -> String {
    let mut out = String::from("\n");
    let time = ctime(report.time);
    for r in &report.jobs {
        job_status(&mut out, r, &report.groups[r.groupid], &time);
    }
    for g in &report.groups {
        group_status(&mut out, g);
    }
    let verified: Vec<&JobReport> =
        report.jobs.iter().filter(|r| r.stat.verify.checked > 0 || r.stat.verify.failures > 0).collect();
    if !verified.is_empty() {
        out.push_str("\nVerify (qpath, crc32c):\n");
        for r in verified {
            let v = &r.stat.verify;
            let _ = writeln!(out, "  {}: checked={} blocks, failures={}", r.name, v.checked, v.failures);
            if let Some(first) = &v.first_failure {
                let _ = writeln!(out, "    first: {first}");
            }
        }
    }
    qpath_section(&mut out, report);
    out
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn fmt_bw(bytes: f64) -> String {
    if bytes >= 1e9 { format!("{:.2} GB/s", bytes / 1e9) } else { format!("{:.1} MB/s", bytes / 1e6) }
}

/// qpath's own lines after fio's: the target used, the physical baseline of this run
/// with each job's ratio to it, and the reference numbers (SPDK) by job shape.
fn qpath_section(out: &mut String, report: &Report) {
    let multipath = report.jobs.iter().any(|r| r.multipath.is_some());
    let per_job = report.jobs.iter().any(|r| r.page_cache.is_some() || r.fast_io_fail_tmo_s.is_some());
    if report.target.is_none() && report.physical.is_none() && !multipath && !per_job {
        return;
    }
    out.push_str("\nqpath:\n");
    if let Some(t) = &report.target {
        let _ = writeln!(out, "  target: {t}");
    }
    if let Some(p) = &report.physical {
        physical_lines(out, report, p);
    }
    reference_lines(out, report);
    multipath_lines(out, report);
    job_lines(out, report);
}

/// Per job, what qpath did around its I/O that fio users expect to know: the page cache
/// of a local file (`invalidate`), how long a remote job's I/O waits for a lost target.
fn job_lines(out: &mut String, report: &Report) {
    for r in &report.jobs {
        if let Some(p) = &r.page_cache {
            let _ = writeln!(out, "  job {}: page cache {p}", r.name);
        }
        match r.fast_io_fail_tmo_s {
            Some(-1) => {
                let _ = writeln!(
                    out,
                    "  job {}: fast_io_fail_tmo off: I/O waits while the target reconnects (ctrl_loss_tmo)",
                    r.name
                );
            }
            Some(s) => {
                let _ =
                    writeln!(out, "  job {}: fast_io_fail_tmo={s} s: I/O fails {s} s after its target is lost", r.name);
            }
            None => {}
        }
    }
}

/// Each multipath job's policy and how its I/O spread over the paths.
fn multipath_lines(out: &mut String, report: &Report) {
    for r in &report.jobs {
        let Some(m) = &r.multipath else { continue };
        let total = m.total_ios();
        let _ = writeln!(out, "  multipath {}: policy={}, {} paths, ios={total}", r.name, m.policy, m.paths.len());
        for p in &m.paths {
            #[allow(clippy::cast_precision_loss)] // counts well below 2^53
            let pct = if total > 0 { 100.0 * p.ios as f64 / total as f64 } else { 0.0 };
            let _ = writeln!(
                out,
                "    path {}: ios={} ({pct:.1}%), io={}",
                p.traddr,
                p.ios,
                num2str(p.bytes, r.sig_figs as usize, 1, r.kb_base == 1024, Unit::Byte)
            );
        }
    }
}

/// The physical baseline as `qpath lab baseline` prints it.
pub fn physical_text(p: &crate::baseline::Physical) -> String {
    let mut out = String::new();
    let pp = &p.ping_pong;
    let _ = writeln!(out, "baseline: {}", p.describe());
    #[allow(clippy::cast_precision_loss)]
    let (p50, p99, p999) = (pp.lat_p50_ns as f64, pp.lat_p99_ns as f64, pp.lat_p999_ns as f64);
    let _ = writeln!(
        out,
        "  ping-pong {}B/{}B: avg={}, p50={}, p99={}, p99.9={} ({} round trips)",
        crate::baseline::REQUEST_BYTES,
        crate::baseline::REPLY_BYTES,
        fmt_ns(pp.lat_mean_ns),
        fmt_ns(p50),
        fmt_ns(p99),
        fmt_ns(p999),
        pp.round_trips
    );
    let _ = writeln!(
        out,
        "  stream {}KiB writes: {} ({:.1} s)",
        crate::baseline::STREAM_WRITE_BYTES / 1024,
        fmt_bw(p.stream.bw_bytes),
        p.stream.seconds
    );
    out
}

fn physical_lines(out: &mut String, report: &Report, p: &crate::baseline::Physical) {
    use crate::report::JobRatios;
    for line in physical_text(p).lines() {
        let _ = writeln!(out, "  {line}");
    }
    for r in &report.jobs {
        let x = JobRatios::of(r, p);
        if let Some(l) = x.lat_mean {
            let _ = writeln!(
                out,
                "  {}: lat avg {} / ping-pong avg {} = {:.2}x (goal <= 1.5x)",
                r.name,
                fmt_ns(l.job),
                fmt_ns(l.baseline),
                l.ratio()
            );
        }
        if let Some(l) = x.lat_p99 {
            let _ = writeln!(
                out,
                "  {}: lat p99 {} / ping-pong p99 {} = {:.2}x",
                r.name,
                fmt_ns(l.job),
                fmt_ns(l.baseline),
                l.ratio()
            );
        }
        if let Some(b) = x.bw {
            let _ = writeln!(
                out,
                "  {}: bw {} / stream bw {} = {:.2} (goal >= 0.8)",
                r.name,
                fmt_bw(b.job),
                fmt_bw(b.baseline),
                b.ratio()
            );
        }
    }
}

/// The reference numbers (measured elsewhere), clearly labelled, for jobs of their shape.
fn reference_lines(out: &mut String, report: &Report) {
    let mut label_printed = false;
    for r in &report.jobs {
        let (rw, bs, qd) = &r.shape;
        let Some(b) = report.baselines.iter().find(|b| &b.rw == rw && b.bs == *bs && b.iodepth == *qd) else {
            continue;
        };
        if !label_printed {
            let _ = writeln!(out, "  reference (not this run): {}", b.label);
            label_printed = true;
        }
        let iops = r.workload_iops();
        let mut line = format!(
            "    {}: {:.0}K IOPS / reference {:.0}K = {:.2}",
            r.name,
            iops / 1e3,
            b.iops / 1e3,
            if b.iops > 0.0 { iops / b.iops } else { 0.0 }
        );
        if let (Some(lat), Some(d)) = (b.lat_mean_ns, r.stat.dirs.iter().find(|d| d.lat.samples > 0)) {
            let _ =
                write!(line, "; lat avg {} / reference {} = {:.2}x", fmt_ns(d.lat.mean), fmt_ns(lat), d.lat.mean / lat);
        }
        let _ = writeln!(out, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lat_scaling_matches_fio_thresholds() {
        let s = Summary { min: 70_000, max: 598_000, mean: 78_350.0, dev: 7_760.0 };
        assert_eq!(scale_lat(s).0, "(usec)");
        let s = Summary { min: 561, max: 15_423_000, mean: 5603.74, dev: 118_798.97 };
        assert_eq!(scale_lat(s).0, "(nsec)");
    }

    #[test]
    fn percentile_rows_wrap_like_fio() {
        let mut h = LatHist::new();
        for v in 1..=10_000u64 {
            h.record(1_700_000 + v * 100);
        }
        let mut out = String::new();
        let list = [1.0, 5.0, 10.0, 20.0, 30.0];
        show_percentiles(&mut out, &h, &list, 2, "clat");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "    clat percentiles (usec):");
        assert!(lines[1].starts_with("     |  1.00th=[ 1711],  5.00th=[ 17"), "{out}");
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[2].starts_with("     | 30.00th=["), "{out}");
    }
}
