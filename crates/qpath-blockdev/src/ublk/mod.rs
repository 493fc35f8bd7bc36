//! ublk: a multipath head as `/dev/ublkbN` (Linux `ublk_drv`, 6.0+), served by this process.
//!
//! - [`params`]: the namespace's limits as ublk parameters.
//! - [`queue`]: one queue on one thread: ublk commands and NVMe/TCP on one io_uring.
//! - [`device`]: create, serve, delete, recover after a restart.
//! - [`size`]: the device follows its namespace's size (UPDATE_SIZE).
//! - this module: the state file each device leaves so a restarted server can take it
//!   over (`state_dir/ublk-N.json`: the namespace's paths and the device's layout).

pub mod device;
pub mod params;
pub mod queue;
pub mod size;

use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};
use crate::spec::HeadSpec;

/// What a restarted server needs to take a device over.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceState {
    /// `/dev/ublkbN`.
    pub dev_id: u32,
    /// The namespace and its paths.
    pub spec: HeadSpec,
    /// Largest transfer asked for.
    pub max_transfer: u32,
    /// Served read-only.
    #[serde(default)]
    pub read_only: bool,
    /// The unique identifier (NGUID, else EUI-64, else UUID; hex) of the namespace the
    /// device was made for: a restarted server takes the device over only while the
    /// namespace under the NSID is still that one. Absent in a state file of an older qpath.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_id: Option<String>,
}

/// A namespace's unique identifier as a state file holds it.
pub fn namespace_id_hex(uid: &[u8; 16]) -> String {
    uid.iter().map(|b| format!("{b:02x}")).collect()
}

/// One `qpath host` per state directory: two would each take over the devices the other
/// serves after a restart and remove each other's state files. The lock (an open-file
/// lock on `DIR/host.lock`, holding the holder's pid as text) lasts as long as the returned
/// file is open, and goes with the process however it ends.
pub fn lock_state_dir(dir: &Path) -> Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    use std::os::unix::io::AsRawFd;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("{}: creating the state directory", dir.display()), &e))?;
    let path = dir.join("host.lock");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::io(path.display(), &e))?;
    if let Err(e) = uring::try_lock_file(f.as_raw_fd(), uring::FileLock::Exclusive) {
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(Error::io(format!("{}: locking", path.display()), &e));
        }
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        let holder = holder.trim();
        let who = if holder.is_empty() { String::new() } else { format!(" (process {holder})") };
        return Err(Error::new(
            ErrorKind::Busy,
            format!(
                "the state directory {} is used by another qpath host{who}: one qpath host per state directory \
                 (another --state-dir for a second one)",
                dir.display()
            ),
        ));
    }
    let pid = std::process::id().to_string();
    f.set_len(0)
        .and_then(|()| f.rewind())
        .and_then(|()| f.write_all(pid.as_bytes()))
        .map_err(|e| Error::io(path.display(), &e))?;
    Ok(f)
}

/// Where device `dev_id`'s state lives in `dir`.
pub fn state_path(dir: &Path, dev_id: u32) -> PathBuf {
    dir.join(format!("ublk-{dev_id}.json"))
}

/// Writes a device's state atomically (a new file, fsync, rename), mode 0600: it may name
/// a host NQN, never a key.
pub fn save_state(dir: &Path, s: &DeviceState) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("{}: creating the state directory", dir.display()), &e))?;
    let path = state_path(dir, s.dev_id);
    let tmp = dir.join(format!(".ublk-{}.json.new", s.dev_id));
    let body = serde_json::to_vec_pretty(s).map_err(|e| Error::new(ErrorKind::Invalid, e.to_string()))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| Error::io(tmp.display(), &e))?;
    f.write_all(&body).and_then(|()| f.sync_all()).map_err(|e| Error::io(tmp.display(), &e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(path.display(), &e))
}

/// Every device state in `dir` (unreadable files are reported, not fatal).
pub fn load_states(dir: &Path) -> Vec<std::result::Result<DeviceState, String>> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with("ublk-") && name.ends_with(".json")) {
            continue;
        }
        let p = e.path();
        out.push(
            std::fs::read(&p)
                .map_err(|e| format!("{}: {e}", p.display()))
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", p.display()))),
        );
    }
    out
}

/// Removes device `dev_id`'s state.
pub fn remove_state(dir: &Path, dev_id: u32) {
    let _ = std::fs::remove_file(state_path(dir, dev_id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_per_state_directory_and_the_second_is_told_who_holds_it() {
        let dir = std::env::temp_dir().join(format!("qpath-ublk-lock-{}", std::process::id()));
        let first = lock_state_dir(&dir).unwrap();
        let why = lock_state_dir(&dir).unwrap_err().to_string();
        assert!(why.contains("used by another qpath host"), "{why}");
        assert!(why.contains(&format!("(process {})", std::process::id())), "{why}");
        drop(first);
        let again = lock_state_dir(&dir).expect("free once the first is gone");
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn state_round_trip() {
        let dir = std::env::temp_dir().join(format!("qpath-ublk-state-{}", std::process::id()));
        let s = DeviceState {
            dev_id: 3,
            spec: HeadSpec::new(vec!["127.0.0.1:4420".into(), "127.0.0.1:4421".into()], "nqn.x:y"),
            max_transfer: 512 << 10,
            read_only: false,
            namespace_id: Some(namespace_id_hex(&[0xab; 16])),
        };
        save_state(&dir, &s).unwrap();
        std::fs::write(dir.join("ublk-9.json"), b"{not json").unwrap();
        std::fs::write(dir.join("other.txt"), b"x").unwrap();
        let mut got = load_states(&dir);
        got.sort_by_key(|r| r.is_err());
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].as_ref().unwrap(), &s);
        assert!(got[1].as_ref().unwrap_err().contains("ublk-9.json"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(state_path(&dir, 3)).unwrap().permissions().mode() & 0o777, 0o600);
        remove_state(&dir, 3);
        assert!(!state_path(&dir, 3).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
