//! The runner against engines with known behaviour: fio's iodepth batching, Busy
//! back-pressure, verify (clean, corrupted, fatal), stonewall ordering,
//! group_reporting, loops and fsync. No timing is asserted.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use qpath_bench::engine::{Capabilities, Engine, EngineCtx, EngineFactory, EngineRegistry, FileInfo, Queued};
use qpath_bench::io_u::{Ddir, ForeignBuf, IoBuf, IoResult, IoU};
use qpath_bench::report::Report;
use qpath_bench::run::{RunOptions, RunResult, StatusMode, run_jobs};
use qpath_bench::{JobFile, Result};

/// A RAM disk behind an asynchronous engine: I/O happens at commit.
#[derive(Clone, Default)]
struct Ram {
    store: Arc<Mutex<Vec<u8>>>,
    /// Return Busy when this many units are inside the engine (0 = never).
    capacity: usize,
    /// Flip a byte in every Nth read (0 = never).
    corrupt_every: u64,
    /// "open:<job>" / "close:<job>" in the order they happened.
    log: Arc<Mutex<Vec<String>>>,
    /// Install engine-owned buffers in prepare() and lend them out during I/O.
    own_buffers: bool,
    /// (unit index, its `prepared` time) for every unit queued, in order.
    queued_at: Arc<Mutex<Vec<(u32, Instant)>>>,
}

/// An engine-owned buffer that is moved out while "the device" has it.
struct RamBuf(Option<Vec<u8>>);

impl ForeignBuf for RamBuf {
    fn bytes(&self) -> &[u8] {
        self.0.as_deref().expect("buffer is back before the runner looks")
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().expect("buffer is back before the runner looks")
    }
}

struct RamEngine {
    cfg: Ram,
    job: String,
    queued: Vec<u32>,
    done: VecDeque<u32>,
    reaped: VecDeque<u32>,
    reads: u64,
    busy_seen: u64,
}

impl EngineFactory for Ram {
    fn name(&self) -> &str {
        "ram"
    }
    fn create(&self, ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
        Ok(Box::new(RamEngine {
            cfg: self.clone(),
            job: ctx.job.name.clone(),
            queued: Vec::new(),
            done: VecDeque::new(),
            reaped: VecDeque::new(),
            reads: 0,
            busy_seen: 0,
        }))
    }
}

