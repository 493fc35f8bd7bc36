//! Multipath for the `qpath` engine: which job options choose the path policy, the
//! heads shared by a run's job threads, and the per-path counts that go into reports.
//!
//! ```text
//!  filename=nvme+tcp://A:4420,B:4421/nqn/1      (or no filename and paths=2: the embedded target's two ports)
//!  mpath_policy=queue-depth                       numa | round-robin | queue-depth | latency
//!                                                 | ref-sum-queues | ref-shared-atomic (seed 000)
//!        │
//!  job thread k: Controllers::get(A), get(B) ──► Heads::get ──► Arc<Head> (one per paths × nsid × policy)
//!                                                    └─► Context::open_head: a queue of A's and of B's
//!  end of ramp, end of job: Engine::multipath ──► MultipathStats (ios, bytes per path) ──► report
//! ```
//!
//! Job options (all engine options, read only by the `qpath` engine):
//!
//! | option | values | default |
//! | --- | --- | --- |
//! | `mpath_policy` | `numa`, `round-robin`, `queue-depth`, `latency`, `ref-sum-queues` (alias `queue-depth-ewan`), `ref-shared-atomic` (alias `queue-depth-atomic`) | `numa` (Linux's default iopolicy) |
//! | `rr_min_io` | I/Os per path before round-robin moves on, 1..=65535 | 1 (Linux's `round-robin`) |
//! | `mpath_ref_queues` | hardware queues per path that `ref-sum-queues` sums over, 1..=1024 | 64 (seed 000's target) |
//! | `paths` | with the embedded target: how many of its ports to use, 1 or 2 | 1 |
//!
//! The two `ref-*` values are seed 000's reference selectors ([`host::mpath::reference`]),
//! built only with the `lab-baselines` feature (the `lab` crate turns it on, so the `qpath`
//! binary has them; a build without it refuses them, saying so):
//! the kernel patch's queue-depth path selector that sums every hardware queue's
//! in-flight count of every path at each I/O, and the fix that keeps one shared atomic
//! per path. They are shared by every job thread on the head, as the kernel's counters
//! are shared by every CPU. They scan the paths' classes from when the head was made
//! and do not follow later path changes: for measuring selection cost, not failover.
//!
//! A job uses a head when its filename names more than one path or it sets
//! `mpath_policy`; job threads with the same paths, namespace and policy share one
//! head (their selectors stay per thread: [`host::mpath::Selector`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use host::controller::Controller;
use host::head::Head;
#[cfg(feature = "lab-baselines")]
use host::head::ReferenceSelector;
use host::mpath::Policy;
#[cfg(feature = "lab-baselines")]
use host::mpath::reference::{SharedAtomic, SumPerQueue};
use nvme::Nsid;

use crate::error::{Error, ErrorKind, Result};
use crate::job::JobSpec;

use super::remote::ControllerKey;

/// Hardware queues per path summed by `ref-sum-queues` unless `mpath_ref_queues` says
/// otherwise: seed 000's in-kernel target gave the host 64 I/O queues.
pub const REF_QUEUES_DEFAULT: usize = 64;
/// Most hardware queues per path `mpath_ref_queues` may ask for.
pub const REF_QUEUES_MAX: usize = 1024;
/// Ports of the embedded target (`paths=` at most this).
pub const EMBEDDED_PATHS_MAX: usize = 2;

/// The job options this module reads.
pub const OPTIONS: [&str; 4] = ["mpath_policy", "rr_min_io", "mpath_ref_queues", "paths"];

/// How a multipath job picks paths: one of the host's policies, or one of seed 000's
/// reference selectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyChoice {
    /// A [`host::mpath::Policy`], per thread.
    Policy(Policy),
    /// Seed 000's first queue-depth selector: per-queue counters summed over `queues`
    /// hardware queues of every path at each selection.
    #[cfg(feature = "lab-baselines")]
    RefSumQueues {
        /// Hardware queues per path.
        queues: usize,
    },
    /// Seed 000's fix: one shared atomic in-flight counter per path.
    #[cfg(feature = "lab-baselines")]
    RefSharedAtomic,
}

