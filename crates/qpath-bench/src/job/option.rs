//! The fio options qpath understands, their aliases, and how each one changes a
//! [`JobSpec`]. Anything not listed here is an *unknown option*: reported, never
//! silently dropped.

use std::time::Duration;

use super::value::{
    CpuSet, parse_bool, parse_percentiles, parse_range, parse_size, parse_time, parse_uint, split_per_ddir,
};
use super::{CpuPolicy, JobSpec, RwDirs, RwPattern, VerifyKind};

/// Deepest queue a job may ask for (fio's limit for `iodepth` is 65535 too).
pub const IODEPTH_MAX: u64 = 65535;
/// Most clones per job section.
pub const NUMJOBS_MAX: u64 = 1024;
/// Largest block size (fio caps bs at 2 GiB; we cap at 128 MiB since buffers are per slot).
pub const BS_MAX: u64 = 128 << 20;
/// Most passes for `loops`.
pub const LOOPS_MAX: u64 = 1 << 20;

/// What applying one option did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The option changed the job.
    Set,
    /// A known fio option accepted for compatibility that has no effect here; the text says why.
    NoEffect(&'static str),
    /// An engine-specific option kept in [`JobSpec::engine_options`] for the engine to read.
    Engine,
}

/// `(canonical name, aliases)`; the canonical name is what fio prints in JSON `job options`.
const NAMES: &[(&str, &[&str])] = &[
    ("name", &[]),
    ("description", &[]),
    ("ioengine", &[]),
    ("rw", &["readwrite"]),
    ("rwmixread", &[]),
    ("rwmixwrite", &[]),
    ("bs", &["blocksize"]),
    ("bsrange", &["blocksize_range"]),
    ("iodepth", &[]),
    ("iodepth_batch", &["iodepth_batch_submit"]),
    ("iodepth_batch_complete_min", &["iodepth_batch_complete"]),
    ("iodepth_batch_complete_max", &[]),
    ("numjobs", &[]),
    ("runtime", &["timeout"]),
    ("time_based", &[]),
    ("ramp_time", &[]),
    ("size", &[]),
    ("filesize", &[]),
    ("offset", &["fileoffset"]),
    ("direct", &[]),
    ("buffered", &[]),
    ("filename", &[]),
    ("directory", &[]),
    ("cpus_allowed", &[]),
    ("cpus_allowed_policy", &[]),
    ("group_reporting", &[]),
    ("randrepeat", &[]),
    ("randseed", &[]),
    ("norandommap", &[]),
    ("thread", &[]),
    ("verify", &[]),
    ("do_verify", &[]),
    ("verify_fatal", &[]),
    ("lat_percentiles", &[]),
    ("clat_percentiles", &[]),
    ("slat_percentiles", &[]),
    ("percentile_list", &[]),
    ("stonewall", &["wait_for_previous"]),
    ("new_group", &[]),
    ("loops", &[]),
    ("invalidate", &[]),
    ("fsync", &[]),
    ("zero_buffers", &[]),
    ("refill_buffers", &[]),
    ("kb_base", &[]),
    ("significant_figures", &[]),
    ("unit_base", &[]),
    // accepted without effect
    ("ioscheduler", &[]),
    ("disk_util", &[]),
    ("clocksource", &[]),
    ("fallocate", &[]),
    ("end_fsync", &[]),
    ("create_serialize", &[]),
    ("allow_mounted_write", &[]),
    ("random_generator", &[]),
    ("scramble_buffers", &[]),
    ("exitall", &[]),
    ("overwrite", &[]),
    // engine options (fio io_uring / io_uring_cmd / SPDK plugin)
    ("hipri", &[]),
    ("fixedbufs", &[]),
    ("registerfiles", &[]),
    ("sqthread_poll", &[]),
    ("sqthread_poll_cpu", &[]),
    ("nonvectored", &[]),
    ("cmd_type", &[]),
    ("nowait", &[]),
    ("force_async", &[]),
    ("hostnqn", &[]),
    ("digest_enable", &[]),
    ("enable_sgl", &[]),
    // fio's sg engine: writes with Force Unit Access (the qpath engines send NVMe FUA)
    ("writefua", &[]),
    // multipath, read by the qpath engine (crate::engine::mpath)
    ("mpath_policy", &["iopolicy"]),
    ("rr_min_io", &[]),
    ("mpath_ref_queues", &[]),
    ("paths", &[]),
    // remote targets: how long I/O waits for a lost controller (crate::engine::remote)
    ("fast_io_fail_tmo", &[]),
];

