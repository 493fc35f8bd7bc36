//! The block devices one process serves (`qpath host`, or `qpath ublk add --foreground`):
//! each ublk device with the controllers of its head, and the state files that let a
//! restarted process take the devices over.
//!
//! With a configuration file (`qpath host --config FILE`, [`crate::host_config`]), the
//! devices it lists are served too: each taken over when a previous server left it, else
//! created. One that cannot be created is kept with the reason (`ublk_list` shows it) and
//! the others are served; one whose paths could not connect is tried again every
//! `reconnect_delay` seconds until `ctrl_loss_tmo` has passed (for ever with -1), as a
//! controller reconnects; any other failure (no ublk driver, no such namespace) is tried
//! again at the next start or SIGHUP ([`Service::reload`]). Under `--persist`, `ublk_add`
//! and `ublk_del` save the file before they answer; a device `ublk_add` could not create
//! stays in the file (an operator's wish that fails now may work after `modprobe ublk_drv`
//! or once the target is up) until `ublk_del name=...` removes it.
//!
//! Control plane only: mutexes over the configuration, the device table and the takeovers
//! that wait for their paths (taken in that order when more than one is held), by RPC
//! calls, the reaper and the retries, never by an I/O.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use host::controller::Controller;
use host::head::Head;
use serde_json::{Value, json};

use crate::device::{DeviceInfo, LIVE_WAIT_DEFAULT, TRANSFER_CAP_DEFAULT, wait_live};
use crate::error::{Error, ErrorKind, Result};
use crate::host_config::{HostConfig, UblkEntry};
use crate::spec::{HeadSpec, disconnect};
use crate::ublk::device::{UblkDevice, UblkOptions, list_devices};
use crate::ublk::{DeviceState, load_states, namespace_id_hex, remove_state, save_state};

/// How a device is added.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AddOptions {
    /// Device number; the kernel picks when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_id: Option<u32>,
    /// Queues (threads).
    #[serde(default = "one")]
    pub queues: u16,
    /// Tags per queue.
    #[serde(default = "depth")]
    pub depth: u16,
    /// Largest transfer, bytes (capped by MDTS).
    #[serde(default = "transfer")]
    pub max_transfer: u32,
    /// Serve read-only.
    #[serde(default)]
    pub read_only: bool,
}

fn one() -> u16 {
    1
}
fn depth() -> u16 {
    crate::ublk::device::DEPTH_DEFAULT
}
fn transfer() -> u32 {
    TRANSFER_CAP_DEFAULT
}

impl AddOptions {
    /// Checks the layout without creating anything.
    pub fn check(&self) -> Result<()> {
        use crate::ublk::device::{DEPTH_MAX, QUEUES_MAX};
        if self.queues == 0 || self.queues > QUEUES_MAX {
            return Err(invalid(format!("queues: {} is not 1 to {QUEUES_MAX}", self.queues)));
        }
        if self.depth == 0 || self.depth > DEPTH_MAX {
            return Err(invalid(format!("depth: {} is not 1 to {DEPTH_MAX}", self.depth)));
        }
        Ok(())
    }
}

impl Default for AddOptions {
    fn default() -> AddOptions {
        AddOptions { dev_id: None, queues: 1, depth: depth(), max_transfer: transfer(), read_only: false }
    }
}

struct Served {
    dev: UblkDevice,
    ctrls: Vec<Arc<Controller>>,
    spec: HeadSpec,
    /// The configured device it is ([`UblkEntry::label`]).
    label: Option<String>,
}

/// A configured device not served, and why.
struct Failed {
    reason: String,
    retry: Option<Retry>,
    /// Tries that failed in a row (at start, on retries, at SIGHUP).
    attempts: u64,
}

/// When a configured device whose paths did not connect is tried again.
struct Retry {
    next: Instant,
    every: Duration,
    /// `ctrl_loss_tmo` after the first failure; `None`: for ever.
    until: Option<Instant>,
}

impl Retry {
    /// The first retry of a device whose paths failed to connect at `now`: after its
    /// `reconnect_delay`, until its `ctrl_loss_tmo` (for ever with a negative one), as its
    /// controllers would reconnect. `None` with a `ctrl_loss_tmo` of 0 (no reconnects).
    fn first(spec: &HeadSpec, now: Instant) -> Option<Retry> {
        if spec.ctrl_loss_tmo == 0 {
            return None;
        }
        let every = Duration::from_secs(spec.reconnect_delay.max(1));
        let until = u64::try_from(spec.ctrl_loss_tmo).ok().map(|s| now + Duration::from_secs(s));
        Some(Retry { next: now + every, every, until })
    }

