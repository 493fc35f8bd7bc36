//! Multipath namespace heads: the same namespace (same NGUID/EUI-64/UUID in
//! the same subsystem NQN) through several controllers. Each (controller,
//! namespace) is a path; paths come and go at runtime.
//!
//! A head is shared by every thread that opens it; it changes only when
//! paths are added or removed or the policy is switched (a mutex and a
//! generation counter: control plane). Per I/O, each thread's
//! [`crate::context::Context`] runs its own [`crate::mpath::Selector`] over
//! its own snapshot of the paths, so selection touches no shared state.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use nvme::Nsid;

use crate::controller::{Controller, CtrlState};
use crate::mpath::{LinkState, PathClass, PathIndex, PathState, Policy, Selection};

/// A multipath namespace. Generic over its controllers as the block core is
/// ([`crate::context::ctrlview`]): `Head` is `Head<Controller>`, and the simulator's heads are
/// the same type over its controllers.
pub struct Head<C = Controller> {
    /// Subsystem NQN.
    pub subnqn: String,
    /// The namespace's unique id (NGUID, or EUI-64, or UUID).
    pub uid: [u8; 16],
    inner: Mutex<HeadInner<C>>,
    generation: AtomicU64,
}

struct HeadInner<C> {
    /// Path slots: index = `PathIndex`; a removed path leaves `None` (its slot stays Gone).
    paths: Vec<Option<(Arc<C>, Nsid)>>,
    policy: Policy,
    reference: Option<ReferenceSelector>,
}

/// Seed 000's two queue-depth selectors, to run real I/O through them in the
/// same experiment as qpath's policies (`qpath lab seed-000`). Shared by every
/// context that opens the head, as Linux's counters are shared by every CPU.
///
/// Its variants exist only with the `lab-baselines` cargo feature. Without it the
/// enum has none, so a head never holds one and a context's per-I/O checks for
/// one fold away (docs/design.md, "Lab baselines").
#[derive(Clone, Debug)]
pub enum ReferenceSelector {
    /// Per-queue counters summed over every queue of every path at each selection.
    #[cfg(feature = "lab-baselines")]
    SumPerQueue(Arc<crate::mpath::reference::SumPerQueue>),
    /// One shared atomic in-flight counter per path.
    #[cfg(feature = "lab-baselines")]
    SharedAtomic(Arc<crate::mpath::reference::SharedAtomic>),
}

impl ReferenceSelector {
    /// Linux's scan over the shared counters.
    #[inline]
    pub(crate) fn select(&self) -> Selection {
        match *self {
            #[cfg(feature = "lab-baselines")]
            ReferenceSelector::SumPerQueue(ref r) => r.select(),
            #[cfg(feature = "lab-baselines")]
            ReferenceSelector::SharedAtomic(ref r) => r.select(),
        }
    }

    /// An I/O went out on `path` through the context's queue `queue`.
    #[inline]
    pub(crate) fn on_submit(&self, path: PathIndex, queue: usize) {
        #[cfg(not(feature = "lab-baselines"))]
        let _ = (path, queue);
        match *self {
            #[cfg(feature = "lab-baselines")]
            ReferenceSelector::SumPerQueue(ref r) => r.on_submit(path, queue),
            #[cfg(feature = "lab-baselines")]
            ReferenceSelector::SharedAtomic(ref r) => r.on_submit(path),
        }
    }

    /// That I/O completed.
    #[inline]
    pub(crate) fn on_complete(&self, path: PathIndex, queue: usize) {
        #[cfg(not(feature = "lab-baselines"))]
        let _ = (path, queue);
        match *self {
            #[cfg(feature = "lab-baselines")]
            ReferenceSelector::SumPerQueue(ref r) => r.on_complete(path, queue),
            #[cfg(feature = "lab-baselines")]
            ReferenceSelector::SharedAtomic(ref r) => r.on_complete(path),
        }
    }
}

impl std::fmt::Debug for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Head").field("subnqn", &self.subnqn).field("paths", &self.path_count()).finish()
    }
}

/// One path as `list-subsys` shows it.
#[derive(Clone, Debug)]
pub struct PathInfo {
    /// Slot index.
    pub index: usize,
    /// Controller address.
    pub traddr: std::net::SocketAddr,
    /// Controller id.
    pub cntlid: u16,
    /// NSID through this controller.
    pub nsid: Nsid,
    /// Controller state.
    pub ctrl_state: CtrlState,
    /// ANA state of the namespace through this controller.
    pub ana_state: nvme::AnaState,
    /// The selector's view.
    pub class: PathClass,
}