/// The canonical name of `key`, or `None` if qpath does not know the option.
pub fn canonical(key: &str) -> Option<&'static str> {
    NAMES.iter().find(|(name, aliases)| *name == key || aliases.contains(&key)).map(|(name, _)| *name)
}

/// fio's option priority (`.prio` in options.c): higher is parsed first.
pub fn prio(canonical_name: &str) -> i32 {
    match canonical_name {
        "kb_base" | "unit_base" | "cpus_allowed_policy" => 1,
        "filename" => -1,
        _ => 0,
    }
}

fn need(value: Option<&str>) -> Result<&str, String> {
    match value {
        Some(v) if !v.trim().is_empty() => Ok(v.trim()),
        _ => Err("needs a value".into()),
    }
}

fn secs() -> Duration {
    Duration::from_secs(1)
}

/// Apply one option (already canonical) to `spec`.
pub fn apply(spec: &mut JobSpec, name: &str, value: Option<&str>) -> Result<Applied, String> {
    let kb = spec.kb_base;
    match name {
        "name" => spec.name = need(value)?.to_string(),
        "description" => spec.description = Some(need(value)?.to_string()),
        "ioengine" => spec.ioengine = Some(need(value)?.to_string()),
        "rw" => {
            let (pattern, dirs) = parse_rw(need(value)?)?;
            spec.rw_pattern = pattern;
            spec.rw_dirs = dirs;
        }
        "rwmixread" => {
            let v = parse_uint(need(value)?, 100)?;
            let v = u32::try_from(v).map_err(|e| e.to_string())?;
            spec.rwmix_read = v;
        }
        "rwmixwrite" => {
            let v = parse_uint(need(value)?, 100)?;
            let v = u32::try_from(v).map_err(|e| e.to_string())?;
            spec.rwmix_read = 100 - v;
        }
        "bs" => {
            let v = need(value)?;
            let parts = split_per_ddir(v);
            for (ddir, part) in parts.iter().enumerate() {
                if let Some(p) = part {
                    let b = parse_bs(p, kb)?;
                    spec.bs[ddir] = (b, b);
                }
            }
        }
        "bsrange" => {
            let v = need(value)?;
            for (ddir, part) in split_per_ddir(v).iter().enumerate() {
                if let Some(p) = part {
                    let (lo, hi) = parse_range(p, kb)?;
                    check_bs(lo)?;
                    check_bs(hi)?;
                    spec.bs[ddir] = (lo, hi);
                }
            }
        }
        "iodepth" => spec.iodepth = int_in(value, 1, IODEPTH_MAX)?,
        "iodepth_batch" => spec.iodepth_batch_submit = int_in(value, 0, IODEPTH_MAX)?,
        "iodepth_batch_complete_min" => spec.iodepth_batch_complete_min = int_in(value, 0, IODEPTH_MAX)?,
        "iodepth_batch_complete_max" => spec.iodepth_batch_complete_max = int_in(value, 0, IODEPTH_MAX)?,
        "numjobs" => spec.numjobs = int_in(value, 1, NUMJOBS_MAX)?,
        "runtime" => {
            let t = parse_time(need(value)?, secs())?;
            spec.runtime = (!t.is_zero()).then_some(t);
        }
        "time_based" => spec.time_based = parse_bool(value)?,
        "ramp_time" => spec.ramp_time = parse_time(need(value)?, secs())?,
        "size" => spec.size = Some(parse_size(need(value)?, kb)?).filter(|s| *s > 0),
        "filesize" => {
            let (lo, hi) = parse_range(need(value)?, kb)?;
            if lo != hi {
                return Err("filesize ranges are not supported; give one size".into());
            }
            spec.filesize = Some(lo).filter(|s| *s > 0);
        }
        "offset" => spec.offset = parse_size(need(value)?, kb)?,
        "direct" => spec.direct = parse_bool(value)?,
        "buffered" => spec.direct = !parse_bool(value)?,
        "filename" => spec.filename = Some(need(value)?.to_string()),
        "directory" => spec.directory = Some(need(value)?.to_string()),
        "cpus_allowed" => spec.cpus_allowed = Some(CpuSet::parse(need(value)?)?),
        "cpus_allowed_policy" => {
            spec.cpus_allowed_policy = match need(value)? {
                "shared" => CpuPolicy::Shared,
                "split" => CpuPolicy::Split,
                other => return Err(format!("'{other}' is not shared or split")),
            }
        }
        "group_reporting" => spec.group_reporting = parse_bool(value)?,
        "randrepeat" => spec.randrepeat = parse_bool(value)?,
        "randseed" => spec.randseed = parse_uint(need(value)?, u64::MAX)?,
        "norandommap" => spec.norandommap = parse_bool(value)?,
        "thread" => {
            spec.thread = parse_bool(value)?;
            return Ok(Applied::NoEffect("qpath always runs jobs as threads"));
        }
        "verify" => spec.verify = parse_verify(need(value)?)?,
        "do_verify" => spec.do_verify = parse_bool(value)?,
        "verify_fatal" => spec.verify_fatal = parse_bool(value)?,
        "lat_percentiles" => spec.lat_percentiles = parse_bool(value)?,
        "clat_percentiles" => spec.clat_percentiles = parse_bool(value)?,
        "slat_percentiles" => spec.slat_percentiles = parse_bool(value)?,
        "percentile_list" => {
            let (list, precision) = parse_percentiles(need(value)?)?;
            spec.percentile_list = list;
            spec.percentile_precision = precision;
        }
        "stonewall" => spec.stonewall = parse_bool(value)?,
        "new_group" => spec.new_group = parse_bool(value)?,
        "loops" => spec.loops = int_in(value, 1, LOOPS_MAX)?,
        "invalidate" => spec.invalidate = parse_bool(value)?,
        "fsync" => spec.fsync_every = int_in(value, 0, u64::from(u32::MAX))?,
        "zero_buffers" => spec.zero_buffers = parse_bool(value)?,
        "refill_buffers" => spec.refill_buffers = parse_bool(value)?,
        "kb_base" => {
            spec.kb_base = match need(value)? {
                "1024" => 1024,
                "1000" => 1000,
                other => return Err(format!("kb_base must be 1024 or 1000, not {other}")),
            }
        }
        "significant_figures" => spec.sig_figs = int_in(value, 1, 10)?,
        "unit_base" => match need(value)? {
            "0" | "8" => {}
            _ => return Err("only unit_base=0 or 8 (bytes) is supported".into()),
        },
        "ioscheduler" => return Ok(Applied::NoEffect("qpath does not change the I/O scheduler")),
        "disk_util" => return Ok(Applied::NoEffect("disk stats are not reported")),
        "clocksource" => return Ok(Applied::NoEffect("qpath always uses the monotonic clock")),
        "fallocate" => return Ok(Applied::NoEffect("files are laid out by writing or extending")),
        "end_fsync" => return Ok(Applied::NoEffect("not implemented; use fsync=N")),
        "create_serialize" => return Ok(Applied::NoEffect("files are laid out before jobs start")),
        "allow_mounted_write" => return Ok(Applied::NoEffect("no mount check is done")),
        "random_generator" => return Ok(Applied::NoEffect("qpath uses a xoshiro generator and a Feistel permutation")),
        "scramble_buffers" => return Ok(Applied::NoEffect("buffers are random unless zero_buffers")),
        "exitall" => return Ok(Applied::NoEffect("jobs always run to their own end")),
        "overwrite" => return Ok(Applied::NoEffect("files are always laid out before reads")),
        "hipri" | "fixedbufs" | "registerfiles" | "sqthread_poll" | "sqthread_poll_cpu" | "nonvectored"
        | "cmd_type" | "nowait" | "force_async" | "hostnqn" | "digest_enable" | "enable_sgl" => {
            spec.engine_options.push((name.to_string(), value.map(str::to_string)));
            return Ok(Applied::Engine);
        }
        "writefua" => {
            parse_bool(value)?;
            spec.engine_options.push((name.to_string(), value.map(str::to_string)));
            return Ok(Applied::Engine);
        }
        "mpath_policy" | "rr_min_io" | "mpath_ref_queues" | "paths" => {
            crate::engine::mpath::check_option(name, value)?;
            spec.engine_options.push((name.to_string(), value.map(str::to_string)));
            return Ok(Applied::Engine);
        }
        "fast_io_fail_tmo" => {
            crate::engine::remote::check_fast_io_fail_tmo(value)?;
            spec.engine_options.push((name.to_string(), value.map(str::to_string)));
            return Ok(Applied::Engine);
        }
        other => return Err(format!("internal: option '{other}' is in the table but not handled")),
    }
    Ok(Applied::Set)
}

