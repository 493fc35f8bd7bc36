//! The block devices one process serves (`qpath host`, or `qpath ublk add --foreground`):
//! each ublk device with the controllers of its head, and the state files that let a
//! restarted process take the devices over.
//!
//! Control plane only: a mutex over the device table, taken by RPC calls and the reaper,
//! never by an I/O.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use host::controller::Controller;
use host::head::Head;
use serde_json::{Value, json};

use crate::device::{DeviceInfo, LIVE_WAIT_DEFAULT, TRANSFER_CAP_DEFAULT, wait_live};
use crate::error::{Error, ErrorKind, Result};
use crate::spec::{HeadSpec, disconnect};
use crate::ublk::device::{UblkDevice, UblkOptions, list_devices};
use crate::ublk::{DeviceState, load_states, namespace_id_hex, remove_state, save_state};

/// How a device is added.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddOptions {
    /// Device number; the kernel picks when absent.
    #[serde(default)]
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

impl Default for AddOptions {
    fn default() -> AddOptions {
        AddOptions { dev_id: None, queues: 1, depth: depth(), max_transfer: transfer(), read_only: false }
    }
}

struct Served {
    dev: UblkDevice,
    ctrls: Vec<Arc<Controller>>,
    spec: HeadSpec,
}

/// The devices of this process.
pub struct Service {
    state_dir: PathBuf,
    devices: Mutex<BTreeMap<u32, Served>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("state_dir", &self.state_dir).finish_non_exhaustive()
    }
}

impl Service {
    /// A service keeping its devices' state in `state_dir`.
    pub fn new(state_dir: PathBuf) -> Arc<Service> {
        Arc::new(Service { state_dir, devices: Mutex::new(BTreeMap::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, Served>> {
        self.devices.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Connects `spec`'s paths and creates a ublk device over the head; returns what
    /// `ublk_add` answers.
    pub fn ublk_add(&self, spec: &HeadSpec, opts: &AddOptions) -> Result<Value> {
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
        let answer = describe(&dev, spec, head.path_count());
        self.lock().insert(dev.dev_id(), Served { dev, ctrls, spec: spec.clone() });
        Ok(answer)
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
            out.push((id, self.recover(&st).map_err(|e| e.to_string())));
        }
        out
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
                self.lock().insert(st.dev_id, Served { dev, ctrls, spec: st.spec.clone() });
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
        let g = self.lock();
        let mut out = Vec::new();
        for k in kernel {
            let mut v = serde_json::to_value(&k).unwrap_or(Value::Null);
            if let Some(s) = g.get(&k.dev_id)
                && let Some(m) = v.as_object_mut()
            {
                m.insert("served_here".into(), json!(true));
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
            }
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    /// Forgets devices whose queues ended (deleted by someone else): their controllers
    /// are disconnected and their state files removed.
    pub fn reap(&self) {
        let mut g = self.lock();
        let ended: Vec<u32> = g.iter().filter(|(_, s)| s.dev.ended()).map(|(id, _)| *id).collect();
        for id in ended {
            if let Some(s) = g.remove(&id) {
                tracing::info!(dev_id = id, "ublk device stopped from outside; forgetting it");
                drop(s.dev);
                disconnect(&s.ctrls);
                remove_state(&self.state_dir, id);
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
