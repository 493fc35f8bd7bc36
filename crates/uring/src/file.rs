//! Files an operator keeps: a configuration replaced whole, so that a crash leaves the old
//! file or the new one and never a mix, and the UTC time such a file is stamped with. The
//! target's `--persist` and the host service's `--persist` both save through here.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// What [`write_atomically`] was doing when it failed ("rename /etc/qpath/.t.new-7 to
/// /etc/qpath/t.toml"), and the system's error.
#[derive(Debug)]
pub struct WriteError {
    /// The step that failed, naming its files.
    pub what: String,
    /// The system's error; `InvalidInput` for a path that names no file.
    pub source: std::io::Error,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.source)
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn step(what: String) -> impl FnOnce(std::io::Error) -> WriteError {
    move |source| WriteError { what, source }
}

/// Writes `text` to `path` atomically with `mode`: a new file beside it, fsync, the
/// previous file kept as `path.bak` (a hard link, else a durable copy), rename over the
/// old one, fsync of the directory. Returns the `.bak` written, if there was a file to
/// keep. When it fails, `path` and `path.bak` are as they were (a stale `.bak` may have
/// been replaced by a link to the current file, which holds the same bytes). A symbolic
/// link stays one (/etc/qpath/target.toml -> /srv/...): the file it names is replaced.
pub fn write_atomically(path: &Path, text: &str, mode: u32) -> Result<Option<PathBuf>, WriteError> {
    let resolved;
    let path = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            resolved = std::fs::canonicalize(path).map_err(step(format!("resolve {}", path.display())))?;
            resolved.as_path()
        }
        _ => path,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Some(name) = path.file_name() else {
        return Err(WriteError {
            what: format!("{}: not a file name", path.display()),
            source: std::io::ErrorKind::InvalidInput.into(),
        });
    };
    let name = name.to_string_lossy().into_owned();
    let tmp = dir.join(format!(".{name}.new-{}", std::process::id()));
    let bak = dir.join(format!("{name}.bak"));
    // A leftover of a save that died half-way (same process id after a restart).
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(step(format!("create {}", tmp.display())))?;
    let written = (|| {
        // The umask may have taken bits away; never adds any.
        f.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(step(format!("chmod {}", tmp.display())))?;
        f.write_all(text.as_bytes()).map_err(step(format!("write {}", tmp.display())))?;
        f.sync_all().map_err(step(format!("fsync {}", tmp.display())))?;
        drop(f);
        let backup = if path.exists() {
            match std::fs::remove_file(&bak) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(WriteError { what: format!("remove the old {}", bak.display()), source: e });
                }
                _ => {}
            }
            if std::fs::hard_link(path, &bak).is_err() {
                // A file system without hard links: a copy (it keeps the mode), made durable.
                std::fs::copy(path, &bak).map_err(step(format!("copy {} to {}", path.display(), bak.display())))?;
                std::fs::File::open(&bak)
                    .and_then(|b| b.sync_all())
                    .map_err(step(format!("fsync {}", bak.display())))?;
            }
            Some(bak.clone())
        } else {
            None
        };
        std::fs::rename(&tmp, path).map_err(step(format!("rename {} to {}", tmp.display(), path.display())))?;
        Ok(backup)
    })();
    let backup = match written {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(step(format!("fsync directory {}", dir.display())))?;
    Ok(backup)
}

/// Days since 1970-01-01 to (year, month 1-12, day 1-31): Howard Hinnant's
/// `civil_from_days` (proleptic Gregorian calendar).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, u32::try_from(m).unwrap_or(1), u32::try_from(d).unwrap_or(1))
}

/// `t` in UTC as RFC 3339 to the second ("2026-11-27T01:02:03Z").
pub fn utc_rfc3339(t: SystemTime) -> String {
    let secs = i64::try_from(t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())).unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(utc_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        // 2000-02-29 (a leap day of a year divisible by 400) 12:34:56.
        assert_eq!(utc_rfc3339(UNIX_EPOCH + Duration::from_secs(951_827_696)), "2000-02-29T12:34:56Z");
        assert_eq!(utc_rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_651_200)), "2026-11-26T00:00:00Z");
    }

    #[test]
    fn a_save_keeps_the_previous_file_and_its_mode() {
        let dir = std::env::temp_dir().join(format!("uring-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        assert_eq!(write_atomically(&path, "one\n", 0o600).unwrap(), None, "nothing to keep yet");
        let bak = write_atomically(&path, "two\n", 0o600).unwrap();
        assert_eq!(bak.as_deref(), Some(dir.join("c.toml.bak").as_path()));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two\n");
        assert_eq!(std::fs::read_to_string(dir.join("c.toml.bak")).unwrap(), "one\n");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o600);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "no stray temporary file: {left:?}");
        // A link stays a link; the file it names is replaced.
        let real = dir.join("real.toml");
        std::fs::write(&real, "old\n").unwrap();
        let link = dir.join("link.toml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write_atomically(&link, "new\n", 0o644).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