impl Engine for RamEngine {
    fn name(&self) -> &str {
        "ram"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    fn open(&mut self, ctx: &EngineCtx<'_>) -> Result<FileInfo> {
        self.cfg.log.lock().unwrap().push(format!("open:{}", self.job));
        let mut s = self.cfg.store.lock().unwrap();
        let need = usize::try_from(ctx.needed_size.unwrap()).unwrap();
        if s.len() < need {
            s.resize(need, 0);
        }
        Ok(FileInfo { size: s.len() as u64, block_size: 512 })
    }
    fn prepare(&mut self, units: &mut [IoU]) -> Result<()> {
        if self.cfg.own_buffers {
            for u in units {
                u.buf = IoBuf::foreign(Box::new(RamBuf(Some(vec![0u8; u.buf.len()]))));
            }
        }
        Ok(())
    }
    fn queue(&mut self, unit: &mut IoU) -> Queued {
        let inside = self.queued.len() + self.done.len() + self.reaped.len();
        if self.cfg.capacity > 0 && inside >= self.cfg.capacity {
            self.busy_seen += 1;
            return Queued::Busy;
        }
        self.cfg.queued_at.lock().unwrap().push((unit.index, unit.prepared));
        self.queued.push(unit.index);
        Queued::Queued
    }
    fn commit(&mut self, units: &mut [IoU]) -> Result<()> {
        let mut s = self.cfg.store.lock().unwrap();
        for i in self.queued.drain(..) {
            let u = &mut units[i as usize];
            let off = usize::try_from(u.offset).unwrap();
            let len = u.len as usize;
            // Lend the engine-owned buffer out for the transfer, as a ring would.
            let lent = self.cfg.own_buffers.then(|| u.buf.downcast_mut::<RamBuf>().unwrap().0.take().unwrap());
            if let Some(b) = lent {
                match u.ddir {
                    Ddir::Read => {
                        let mut b = b;
                        b[..len].copy_from_slice(&s[off..off + len]);
                        u.buf.downcast_mut::<RamBuf>().unwrap().0 = Some(b);
                    }
                    _ => {
                        if u.ddir == Ddir::Write {
                            s[off..off + len].copy_from_slice(&b[..len]);
                        }
                        u.buf.downcast_mut::<RamBuf>().unwrap().0 = Some(b);
                    }
                }
                u.result = IoResult::Done { bytes: u.len };
                self.done.push_back(i);
                continue;
            }
            match u.ddir {
                Ddir::Read => {
                    u.data_mut().copy_from_slice(&s[off..off + len]);
                    self.reads += 1;
                    if self.cfg.corrupt_every > 0 && self.reads.is_multiple_of(self.cfg.corrupt_every) {
                        u.data_mut()[len / 2] ^= 0x40;
                    }
                }
                Ddir::Write => s[off..off + len].copy_from_slice(u.data()),
                Ddir::Sync => {}
            }
            u.result = IoResult::Done { bytes: u.len };
            self.done.push_back(i);
        }
        Ok(())
    }
    fn getevents(&mut self, _units: &mut [IoU], min: usize, max: usize, _t: Option<Duration>) -> Result<usize> {
        assert!(min <= max, "getevents(min={min}, max={max})");
        let n = self.done.len().min(max);
        assert!(n >= min, "asked for {min} completions with only {} committed", self.done.len());
        self.reaped.extend(self.done.drain(..n));
        Ok(n)
    }
    fn event(&mut self, _i: usize) -> u32 {
        self.reaped.pop_front().unwrap()
    }
    fn close(&mut self) -> Result<()> {
        assert!(self.queued.is_empty() && self.done.is_empty() && self.reaped.is_empty(), "units left in engine");
        self.cfg.log.lock().unwrap().push(format!("close:{}", self.job));
        Ok(())
    }
}

fn run_with(ram: &Ram, text: &str) -> (JobFile, RunResult) {
    let file = JobFile::parse(text, "scenario").unwrap();
    let mut reg = EngineRegistry::with_local_engines();
    reg.register(Arc::new(ram.clone()));
    let opts = RunOptions { status: StatusMode::Never, ..RunOptions::default() };
    let run = run_jobs(&file, &reg, &opts, &mut std::io::sink()).unwrap();
    (file, run)
}

#[test]
fn batching_follows_iodepth_knobs() {
    let ram = Ram::default();
    let (_, run) = run_with(
        &ram,
        "[j]\nioengine=ram\nrw=randread\nbs=4k\nsize=4m\niodepth=32\niodepth_batch_submit=8\n\
         iodepth_batch_complete_min=4\niodepth_batch_complete_max=16\n",
    );
    let st = &run.jobs[0].outcome.stat;
    assert!(run.jobs[0].outcome.error.is_none());
    assert_eq!(st.dirs[0].total_ios, 1024);
    assert_eq!(st.dirs[0].io_bytes, 4 << 20);
    // Every commit carried exactly 8 units: bucket "8" (5..=8).
    assert_eq!(st.total_submit, 128);
    assert_eq!(st.io_u_submit[2], 128);
    // No reap returned more than 16: buckets 0..=3 only.
    assert_eq!(st.io_u_complete[4..].iter().sum::<u64>(), 0);
    assert_eq!(st.io_u_complete.iter().sum::<u64>(), st.total_complete);
    // The queue was kept deep.
    assert!(st.io_u_map[4] + st.io_u_map[5] > 0);
    // Asynchronous engines get submission latency.
    assert_eq!(st.dirs[0].slat.samples, 1024);
    assert_eq!(st.dirs[0].clat.samples, 1024);
}

#[test]
fn every_unit_reaches_the_engine_stamped_with_the_time_it_was_prepared() {
    // An engine may take `prepared` as its submission time (the qpath engine does): each
    // reuse of a unit must carry the time of that use's preparation, not an older one.
    let ram = Ram::default();
    let (_, run) = run_with(&ram, "[j]\nioengine=ram\nrw=randread\nbs=4k\nsize=256k\niodepth=2\n");
    assert!(run.jobs[0].outcome.error.is_none());
    let log = ram.queued_at.lock().unwrap();
    assert_eq!(log.len(), 64);
    for unit in 0..2 {
        let times: Vec<Instant> = log.iter().filter(|(i, _)| *i == unit).map(|(_, t)| *t).collect();
        assert!(times.len() > 1, "unit {unit} was reused");
        assert!(times.windows(2).all(|w| w[0] < w[1]), "unit {unit}: each use is stamped anew");
    }
}

#[test]
fn busy_engine_loses_nothing() {
    let ram = Ram { capacity: 5, ..Ram::default() };
    let (_, run) = run_with(&ram, "[j]\nioengine=ram\nrw=randrw\nbs=4k\nsize=2m\niodepth=16\n");
    let st = &run.jobs[0].outcome.stat;
    assert!(run.jobs[0].outcome.error.is_none());
    assert_eq!(st.dirs[0].total_ios + st.dirs[1].total_ios, 512);
    assert_eq!(st.dirs[0].io_bytes + st.dirs[1].io_bytes, 2 << 20);
}

#[test]
fn verify_passes_on_a_faithful_device() {
    let ram = Ram::default();
    let (file, run) = run_with(
        &ram,
        "[w]\nioengine=ram\nrw=randwrite\nbs=4k\nsize=1m\niodepth=8\nverify=crc32c\n\
         [rw]\nstonewall\nioengine=ram\nrw=randrw\nbs=4k\nsize=1m\niodepth=8\nverify=crc32c\nnorandommap\n",
    );
    for j in &run.jobs {
        let v = &j.outcome.stat.verify;
        assert_eq!(v.failures, 0, "{}: {:?}", j.spec.name, v.first_failure);
        assert!(j.outcome.error.is_none());
    }
    // The write-only job read every block back after writing.
    let w = &run.jobs[0].outcome.stat;
    assert_eq!(w.verify.checked, 256);
    assert_eq!(w.dirs[0].total_ios, 256);
    let rep = Report::from_run(&file, &run);
    assert!(!rep.failed());
}

#[test]
fn engine_owned_buffers_carry_the_data() {
    let ram = Ram { own_buffers: true, ..Ram::default() };
    let (_, run) = run_with(&ram, "[w]\nioengine=ram\nrw=randwrite\nbs=4k\nsize=1m\niodepth=8\nverify=crc32c\n");
    let out = &run.jobs[0].outcome;
    assert!(out.error.is_none(), "{:?}", out.error);
    assert_eq!((out.stat.verify.checked, out.stat.verify.failures), (256, 0));
}

#[test]
fn verify_catches_corruption_and_reports_it() {
    let ram = Ram { corrupt_every: 10, ..Ram::default() };
    let (file, run) = run_with(&ram, "[w]\nioengine=ram\nrw=write\nbs=4k\nsize=1m\niodepth=4\nverify=crc32c\n");
    let out = &run.jobs[0].outcome;
    assert_eq!(out.stat.verify.checked, 256);
    assert_eq!(out.stat.verify.failures, 25);
    let first = out.stat.verify.first_failure.as_deref().unwrap();
    assert!(first.starts_with("verify: bad crc32c at offset 36864 (length 4096)"), "{first}");
    let err = out.error.as_ref().unwrap();
    assert_eq!(err.errno, 84);
    let rep = Report::from_run(&file, &run);
    assert!(rep.failed());
    let text = qpath_bench::report::text::render(&rep);
    assert!(text.contains("err=84 ("), "{text}");
    assert!(text.contains("checked=256 blocks, failures=25"), "{text}");
    let json = qpath_bench::report::json::render(&rep, false);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["jobs"][0]["error"], 84);
    assert_eq!(v["qpath"]["jobs"][0]["verify"]["failures"], 25);
}