impl PolicyChoice {
    /// Linux's default iopolicy.
    pub const DEFAULT: PolicyChoice = PolicyChoice::Policy(Policy::Numa);

    /// Parses `mpath_policy` with its companions `rr_min_io` and `mpath_ref_queues`.
    pub fn parse(policy: &str, rr_min_io: Option<&str>, ref_queues: Option<&str>) -> Result<PolicyChoice, String> {
        let choice = match policy.trim().to_ascii_lowercase().as_str() {
            "numa" => PolicyChoice::Policy(Policy::Numa),
            "round-robin" | "round_robin" | "rr" => {
                let rr_min_io = match rr_min_io {
                    Some(v) => parse_in("rr_min_io", v, 1, 65_535)?,
                    None => 1,
                };
                PolicyChoice::Policy(Policy::RoundRobin { rr_min_io: u32::try_from(rr_min_io).unwrap_or(1) })
            }
            "queue-depth" | "queue_depth" => PolicyChoice::Policy(Policy::QueueDepth),
            "latency" => PolicyChoice::Policy(Policy::LATENCY),
            #[cfg(feature = "lab-baselines")]
            "ref-sum-queues" | "queue-depth-ewan" => {
                let queues = match ref_queues {
                    Some(v) => parse_in("mpath_ref_queues", v, 1, REF_QUEUES_MAX as u64)?,
                    None => REF_QUEUES_DEFAULT as u64,
                };
                PolicyChoice::RefSumQueues { queues: usize::try_from(queues).unwrap_or(REF_QUEUES_DEFAULT) }
            }
            #[cfg(feature = "lab-baselines")]
            "ref-shared-atomic" | "queue-depth-atomic" => PolicyChoice::RefSharedAtomic,
            #[cfg(not(feature = "lab-baselines"))]
            name @ ("ref-sum-queues" | "queue-depth-ewan" | "ref-shared-atomic" | "queue-depth-atomic") => {
                return Err(format!(
                    "mpath_policy={name}: seed 000's reference selectors are not in this build \
                     (they come with the lab-baselines feature, which qpath lab needs)"
                ));
            }
            other => {
                return Err(format!(
                    "mpath_policy={other}: expected numa, round-robin, queue-depth, latency, \
                     ref-sum-queues or ref-shared-atomic"
                ));
            }
        };
        if rr_min_io.is_some() && !matches!(choice, PolicyChoice::Policy(Policy::RoundRobin { .. })) {
            return Err("rr_min_io applies to mpath_policy=round-robin only".into());
        }
        if ref_queues.is_some() && !choice.sums_queues() {
            return Err("mpath_ref_queues applies to mpath_policy=ref-sum-queues only".into());
        }
        Ok(choice)
    }

    /// The name reports show (the `mpath_policy` value, with its parameter if not the default).
    pub fn name(&self) -> String {
        match self {
            PolicyChoice::Policy(Policy::Numa) => "numa".into(),
            PolicyChoice::Policy(Policy::RoundRobin { rr_min_io: 1 }) => "round-robin".into(),
            PolicyChoice::Policy(Policy::RoundRobin { rr_min_io }) => format!("round-robin(rr_min_io={rr_min_io})"),
            PolicyChoice::Policy(Policy::QueueDepth) => "queue-depth".into(),
            PolicyChoice::Policy(Policy::Latency(p)) if *p == host::mpath::LatencyParams::DEFAULT => "latency".into(),
            PolicyChoice::Policy(Policy::Latency(p)) => format!("latency({p:?})"),
            #[cfg(feature = "lab-baselines")]
            PolicyChoice::RefSumQueues { queues } if *queues == REF_QUEUES_DEFAULT => "ref-sum-queues".into(),
            #[cfg(feature = "lab-baselines")]
            PolicyChoice::RefSumQueues { queues } => format!("ref-sum-queues(mpath_ref_queues={queues})"),
            #[cfg(feature = "lab-baselines")]
            PolicyChoice::RefSharedAtomic => "ref-shared-atomic".into(),
        }
    }