fn int_in(value: Option<&str>, lo: u64, hi: u64) -> Result<u32, String> {
    let v = parse_uint(need(value)?, hi)?;
    if v < lo {
        return Err(format!("must be at least {lo}"));
    }
    u32::try_from(v).map_err(|_| format!("must be at most {}", u32::MAX))
}

fn check_bs(b: u64) -> Result<(), String> {
    if b == 0 || b > BS_MAX {
        return Err(format!("block size {b} must be in 1..={BS_MAX}"));
    }
    Ok(())
}

fn parse_bs(text: &str, kb: u32) -> Result<u64, String> {
    if text.contains(':') || text.contains('/') {
        return Err("bssplit-style block sizes are not supported".into());
    }
    let b = parse_size(text, kb)?;
    check_bs(b)?;
    Ok(b)
}

/// Parse `rw=`: `read`, `write`, `randread`, `randwrite`, `rw`/`readwrite`, `randrw`.
pub fn parse_rw(text: &str) -> Result<(RwPattern, RwDirs), String> {
    if let Some((base, n)) = text.split_once(':') {
        return Err(format!(
            "'{text}': the ':{n}' suffix of rw={base} (fio's sequential skip / random \
             sequencer) is not supported; remove it"
        ));
    }
    Ok(match text {
        "read" => (RwPattern::Sequential, RwDirs::Read),
        "write" => (RwPattern::Sequential, RwDirs::Write),
        "rw" | "readwrite" => (RwPattern::Sequential, RwDirs::Mixed),
        "randread" => (RwPattern::Random, RwDirs::Read),
        "randwrite" => (RwPattern::Random, RwDirs::Write),
        "randrw" => (RwPattern::Random, RwDirs::Mixed),
        "trim" | "randtrim" | "trimwrite" | "randtrimwrite" => {
            return Err(format!("rw={text}: trim workloads are not supported"));
        }
        other => return Err(format!("'{other}' is not a fio rw mode")),
    })
}