#[test]
fn verify_fatal_stops_at_the_first_failure() {
    let ram = Ram { corrupt_every: 10, ..Ram::default() };
    let (_, run) =
        run_with(&ram, "[w]\nioengine=ram\nrw=write\nbs=4k\nsize=1m\niodepth=1\nverify=crc32c\nverify_fatal=1\n");
    let out = &run.jobs[0].outcome;
    assert_eq!(out.stat.verify.failures, 1);
    assert!(out.stat.verify.checked < 256);
    assert_eq!(out.error.as_ref().unwrap().errno, 84);
}

#[test]
fn stonewall_runs_batches_in_order() {
    let ram = Ram::default();
    let (_, run) = run_with(
        &ram,
        "[global]\nioengine=ram\nbs=4k\nsize=256k\n[a]\nrw=write\nnumjobs=2\n[b]\nstonewall\nrw=read\n[c]\nrw=read\n",
    );
    assert_eq!(run.jobs.len(), 4);
    let log = ram.log.lock().unwrap().clone();
    let last_a_close = log.iter().rposition(|e| e == "close:a").unwrap();
    let first_b_open = log.iter().position(|e| e == "open:b").unwrap();
    let first_c_open = log.iter().position(|e| e == "open:c").unwrap();
    assert!(last_a_close < first_b_open, "{log:?}");
    assert!(last_a_close < first_c_open, "{log:?}");
}