    /// The host policy a head runs (a reference selector's head keeps queue-depth
    /// counting underneath, so switching back is exact).
    fn policy(&self) -> Policy {
        match self {
            PolicyChoice::Policy(p) => *p,
            #[cfg(feature = "lab-baselines")]
            PolicyChoice::RefSumQueues { .. } | PolicyChoice::RefSharedAtomic => Policy::QueueDepth,
        }
    }

    /// Whether this is `ref-sum-queues` (the one choice `mpath_ref_queues` applies to).
    fn sums_queues(&self) -> bool {
        match self {
            #[cfg(feature = "lab-baselines")]
            PolicyChoice::RefSumQueues { .. } => true,
            _ => false,
        }
    }
}

fn parse_in(what: &str, v: &str, lo: u64, hi: u64) -> Result<u64, String> {
    match v.trim().parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("{what}={v}: expected a whole number in {lo}..={hi}")),
    }
}

/// The policy `job` asks for (`None`: it sets no `mpath_policy`).
pub fn policy_of(job: &JobSpec) -> Result<Option<PolicyChoice>> {
    let opt = |k: &str| job.engine_option(k).flatten();
    let Some(p) = opt("mpath_policy") else {
        if opt("rr_min_io").is_some() || opt("mpath_ref_queues").is_some() {
            return Err(Error::new(ErrorKind::Option, "rr_min_io and mpath_ref_queues need an mpath_policy"));
        }
        return Ok(None);
    };
    PolicyChoice::parse(p, opt("rr_min_io"), opt("mpath_ref_queues"))
        .map(Some)
        .map_err(|why| Error::new(ErrorKind::Option, why))
}

/// The `paths=` of `job` (`None`: not set).
pub fn paths_of(job: &JobSpec) -> Result<Option<usize>> {
    match job.engine_option("paths") {
        None => Ok(None),
        Some(v) => {
            let v = v.unwrap_or("");
            let n = parse_in("paths", v, 1, super::super::filename::PATHS_MAX as u64)
                .map_err(|why| Error::new(ErrorKind::Option, why))?;
            Ok(Some(usize::try_from(n).unwrap_or(1)))
        }
    }
}

/// Checks the value of one of [`OPTIONS`] when the job file is parsed (the companions
/// are checked together with `mpath_policy` when the engine opens).
pub fn check_option(name: &str, value: Option<&str>) -> Result<(), String> {
    let v = value.unwrap_or("");
    match name {
        "mpath_policy" => PolicyChoice::parse(v, None, None).map(|_| ()),
        "rr_min_io" => parse_in(name, v, 1, 65_535).map(|_| ()),
        "mpath_ref_queues" => parse_in(name, v, 1, REF_QUEUES_MAX as u64).map(|_| ()),
        "paths" => parse_in(name, v, 1, super::super::filename::PATHS_MAX as u64).map(|_| ()),
        _ => Ok(()),
    }
}

type HeadKey = (Vec<ControllerKey>, u32, String);

/// The multipath heads of one run: one per (paths, namespace, policy), shared by the
/// job threads that name them, as Linux has one head per namespace for every CPU.
#[derive(Default)]
pub struct Heads {
    heads: Mutex<BTreeMap<HeadKey, Arc<Head>>>,
}

impl std::fmt::Debug for Heads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.heads.lock().map_or(0, |h| h.len());
        f.debug_struct("Heads").field("heads", &n).finish()
    }
}