fn parse_verify(text: &str) -> Result<VerifyKind, String> {
    match text {
        "0" | "none" | "null" => Ok(VerifyKind::None),
        "crc32c" | "crc32c-intel" | "crc32c-arm64" => Ok(VerifyKind::Crc32c),
        "md5" | "crc64" | "crc32" | "crc16" | "crc7" | "sha1" | "sha256" | "sha512" | "sha3-224" | "sha3-256"
        | "sha3-384" | "sha3-512" | "xxhash" | "meta" | "pattern" => {
            Err(format!("verify={text} is not supported; qpath implements verify=crc32c only"))
        }
        other => Err(format!("'{other}' is not a fio verify method")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_resolve_to_fio_canonical_names() {
        assert_eq!(canonical("readwrite"), Some("rw"));
        assert_eq!(canonical("blocksize"), Some("bs"));
        assert_eq!(canonical("timeout"), Some("runtime"));
        assert_eq!(canonical("iodepth_batch_submit"), Some("iodepth_batch"));
        assert_eq!(canonical("iodepth_batch_complete"), Some("iodepth_batch_complete_min"));
        assert_eq!(canonical("no_such_option"), None);
    }

    #[test]
    fn rw_suffix_is_rejected_clearly() {
        let e = parse_rw("randread:8").unwrap_err();
        assert!(e.contains("':8' suffix"), "{e}");
        assert!(parse_rw("trim").unwrap_err().contains("trim"));
    }

    #[test]
    fn verify_methods() {
        assert_eq!(parse_verify("crc32c"), Ok(VerifyKind::Crc32c));
        assert!(parse_verify("md5").unwrap_err().contains("crc32c only"));
    }

    #[test]
    fn writefua_takes_fio_booleans_and_refuses_anything_else() {
        let job = |text: &str| crate::job::JobFile::parse(&format!("[j]\nsize=1m\n{text}\n"), "t").map(|f| f.jobs);
        for (text, want) in [("writefua=1", true), ("writefua", true), ("writefua=0", false), ("", false)] {
            assert_eq!(crate::engine::writefua(&job(text).unwrap()[0]), want, "{text}");
        }
        let e = job("writefua=sometimes").unwrap_err();
        assert!(e.to_string().contains("'sometimes' is not a boolean"), "{e}");
    }

    #[test]
    fn every_table_entry_is_handled() {
        for (name, _) in NAMES {
            let mut spec = JobSpec::default();
            let r = apply(&mut spec, name, Some("1"));
            if let Err(e) = r {
                assert!(!e.starts_with("internal"), "{name}: {e}");
            }
        }
    }
}