impl<C> Head<C> {
    /// A head with no paths.
    pub fn new(subnqn: &str, uid: [u8; 16], policy: Policy) -> Arc<Head<C>> {
        Arc::new(Head {
            subnqn: subnqn.to_string(),
            uid,
            inner: Mutex::new(HeadInner { paths: Vec::new(), policy, reference: None }),
            generation: AtomicU64::new(1),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HeadInner<C>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes when paths or the policy change (one relaxed load).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Adds a path (the namespace `nsid` through `ctrl`), reusing a free slot.
    pub fn add_path(&self, ctrl: Arc<C>, nsid: Nsid) -> usize {
        let mut g = self.lock();
        if let Some(i) =
            g.paths.iter().position(|p| p.as_ref().is_some_and(|(c, n)| Arc::ptr_eq(c, &ctrl) && *n == nsid))
        {
            return i;
        }
        let i = match g.paths.iter().position(Option::is_none) {
            Some(i) => {
                g.paths[i] = Some((ctrl, nsid));
                i
            }
            None => {
                g.paths.push(Some((ctrl, nsid)));
                g.paths.len() - 1
            }
        };
        drop(g);
        self.bump();
        i
    }

    /// Removes the path through `ctrl` (its I/O fails over to the others).
    pub fn remove_path(&self, ctrl: &Arc<C>) {
        let mut g = self.lock();
        for p in &mut g.paths {
            if p.as_ref().is_some_and(|(c, _)| Arc::ptr_eq(c, ctrl)) {
                *p = None;
            }
        }
        drop(g);
        self.bump();
    }

    /// The path slots.
    pub fn paths(&self) -> Vec<Option<(Arc<C>, Nsid)>> {
        self.lock().paths.clone()
    }

    /// Number of present paths.
    pub fn path_count(&self) -> usize {
        self.lock().paths.iter().flatten().count()
    }

    /// The I/O policy.
    pub fn policy(&self) -> Policy {
        self.lock().policy
    }

    /// Switches the I/O policy at runtime (every context picks it up at its next poll).
    pub fn set_policy(&self, policy: Policy) {
        self.lock().policy = policy;
        self.bump();
    }

    /// Replaces the policy by one of seed 000's reference selectors (built over
    /// the paths' classes now), or back to the policy with `None`.
    pub fn set_reference(&self, reference: Option<ReferenceSelector>) {
        self.lock().reference = reference;
        self.bump();
    }

    /// The reference selector in use, if any.
    pub fn reference(&self) -> Option<ReferenceSelector> {
        self.lock().reference.clone()
    }
}

impl Head<Controller> {
    /// The selector's view of every slot now (control plane: locks the controllers briefly).
    pub fn path_states(&self) -> Vec<PathState> {
        self.paths()
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                None => PathState::new(u64::MAX - i as u64, PathClass::Gone),
                Some((c, nsid)) => PathState::new(path_id(c, *nsid), class_of(c, *nsid)),
            })
            .collect()
    }

    /// Paths as `list-subsys` shows them.
    pub fn path_info(&self) -> Vec<PathInfo> {
        self.paths()
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let (c, nsid) = p.as_ref()?;
                let ns = c.namespace(*nsid);
                Some(PathInfo {
                    index: i,
                    traddr: c.opts.traddr,
                    cntlid: c.cntlid().0,
                    nsid: *nsid,
                    ctrl_state: c.state(),
                    ana_state: ns.map_or(nvme::AnaState::Inaccessible, |n| n.ana_state),
                    class: class_of(c, *nsid),
                })
            })
            .collect()
    }

    /// Groups the namespaces of `ctrls` into heads: one per (subsystem NQN,
    /// namespace unique id) reachable through at least one controller.
    pub fn build(ctrls: &[Arc<Controller>], policy: Policy) -> Vec<Arc<Head>> {
        let mut heads: Vec<Arc<Head>> = Vec::new();
        for c in ctrls {
            for ns in c.namespaces() {
                let Some(uid) = ns.unique_id() else { continue };
                let h = match heads.iter().find(|h| h.subnqn == c.opts.subnqn && h.uid == uid) {
                    Some(h) => Arc::clone(h),
                    None => {
                        let h = Head::new(&c.opts.subnqn, uid, policy);
                        heads.push(Arc::clone(&h));
                        h
                    }
                };
                h.add_path(Arc::clone(c), ns.nsid);
            }
        }
        heads
    }
}

/// The block core's view of a head ([`crate::context::ctrlview`]).
impl<C> crate::context::ctrlview::CoreHead for Head<C> {
    type Ctrl = C;

    #[inline]
    fn generation(&self) -> u64 {
        Head::generation(self)
    }

    fn policy(&self) -> Policy {
        Head::policy(self)
    }

    fn reference(&self) -> Option<ReferenceSelector> {
        Head::reference(self)
    }

    fn paths(&self) -> Vec<Option<(Arc<C>, Nsid)>> {
        Head::paths(self)
    }
}

/// A path's identity for the selector: controller object (of any kind the block core
/// runs over) and NSID.
pub(crate) fn path_id<C>(c: &Arc<C>, nsid: Nsid) -> u64 {
    (Arc::as_ptr(c) as u64).wrapping_mul(0x9e37_79b9).wrapping_add(u64::from(nsid.0))
}

/// The class of the namespace `nsid` through `c` now.
pub(crate) fn class_of(c: &Controller, nsid: Nsid) -> PathClass {
    let link = LinkState::of(c.state(), c.should_fail_io());
    PathClass::of_listed(c.namespace(nsid).map(|ns| ns.ana_state), link)
}