impl Heads {
    /// The head over `ctrls` (one per path, `keys` naming them in the same order) for
    /// namespace `nsid` under `choice`, made by the first job thread that asks.
    ///
    /// Every path must reach the same namespace: same NGUID (or EUI-64, UUID) through
    /// every controller (NVMe 2.0 §4.7: a namespace's unique id is the same on every
    /// controller of the subsystem; Linux groups paths into a head by it too).
    pub fn get(
        &self,
        keys: &[ControllerKey],
        ctrls: &[Arc<Controller>],
        nsid: u32,
        choice: &PolicyChoice,
    ) -> Result<Arc<Head>> {
        assert_eq!(keys.len(), ctrls.len(), "one controller key per path");
        let key = (keys.to_vec(), nsid, choice.name());
        let mut heads = self.heads.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(h) = heads.get(&key) {
            return Ok(Arc::clone(h));
        }
        let mut uid = None;
        for (k, c) in keys.iter().zip(ctrls) {
            let ns = c.namespace(Nsid(nsid)).ok_or_else(|| {
                Error::new(ErrorKind::Engine, format!("qpath: {} has no namespace {nsid} in {}", k.addr, k.subnqn))
            })?;
            let id = ns.unique_id().ok_or_else(|| {
                Error::new(
                    ErrorKind::Engine,
                    format!("qpath: namespace {nsid} via {} has no NGUID, EUI-64 or UUID to match paths by", k.addr),
                )
            })?;
            match uid {
                None => uid = Some(id),
                Some(u) if u != id => {
                    return Err(Error::new(
                        ErrorKind::Engine,
                        format!(
                            "qpath: the paths lead to different namespaces ({} differs from {})",
                            k.addr, keys[0].addr
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let uid = uid.ok_or_else(|| Error::new(ErrorKind::Engine, "qpath: a multipath head needs a path"))?;
        let head = Head::new(&ctrls[0].opts.subnqn, uid, choice.policy());
        for c in ctrls {
            head.add_path(Arc::clone(c), Nsid(nsid));
        }
        #[cfg(feature = "lab-baselines")]
        {
            let classes: Vec<_> = head.path_states().iter().map(|p| p.class).collect();
            match *choice {
                PolicyChoice::Policy(_) => {}
                PolicyChoice::RefSumQueues { queues } => head
                    .set_reference(Some(ReferenceSelector::SumPerQueue(Arc::new(SumPerQueue::new(&classes, queues))))),
                PolicyChoice::RefSharedAtomic => {
                    head.set_reference(Some(ReferenceSelector::SharedAtomic(Arc::new(SharedAtomic::new(&classes)))));
                }
            }
        }
        heads.insert(key, Arc::clone(&head));
        Ok(head)
    }
}

/// One path's share of a job's I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathStat {
    /// The path's transport address (`traddr:trsvcid`).
    pub traddr: String,
    /// I/Os completed on it (an I/O that failed over counts on the path that completed it).
    pub ios: u64,
    /// Their lengths, summed.
    pub bytes: u64,
}

/// A multipath job's policy and per-path counts ([`crate::engine::Engine::multipath`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultipathStats {
    /// The policy's name ([`PolicyChoice::name`]).
    pub policy: String,
    /// Per path, in head slot order.
    pub paths: Vec<PathStat>,
}

impl MultipathStats {
    /// I/Os over all paths.
    pub fn total_ios(&self) -> u64 {
        self.paths.iter().map(|p| p.ios).sum()
    }

    /// What happened after `earlier` (a snapshot of the same device at the end of ramp_time).
    pub fn since(&self, earlier: &MultipathStats) -> MultipathStats {
        let paths = self
            .paths
            .iter()
            .map(|p| {
                let before = earlier.paths.iter().find(|e| e.traddr == p.traddr);
                PathStat {
                    traddr: p.traddr.clone(),
                    ios: p.ios - before.map_or(0, |b| b.ios.min(p.ios)),
                    bytes: p.bytes - before.map_or(0, |b| b.bytes.min(p.bytes)),
                }
            })
            .collect();
        MultipathStats { policy: self.policy.clone(), paths }
    }

    /// Adds another job thread's counts (`group_reporting`): paths matched by address,
    /// policies listed once each.
    pub fn merge(&mut self, other: &MultipathStats) {
        if !self.policy.split(", ").any(|p| p == other.policy) {
            self.policy = format!("{}, {}", self.policy, other.policy);
        }
        for o in &other.paths {
            match self.paths.iter_mut().find(|p| p.traddr == o.traddr) {
                Some(p) => {
                    p.ios += o.ios;
                    p.bytes += o.bytes;
                }
                None => self.paths.push(o.clone()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_with_their_parameters() {
        let p = |s: &str, rr: Option<&str>, q: Option<&str>| PolicyChoice::parse(s, rr, q);
        assert_eq!(p("numa", None, None).unwrap(), PolicyChoice::Policy(Policy::Numa));
        assert_eq!(p("round-robin", None, None).unwrap(), PolicyChoice::Policy(Policy::ROUND_ROBIN));
        assert_eq!(
            p("round-robin", Some("8"), None).unwrap(),
            PolicyChoice::Policy(Policy::RoundRobin { rr_min_io: 8 })
        );
        assert_eq!(p("Queue-Depth", None, None).unwrap(), PolicyChoice::Policy(Policy::QueueDepth));
        assert_eq!(p("latency", None, None).unwrap(), PolicyChoice::Policy(Policy::LATENCY));
        assert!(p("fastest", None, None).unwrap_err().contains("expected numa"));
        assert!(p("numa", Some("2"), None).unwrap_err().contains("round-robin only"));
        assert!(p("round-robin", Some("0"), None).is_err());
        assert!(p("numa", None, Some("4")).unwrap_err().contains("ref-sum-queues only"));
        for s in ["numa", "round-robin", "queue-depth", "latency"] {
            assert_eq!(p(s, None, None).unwrap().name(), s);
        }
        #[cfg(feature = "lab-baselines")]
        {
            assert_eq!(p("ref-sum-queues", None, None).unwrap(), PolicyChoice::RefSumQueues { queues: 64 });
            assert_eq!(p("queue-depth-ewan", None, Some("32")).unwrap(), PolicyChoice::RefSumQueues { queues: 32 });
            assert_eq!(p("queue-depth-atomic", None, None).unwrap(), PolicyChoice::RefSharedAtomic);
            assert!(p("ref-shared-atomic", None, Some("4")).unwrap_err().contains("ref-sum-queues only"));
            for s in ["ref-sum-queues", "ref-shared-atomic"] {
                assert_eq!(p(s, None, None).unwrap().name(), s);
            }
        }
        #[cfg(not(feature = "lab-baselines"))]
        for s in ["ref-sum-queues", "queue-depth-atomic"] {
            let e = p(s, None, None).unwrap_err();
            assert!(e.contains("not in this build") && e.contains("lab-baselines"), "{e}");
        }
        assert_eq!(p("round-robin", Some("8"), None).unwrap().name(), "round-robin(rr_min_io=8)");
    }

    #[test]
    fn job_options_reach_the_engine() {
        let job =
            |text: &str| crate::job::JobFile::parse(&format!("[j]\nsize=1m\n{text}\n"), "t").unwrap().jobs.remove(0);
        assert_eq!(policy_of(&job("")).unwrap(), None);
        assert_eq!(paths_of(&job("")).unwrap(), None);
        let j = job("paths=2\nmpath_policy=round-robin\nrr_min_io=4");
        assert_eq!(policy_of(&j).unwrap(), Some(PolicyChoice::Policy(Policy::RoundRobin { rr_min_io: 4 })));
        assert_eq!(paths_of(&j).unwrap(), Some(2));
        assert!(policy_of(&job("rr_min_io=4")).is_err(), "rr_min_io without a policy");
        assert!(crate::job::JobFile::parse("[j]\nsize=1m\nmpath_policy=nope\n", "t").is_err());
        assert!(crate::job::JobFile::parse("[j]\nsize=1m\npaths=0\n", "t").is_err());
    }

    #[test]
    fn stats_subtract_and_merge_by_path() {
        let s = |ios: [u64; 2]| MultipathStats {
            policy: "queue-depth".into(),
            paths: vec![
                PathStat { traddr: "a:1".into(), ios: ios[0], bytes: ios[0] * 4096 },
                PathStat { traddr: "b:2".into(), ios: ios[1], bytes: ios[1] * 4096 },
            ],
        };
        let d = s([10, 30]).since(&s([4, 5]));
        assert_eq!(d, s([6, 25]));
        assert_eq!(d.total_ios(), 31);
        let mut m = s([1, 2]);
        let mut other = s([10, 20]);
        other.policy = "numa".into();
        m.merge(&other);
        m.merge(&s([0, 0]));
        assert_eq!(m.total_ios(), 33);
        assert_eq!(m.paths[1].bytes, 22 * 4096);
        assert_eq!(m.policy, "queue-depth, numa");
    }
}