#[test]
fn group_reporting_merges_clones() {
    let ram = Ram::default();
    let (file, run) = run_with(
        &ram,
        "[global]\nioengine=ram\nbs=4k\nsize=256k\ngroup_reporting\n[a]\nrw=randread\nnumjobs=3\n\
         [b]\nnew_group\nrw=read\n",
    );
    let rep = Report::from_run(&file, &run);
    assert_eq!(rep.jobs.len(), 2);
    assert_eq!(rep.jobs[0].members, 3);
    assert_eq!(rep.jobs[0].stat.dirs[0].total_ios, 3 * 64);
    assert_eq!(rep.jobs[0].stat.dirs[0].clat.samples, 3 * 64);
    assert_eq!(rep.groups.len(), 2);
    assert_eq!(rep.groups[0].io_bytes[0], 3 * (256 << 10));
    let text = qpath_bench::report::text::render(&rep);
    assert!(text.contains("a: (groupid=0, jobs=3)"), "{text}");
    assert!(text.contains("Run status group 1 (all jobs)"), "{text}");
}

#[test]
fn loops_repeat_the_pass() {
    let ram = Ram::default();
    let (_, run) = run_with(&ram, "[j]\nioengine=ram\nrw=randread\nbs=4k\nsize=256k\nloops=3\n");
    assert_eq!(run.jobs[0].outcome.stat.dirs[0].total_ios, 3 * 64);
}