    /// What is due at `now`: `None` once `ctrl_loss_tmo` has passed (give up), else
    /// whether to try now (the next try then set one `reconnect_delay` later).
    fn due(&mut self, now: Instant) -> Option<bool> {
        if self.until.is_some_and(|u| now >= u) {
            return None;
        }
        let due = now >= self.next;
        if due {
            self.next = now + self.every;
        }
        Some(due)
    }
}

/// The configuration file and what became of its devices.
struct Configured {
    file: PathBuf,
    persist: bool,
    cfg: HostConfig,
    failed: BTreeMap<String, Failed>,
}

/// A device a previous server left whose paths did not connect when it was to be taken
/// over: the kernel holds its I/O, and it is tried again as its controllers would
/// reconnect (every `reconnect_delay`, until `ctrl_loss_tmo`; for ever with -1).
struct Pending {
    st: DeviceState,
    retry: Retry,
    reason: String,
}

/// The devices of this process.
pub struct Service {
    state_dir: PathBuf,
    devices: Mutex<BTreeMap<u32, Served>>,
    config: Mutex<Option<Configured>>,
    pending: Mutex<BTreeMap<u32, Pending>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("state_dir", &self.state_dir).finish_non_exhaustive()
    }
}

impl Service {
    /// A service keeping its devices' state in `state_dir`.
    pub fn new(state_dir: PathBuf) -> Arc<Service> {
        Arc::new(Service {
            state_dir,
            devices: Mutex::new(BTreeMap::new()),
            config: Mutex::new(None),
            pending: Mutex::new(BTreeMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, Served>> {
        self.devices.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cfg_lock(&self) -> MutexGuard<'_, Option<Configured>> {
        self.config.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn pending_lock(&self) -> MutexGuard<'_, BTreeMap<u32, Pending>> {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Serves the devices of `cfg`, read from `file` ([`Service::start_configured`] brings
    /// them up); with `persist`, `ublk_add` and `ublk_del` save `file`.
    pub fn set_config(&self, file: PathBuf, persist: bool, cfg: HostConfig) {
        *self.cfg_lock() = Some(Configured { file, persist, cfg, failed: BTreeMap::new() });
    }

    /// Connects `spec`'s paths and creates a ublk device over the head; returns what
    /// `ublk_add` answers.
    pub fn ublk_add(&self, spec: &HeadSpec, opts: &AddOptions) -> Result<Value> {
        self.add(spec, opts, None)
    }

    fn add(&self, spec: &HeadSpec, opts: &AddOptions, label: Option<String>) -> Result<Value> {
        opts.check()?;
        let (ctrls, head) = spec.connect()?;
        let made = (|| {
            wait_live(&head, LIVE_WAIT_DEFAULT)?;
            let info = DeviceInfo::probe(&head, opts.max_transfer)?;
            let uo = UblkOptions {
                dev_id: opts.dev_id,
                queues: opts.queues,
                depth: opts.depth,
                read_only: opts.read_only,
                ..UblkOptions::default()
            };
            UblkDevice::create(&head, &info, &uo)
        })();
        let dev = match made {
            Ok(d) => d,
            Err(e) => {
                disconnect(&ctrls);
                return Err(e);
            }
        };
        let st = DeviceState {
            dev_id: dev.dev_id(),
            spec: spec.clone(),
            max_transfer: opts.max_transfer,
            read_only: opts.read_only,
            namespace_id: Some(namespace_id_hex(&head.uid)),
        };
        if let Err(e) = save_state(&self.state_dir, &st) {
            tracing::warn!(error = %e, "ublk device {} serves, but its state was not saved: a restarted qpath cannot take it over", dev.dev_id());
        }
        let mut answer = describe(&dev, spec, head.path_count());
        if let (Some(l), Some(m)) = (&label, answer.as_object_mut()) {
            m.insert("name".into(), json!(l));
        }
        self.lock().insert(dev.dev_id(), Served { dev, ctrls, spec: spec.clone(), label });
        Ok(answer)
    }

    /// Brings up every configured device: taken over already (by [`Service::recover_all`])
    /// or created. Returns (label, path or why not) per device.
    pub fn start_configured(&self) -> Vec<(String, std::result::Result<String, String>)> {
        let entries = match self.cfg_lock().as_ref() {
            Some(c) => c.cfg.ublk.clone(),
            None => return Vec::new(),
        };
        entries.iter().map(|e| (e.label(), self.bring_up(e))).collect()
    }

    /// One configured device: already served, taken over, or created now.
    fn bring_up(&self, e: &UblkEntry) -> std::result::Result<String, String> {
        let label = e.label();
        {
            let mut g = self.lock();
            if let Some(s) = g.values().find(|s| s.label.as_deref() == Some(label.as_str())) {
                return Ok(s.dev.path());
            }
            // A device a previous server left over the same namespace (and number, when
            // the entry gives one), taken over before: it is this one.
            let taken = g
                .iter_mut()
                .find(|(id, s)| s.label.is_none() && s.spec == e.spec && e.opts.dev_id.is_none_or(|want| want == **id));
            if let Some((_, s)) = taken {
                s.label = Some(label.clone());
                let path = s.dev.path();
                drop(g);
                if let Some(c) = self.cfg_lock().as_mut() {
                    c.failed.remove(&label);
                }
                return Ok(format!("{path} (taken over)"));
            }
        }
        let r = self.add(&e.spec, &e.opts, Some(label.clone()));
        let mut c = self.cfg_lock();
        if let Some(c) = c.as_mut() {
            match &r {
                Ok(_) => {
                    c.failed.remove(&label);
                }
                Err(err) => note_failure(c, e, err),
            }
        }
        r.map(|v| v["path"].as_str().unwrap_or("?").to_string()).map_err(|e| e.to_string())
    }

    /// Tries again the configured devices whose paths did not connect and whose time has
    /// come (called every 100 ms or so by `qpath host`); one past its `ctrl_loss_tmo` is
    /// given up until the next start or SIGHUP.
    pub fn retry_due(&self) {
        let now = Instant::now();
        self.retry_takeovers(now);
        let due: Vec<UblkEntry> = {
            let mut g = self.cfg_lock();
            let Some(c) = g.as_mut() else { return };
            let mut due = Vec::new();
            for (label, f) in &mut c.failed {
                let Some(r) = &mut f.retry else { continue };
                match r.due(now) {
                    None => {
                        tracing::warn!(device = %label, "configured device given up (ctrl_loss_tmo passed): {}; SIGHUP tries it again", f.reason);
                        f.retry = None;
                    }
                    Some(true) => {
                        if let Some(e) = c.cfg.find(label) {
                            due.push(e.clone());
                        }
                    }
                    Some(false) => {}
                }
            }
            due
        };
        for e in due {
            match self.bring_up(&e) {
                Ok(path) => tracing::info!(device = %e.label(), "configured device created on a retry: {path}"),
                Err(why) => tracing::debug!(device = %e.label(), "configured device still not created: {why}"),
            }
        }
    }

    /// `ublk_add` over the control socket: with `--persist`, the device is added to the
    /// configuration file before the call answers, and kept there when it could not be
    /// created (the error says so and how to remove it).
    pub fn ublk_add_configured(&self, name: Option<String>, spec: &HeadSpec, opts: &AddOptions) -> Result<Value> {
        let entry = UblkEntry::new(name, spec.clone(), opts.clone());
        let label = entry.label();
        {
            let mut g = self.cfg_lock();
            match g.as_mut() {
                Some(c) if c.persist => {
                    let mut next = c.cfg.clone();
                    next.ublk.push(entry.clone());
                    next.check().map_err(|e| invalid(format!("{}: {e}", c.file.display())))?;
                    c.cfg = next;
                    c.failed.insert(label.clone(), Failed { reason: "being created".into(), retry: None, attempts: 0 });
                }
                other => {
                    // Not saved: the name only names the device while it is served.
                    if let (Some(c), Some(n)) = (other, &entry.name)
                        && c.cfg.find(n).is_some()
                    {
                        return Err(invalid(format!("name {n:?} is a device of {}", c.file.display())));
                    }
                    drop(g);
                    if let Some(n) = &entry.name
                        && let Some((id, _)) = self.lock().iter().find(|(_, s)| s.label.as_deref() == Some(n.as_str()))
                    {
                        // `ublk del --name` must name one device.
                        return Err(invalid(format!("name {n:?} is taken by /dev/ublkb{id}")));
                    }
                    return self.add(spec, opts, entry.name);
                }
            }
        }
        let made = self.add(spec, opts, Some(label.clone()));
        let mut g = self.cfg_lock();
        let Some(c) = g.as_mut() else { return made };
        match &made {
            Ok(_) => {
                c.failed.remove(&label);
            }
            Err(e) => note_failure(c, &entry, e),
        }
        let saved = c.cfg.save(&c.file);
        let file = c.file.display().to_string();
        if made.is_err() && saved.is_err() {
            c.cfg.ublk.retain(|e| e.label() != label);
            c.failed.remove(&label);
        }
        drop(g);
        match (made, saved) {
            (Ok(v), Ok(())) => {
                tracing::info!(device = %label, file = %file, "configured device added and saved");
                Ok(v)
            }
            (Ok(v), Err(se)) => Err(Error::new(
                se.kind,
                format!("{} serves, but it was not saved: {se}; it will not come back after a restart", v["path"]),
            )),
            (Err(e), Ok(())) => Err(Error::new(
                e.kind,
                format!(
                    "{e}; the device stays in {file} as {label:?} and is tried again at the next start or SIGHUP (`qpath ublk del --name {label:?}` removes it)"
                ),
            )),
            (Err(e), Err(se)) => {
                Err(Error::new(e.kind, format!("{e}; it is not kept in the configuration either: {se}")))
            }
        }
    }

    /// `ublk_del dev_id=N` over the control socket: a configured device leaves the
    /// configuration too (saved under `--persist`).
    pub fn ublk_del_configured(&self, dev_id: u32) -> Result<()> {
        let served = self.lock().get(&dev_id).map(|s| s.label.clone());
        let label = match served {
            Some(l) => l,
            None => self
                .cfg_lock()
                .as_ref()
                .and_then(|c| c.cfg.ublk.iter().find(|e| e.opts.dev_id == Some(dev_id)).map(UblkEntry::label)),
        };
        match label {
            Some(l) => self.ublk_del_named(&l),
            None => self.ublk_del(dev_id),
        }
    }

    /// `ublk_del name=...`: deletes the device so named if it is served and takes it out
    /// of the configuration (saved under `--persist` before this returns).
    pub fn ublk_del_named(&self, name: &str) -> Result<()> {
        let served = self.lock().iter().find(|(_, s)| s.label.as_deref() == Some(name)).map(|(id, _)| *id);
        let configured = self.cfg_lock().as_ref().is_some_and(|c| c.cfg.find(name).is_some());
        if served.is_none() && !configured {
            return Err(Error::new(ErrorKind::NotFound, format!("no device named {name:?}")));
        }
        if let Some(id) = served {
            self.ublk_del(id)?;
        }
        let mut g = self.cfg_lock();
        let Some(c) = g.as_mut() else { return Ok(()) };
        c.cfg.ublk.retain(|e| e.label() != name);
        c.failed.remove(name);
        if c.persist {
            c.cfg.save(&c.file).map_err(|se| {
                Error::new(
                    se.kind,
                    format!("{name:?} is deleted, but the configuration was not saved: {se}; it comes back at the next start"),
                )
            })?;
            tracing::info!(device = %name, file = %c.file.display(), "configured device deleted and saved");
        }
        Ok(())
    }

    /// SIGHUP: reads the configuration file again and brings up the devices it lists that
    /// are not served (new ones, and those that failed). A served device the file no
    /// longer lists, or lists changed, goes on as it is (logged): nothing is deleted by an
    /// edit; `ublk_del` deletes. A file that does not read or check changes nothing.
    pub fn reload(&self) -> Result<String> {
        let file = match self.cfg_lock().as_ref() {
            Some(c) => c.file.clone(),
            None => return Err(invalid("started without --config: nothing to re-read")),
        };
        let next = HostConfig::load(&file)?;
        {
            let mut g = self.cfg_lock();
            let Some(c) = g.as_mut() else { return Err(invalid("no configuration")) };
            let mut d = self.lock();
            for s in d.values_mut() {
                let Some(l) = s.label.clone() else { continue };
                match (next.find(&l), c.cfg.find(&l)) {
                    (None, _) => {
                        tracing::warn!(device = %l, "no longer in {}; {} goes on being served (`qpath ublk del` deletes it)", file.display(), s.dev.path());
                        s.label = None;
                    }
                    (Some(n), Some(was)) if n != was => {
                        tracing::warn!(device = %l, "changed in {}; {} goes on as it was made until it is deleted and added again", file.display(), s.dev.path());
                    }
                    _ => {}
                }
            }
            c.failed.retain(|l, _| next.find(l).is_some());
            c.cfg = next;
        }
        let results = self.start_configured();
        let failed = results.iter().filter(|(_, r)| r.is_err()).count();
        for (l, r) in &results {
            if let Err(why) = r {
                tracing::warn!(device = %l, "configured device not created: {why}");
            }
        }
        Ok(format!("{} configured device(s), {} not created", results.len(), failed))
    }

    /// For `systemctl status`: "serving 2 ublk device(s); 1 configured device not created".
    pub fn status(&self) -> String {
        let failed = self.cfg_lock().as_ref().map_or(0, |c| c.failed.len());
        let served = self.lock().len();
        let mut s = format!("serving {served} ublk device(s)");
        if failed > 0 {
            s += &format!("; {failed} configured device(s) not created (qpath ublk list)");
        }
        s
    }

    /// Takes over every device in the state directory whose server died; devices gone
    /// from the kernel have their state file removed. Returns (device, outcome) per file.
    pub fn recover_all(&self) -> Vec<(u32, std::result::Result<String, String>)> {
        let mut out = Vec::new();
        let kernel = list_devices().unwrap_or_default();
        for st in load_states(&self.state_dir) {
            let st = match st {
                Ok(s) => s,
                Err(why) => {
                    tracing::warn!("ublk state file unreadable: {why}");
                    continue;
                }
            };
            let id = st.dev_id;
            let Some(k) = kernel.iter().find(|d| d.dev_id == id) else {
                remove_state(&self.state_dir, id);
                out.push((id, Err("no such device any more; its state file is removed".into())));
                continue;
            };
            if k.state == "live" {
                out.push((id, Err(format!("served by process {}; left alone", k.pid))));
                continue;
            }
            let r = self.recover(&st);
            if let Err(e) = &r
                && e.kind == ErrorKind::Host
                && let Some(retry) = Retry::first(&st.spec, Instant::now())
            {
                let every = retry.every.as_secs();
                self.pending_lock().insert(id, Pending { st, retry, reason: e.to_string() });
                out.push((id, Err(format!("{e}; its I/O waits, and it is tried again every {every} s"))));
                continue;
            }
            out.push((id, r.map_err(|e| e.to_string())));
        }
        out
    }

    /// Tries again to take over the devices whose paths did not connect at start, whose
    /// time has come; one past its `ctrl_loss_tmo` is given up (its I/O stays held by the
    /// kernel until a later `qpath host` takes it over or `qpath ublk del` deletes it).
    fn retry_takeovers(&self, now: Instant) {
        let due: Vec<DeviceState> = {
            let mut g = self.pending_lock();
            let mut due = Vec::new();
            g.retain(|id, p| match p.retry.due(now) {
                None => {
                    tracing::warn!("/dev/ublkb{id}: not taken over, given up (ctrl_loss_tmo passed): {}", p.reason);
                    false
                }
                Some(try_now) => {
                    if try_now {
                        due.push(p.st.clone());
                    }
                    true
                }
            });
            due
        };
        for st in due {
            match self.recover(&st) {
                Ok(path) => {
                    self.pending_lock().remove(&st.dev_id);
                    tracing::info!("{path}: taken over on a retry (the previous server's I/O resumes)");
                }
                Err(e) if e.kind == ErrorKind::Host => {
                    tracing::debug!("/dev/ublkb{}: still not taken over: {e}", st.dev_id);
                    if let Some(p) = self.pending_lock().get_mut(&st.dev_id) {
                        p.reason = e.to_string();
                    }
                }
                Err(e) => {
                    self.pending_lock().remove(&st.dev_id);
                    tracing::warn!("/dev/ublkb{}: not taken over: {e}", st.dev_id);
                }
            }
        }
    }

    fn recover(&self, st: &DeviceState) -> Result<String> {
        let (ctrls, head) = st.spec.connect()?;
        let made = (|| {
            same_namespace(st, &head)?;
            wait_live(&head, LIVE_WAIT_DEFAULT)?;
            let info = DeviceInfo::probe(&head, st.max_transfer)?;
            let uo = UblkOptions { read_only: st.read_only, ..UblkOptions::default() };
            UblkDevice::recover(&head, &info, st.dev_id, &uo)
        })();
        match made {
            Ok(dev) => {
                let path = dev.path();
                self.lock().insert(st.dev_id, Served { dev, ctrls, spec: st.spec.clone(), label: None });
                Ok(path)
            }
            Err(e) => {
                disconnect(&ctrls);
                Err(e)
            }
        }
    }

    /// Deletes a device this process serves (or, if another one serves it, through the
    /// kernel: that server's queues end).
    pub fn ublk_del(&self, dev_id: u32) -> Result<()> {
        let served = self.lock().remove(&dev_id);
        match served {
            Some(s) => {
                let r = s.dev.delete();
                disconnect(&s.ctrls);
                remove_state(&self.state_dir, dev_id);
                r
            }
            None => {
                crate::ublk::device::delete_device(dev_id)?;
                remove_state(&self.state_dir, dev_id);
                Ok(())
            }
        }
    }

    /// Every ublk device of the machine; those this process serves with their namespace,
    /// paths and counters.
    pub fn ublk_list(&self) -> Result<Value> {
        self.reap();
        let kernel = list_devices()?;
        let c = self.cfg_lock();
        let g = self.lock();
        let pending = self.pending_lock();
        let mut out = Vec::new();
        for k in kernel {
            let mut v = serde_json::to_value(&k).unwrap_or(Value::Null);
            if let Some(s) = g.get(&k.dev_id)
                && let Some(m) = v.as_object_mut()
            {
                m.insert("served_here".into(), json!(true));
                if let Some(l) = &s.label {
                    m.insert("name".into(), json!(l));
                    m.insert("configured".into(), json!(true));
                }
                m.insert("subnqn".into(), json!(s.spec.subnqn));
                m.insert("nsid".into(), json!(s.spec.nsid));
                m.insert("paths".into(), json!(s.spec.paths));
                m.insert("iopolicy".into(), json!(s.spec.iopolicy));
                // The limits the device was given, from the namespace's Identify data.
                let i = s.dev.info();
                m.insert("max_transfer".into(), json!(i.max_transfer));
                m.insert("discard".into(), json!(i.discard));
                m.insert("write_zeroes".into(), json!(i.write_zeroes));
                m.insert("volatile_cache".into(), json!(i.volatile_cache));
                // The namespace's size now: `size` (the kernel's) follows it where the
                // kernel has UPDATE_SIZE.
                m.insert("namespace_size".into(), json!(s.dev.namespace_size()));
                let q: Vec<Value> = s
                    .dev
                    .stats
                    .iter()
                    .map(|q| {
                        use std::sync::atomic::Ordering::Relaxed;
                        json!({
                            "requests": q.requests_total.load(Relaxed),
                            "errors": q.errors_total.load(Relaxed),
                            "ring_enters": q.enters_total.load(Relaxed),
                            "ring_completions": q.completions_total.load(Relaxed),
                            // Turns that brought nothing to act on, requests, NVMe
                            // completions, both.
                            "turns": q.turns_total.each_ref().map(|t| t.load(Relaxed)),
                        })
                    })
                    .collect();
                m.insert("queue_stats".into(), Value::Array(q));
            } else if let Some(p) = pending.get(&k.dev_id)
                && let Some(m) = v.as_object_mut()
            {
                // Left by a previous server; its paths did not connect yet.
                m.insert("takeover".into(), json!("retrying"));
                m.insert("error".into(), json!(p.reason));
                m.insert("subnqn".into(), json!(p.st.spec.subnqn));
                m.insert("nsid".into(), json!(p.st.spec.nsid));
                m.insert("paths".into(), json!(p.st.spec.paths));
            }
            out.push(v);
        }
        // Configured devices that are not served: what they are and why not.
        if let Some(c) = c.as_ref() {
            for e in &c.cfg.ublk {
                let label = e.label();
                if g.values().any(|s| s.label.as_deref() == Some(label.as_str())) {
                    continue;
                }
                let f = c.failed.get(&label);
                out.push(json!({
                    "name": label,
                    "configured": true,
                    "state": "not created",
                    "error": f.map_or("not tried yet", |f| f.reason.as_str()),
                    "retrying": f.is_some_and(|f| f.retry.is_some()),
                    "attempts": f.map_or(0, |f| f.attempts),
                    "dev_id": e.opts.dev_id,
                    "subnqn": e.spec.subnqn,
                    "nsid": e.spec.nsid,
                    "paths": e.spec.paths,
                }));
            }
        }
        Ok(Value::Array(out))
    }

    /// Forgets devices whose queues ended (deleted by someone else): their controllers
    /// are disconnected and their state files removed.
    pub fn reap(&self) {
        let mut labels = Vec::new();
        {
            let mut g = self.lock();
            let ended: Vec<u32> = g.iter().filter(|(_, s)| s.dev.ended()).map(|(id, _)| *id).collect();
            for id in ended {
                if let Some(s) = g.remove(&id) {
                    tracing::info!(dev_id = id, "ublk device stopped from outside; forgetting it");
                    drop(s.dev);
                    disconnect(&s.ctrls);
                    remove_state(&self.state_dir, id);
                    labels.extend(s.label);
                }
            }
        }
        if labels.is_empty() {
            return;
        }
        // A configured device stays configured: shown as not served, created again at the
        // next start or SIGHUP, until `ublk_del name=...` removes it.
        if let Some(c) = self.cfg_lock().as_mut() {
            for l in labels {
                let reason = "deleted from outside this qpath host (SIGHUP creates it again; ublk_del name=... \
                              removes it from the configuration)";
                c.failed.insert(l, Failed { reason: reason.into(), retry: None, attempts: 0 });
            }
        }
    }

    /// Stops serving every device but leaves them to the kernel (their I/O waits) and
    /// their state files in place: the next `qpath host` takes them over.
    pub fn detach_all(&self) {
        let all = std::mem::take(&mut *self.lock());
        for (_, s) in all {
            s.dev.detach();
            disconnect(&s.ctrls);
        }
    }

    /// Deletes every device this process serves.
    pub fn delete_all(&self) {
        let ids: Vec<u32> = self.lock().keys().copied().collect();
        for id in ids {
            if let Err(e) = self.ublk_del(id) {
                tracing::warn!(dev_id = id, error = %e, "deleting ublk device");
            }
        }
    }

    /// Devices served now.
    pub fn served(&self) -> Vec<u32> {
        self.lock().keys().copied().collect()
    }
}

/// Keeps why a configured device was not created; a failure to connect its paths (the
/// target unreachable) is tried again as its controllers would reconnect.
fn note_failure(c: &mut Configured, e: &UblkEntry, err: &Error) {
    let label = e.label();
    let now = Instant::now();
    let before = c.failed.get(&label);
    let until_before = before.and_then(|f| f.retry.as_ref()).map(|r| r.until);
    let attempts = before.map_or(0, |f| f.attempts) + 1;
    let same = before.is_some_and(|f| f.reason == err.to_string());
    let retry = (err.kind == ErrorKind::Host)
        .then(|| Retry::first(&e.spec, now))
        .flatten()
        // The deadline counts from the first failure.
        .map(|r| Retry { until: until_before.unwrap_or(r.until), ..r });
    // Once per reason: a device retried for ever would otherwise fill the log.
    if same {
        tracing::debug!(device = %label, attempts, "configured device still not created: {err}");
    } else {
        tracing::warn!(device = %label, retrying = retry.is_some(), "configured device not created: {err}");
    }
    c.failed.insert(label, Failed { reason: err.to_string(), retry, attempts });
}

/// A device is taken over only while its namespace is the one it was made for: after the
/// target replaced the namespace under the NSID, the device's data (a file system, a
/// database) is not on it, and serving it would hand the application another namespace's
/// blocks (Linux removes a disk whose namespace's identifiers changed).
fn same_namespace(st: &DeviceState, head: &Head) -> Result<()> {
    let now = namespace_id_hex(&head.uid);
    match &st.namespace_id {
        Some(was) if *was != now => Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "namespace {} of {} is not the one /dev/ublkb{} was made for (its identifiers changed: the target \
                 replaced it); the device is not taken over: delete it with `qpath ublk del {}`",
                st.spec.nsid, st.spec.subnqn, st.dev_id, st.dev_id
            ),
        )),
        _ => Ok(()),
    }
}

fn describe(dev: &UblkDevice, spec: &HeadSpec, paths: usize) -> Value {
    let i = dev.info();
    json!({
        "dev_id": dev.dev_id(),
        "path": dev.path(),
        "size": i.size,
        "block_size": i.block_size(),
        "max_transfer": i.max_transfer,
        "discard": i.discard,
        "write_zeroes": i.write_zeroes,
        "volatile_cache": i.volatile_cache,
        "subnqn": spec.subnqn,
        "nsid": spec.nsid,
        "paths": paths,
        "iopolicy": spec.iopolicy,
    })
}

/// The default state directory: `$QPATH_STATE_DIR`, else `$XDG_RUNTIME_DIR/qpath`, else
/// `/run/qpath` (ublk devices do not outlive a reboot, so neither does their state).
pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("QPATH_STATE_DIR") {
        return d.into();
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("qpath");
    }
    PathBuf::from("/run/qpath")
}

/// A parameter error.
pub(crate) fn invalid(what: impl Into<String>) -> Error {
    Error::new(ErrorKind::Invalid, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configured device whose paths do not connect is tried again every
    /// `reconnect_delay` until `ctrl_loss_tmo` has passed since its first failure, then
    /// given up (until a SIGHUP); with `ctrl_loss_tmo = -1`, never given up.
    #[test]
    fn a_configured_device_is_retried_until_ctrl_loss_tmo_then_given_up() {
        let dir = std::env::temp_dir().join(format!("qpath-service-retry-{}", std::process::id()));
        let svc = Service::new(dir.clone());
        let mut cfg = HostConfig::default();
        for (name, tmo) in [("brief", 1), ("forever", -1)] {
            // Port 9 (discard) listens nowhere here.
            let mut spec = HeadSpec::new(vec!["127.0.0.1:9".into()], "nqn.x:y");
            spec.reconnect_delay = 1;
            spec.ctrl_loss_tmo = tmo;
            cfg.ublk.push(UblkEntry::new(Some(name.into()), spec, AddOptions::default()));
        }
        svc.set_config(dir.join("host.toml"), false, cfg);
        let started = svc.start_configured();
        assert!(started.iter().all(|(_, r)| r.as_ref().is_err_and(|e| e.contains("127.0.0.1:9"))), "{started:?}");
        let retrying = |name: &str| svc.cfg_lock().as_ref().unwrap().failed[name].retry.is_some();
        let attempts = |name: &str| svc.cfg_lock().as_ref().unwrap().failed[name].attempts;
        assert!(retrying("brief") && retrying("forever"));
        std::thread::sleep(Duration::from_millis(1100));
        svc.retry_due();
        // Due at 1 s, with brief's 1 s deadline passed too: given up, not tried.
        assert!(!retrying("brief") && attempts("brief") == 1);
        assert!(retrying("forever") && attempts("forever") == 2);
        std::thread::sleep(Duration::from_millis(1100));
        svc.retry_due();
        assert_eq!((attempts("brief"), attempts("forever")), (1, 3));
        assert!(svc.status().contains("2 configured device(s) not created"), "{}", svc.status());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_device_is_taken_over_only_while_its_namespace_is_the_one_it_was_made_for() {
        let head = Head::new("nqn.x:y", [0xab; 16], host::mpath::Policy::Numa);
        let mut st = DeviceState {
            dev_id: 3,
            spec: HeadSpec::new(vec!["127.0.0.1:4420".into()], "nqn.x:y"),
            max_transfer: 512 << 10,
            read_only: false,
            namespace_id: Some(namespace_id_hex(&[0xab; 16])),
        };
        assert!(same_namespace(&st, &head).is_ok());
        st.namespace_id = Some(namespace_id_hex(&[0xcd; 16]));
        let why = same_namespace(&st, &head).unwrap_err().to_string();
        assert!(why.contains("not the one /dev/ublkb3 was made for") && why.contains("qpath ublk del 3"), "{why}");
        // A state file written before the identifier was kept: nothing to compare.
        st.namespace_id = None;
        assert!(same_namespace(&st, &head).is_ok());
        // Such a file has no field for it, and reads back.
        let old = serde_json::to_string(&st).unwrap();
        assert!(!old.contains("namespace_id"), "{old}");
        assert_eq!(serde_json::from_str::<DeviceState>(&old).unwrap(), st);
    }
}