#[test]
fn fsync_every_n_writes_on_psync() {
    let dir = std::env::temp_dir().join(format!("qpath-bench-fsync-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = format!("[j]\nfilename={}\nrw=write\nbs=4k\nsize=256k\nfsync=16\n", dir.join("f").display());
    let (file, run) = run_with(&Ram::default(), &text);
    let st = &run.jobs[0].outcome.stat;
    assert_eq!(st.dirs[1].total_ios, 64);
    assert_eq!(st.sync_total, 3, "a flush after writes 16, 32 and 48 (the pass ends at 64)");
    assert_eq!(st.sync.samples, 3);
    let rep = Report::from_run(&file, &run);
    let text = qpath_bench::report::text::render(&rep);
    assert!(text.contains("  fsync/fdatasync/sync_file_range:\n    sync ("), "{text}");
    assert!(text.contains("issued rwts: total=0,64,0,3"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn psync_write_then_read_verify_of_a_file() {
    let dir = std::env::temp_dir().join(format!("qpath-bench-rv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("data");
    let _ = std::fs::remove_file(&f);
    let text = format!(
        "[global]\nfilename={}\nbs=4k\nsize=512k\nverify=crc32c\n[w]\nrw=write\ndo_verify=0\n\
         [r]\nstonewall\nrw=randread\n",
        f.display()
    );
    let (_, run) = run_with(&Ram::default(), &text);
    assert_eq!(run.jobs[0].outcome.stat.verify.checked, 0, "do_verify=0 skips the read-back");
    let r = &run.jobs[1].outcome.stat.verify;
    assert_eq!((r.checked, r.failures), (128, 0));
    // A read-only verify job over data that was never written with headers fails.
    let g = dir.join("garbage");
    std::fs::write(&g, vec![7u8; 64 << 10]).unwrap();
    let text = format!("[r]\nfilename={}\nbs=4k\nsize=64k\nrw=read\nverify=crc32c\n", g.display());
    let (_, run) = run_with(&Ram::default(), &text);
    let v = &run.jobs[0].outcome.stat.verify;
    assert_eq!(v.failures, 16);
    assert!(v.first_failure.as_deref().unwrap().contains("bad magic header 0x0707"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn writefua_on_an_engine_that_cannot_send_fua_is_a_job_error_not_a_silent_plain_write() {
    let (_, run) = run_with(&Ram::default(), "[j]\nioengine=ram\nrw=write\nbs=4k\nsize=64k\nwritefua=1\n");
    let e = run.jobs[0].outcome.error.as_ref().expect("refused");
    assert!(e.message.contains("writefua=1: the ram engine cannot send a write with FUA"), "{}", e.message);
    assert_eq!(run.jobs[0].outcome.stat.dirs[1].total_ios, 0, "nothing written");
}

#[test]
fn missing_directory_is_reported_before_start() {
    let text = "[a]\nfilename=/nonexistent-dir/x\nrw=write\nsize=64k\n";
    let file = JobFile::parse(text, "t").unwrap();
    let reg = EngineRegistry::with_local_engines();
    let opts = RunOptions { status: StatusMode::Never, ..RunOptions::default() };
    let e = run_jobs(&file, &reg, &opts, &mut std::io::sink()).unwrap_err();
    assert!(e.context.contains("/nonexistent-dir does not exist"), "{e}");
}

#[test]
fn engine_setup_errors_become_job_errors() {
    // The null engine cannot size a target without size=; the other job still runs.
    let (file, run) =
        run_with(&Ram::default(), "[bad]\nioengine=null\nrw=read\n[good]\nioengine=null\nrw=read\nsize=64k\n");
    let bad = run.jobs[0].outcome.error.as_ref().expect("setup error");
    assert!(bad.message.contains("needs size="), "{}", bad.message);
    assert!(run.jobs[1].outcome.error.is_none());
    assert_eq!(run.jobs[1].outcome.stat.dirs[0].total_ios, 16);
    assert!(run.failed());
    assert!(Report::from_run(&file, &run).failed());
}

#[test]
fn cpus_allowed_goes_through_the_pin_hook() {
    let file = JobFile::parse(
        "[j]\nioengine=null\nrw=read\nsize=64k\ncpus_allowed=0-1\ncpus_allowed_policy=split\nnumjobs=2\n",
        "t",
    )
    .unwrap();
    let seen: Arc<Mutex<Vec<Vec<usize>>>> = Arc::default();
    let rec = seen.clone();
    let opts = RunOptions {
        status: StatusMode::Never,
        pin: Some(Arc::new(move |cpus: &[usize]| {
            rec.lock().unwrap().push(cpus.to_vec());
            Ok(())
        })),
        ..RunOptions::default()
    };
    let run = run_jobs(&file, &EngineRegistry::with_local_engines(), &opts, &mut std::io::sink()).unwrap();
    assert!(!run.failed());
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, vec![vec![0], vec![1]]);
    // A failing hook fails the job, with the CPUs in the message.
    let opts = RunOptions {
        status: StatusMode::Never,
        pin: Some(Arc::new(|_: &[usize]| Err(std::io::Error::other("no such cpu")))),
        ..RunOptions::default()
    };
    let run = run_jobs(&file, &EngineRegistry::with_local_engines(), &opts, &mut std::io::sink()).unwrap();
    let e = run.jobs[0].outcome.error.as_ref().unwrap();
    assert!(e.message.contains("pin to CPUs [0]") && e.message.contains("no such cpu"), "{}", e.message);
}
