//! Laying out local files before jobs start (fio: "Laying out IO file(s)").
//!
//! A regular file that does not exist or is shorter than a job needs is created and
//! extended: with written data if some job reads it (so reads hit real blocks, not
//! holes), or by `set_len` if all its jobs only write. Block and character devices are
//! left alone.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

use crate::error::{Error, ErrorKind, Result};
use crate::job::JobSpec;

/// Chunk size used when writing layout data.
const CHUNK: usize = 1 << 20;

/// What the jobs of one batch need from one local file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileNeed {
    /// Bytes the file must have (`None`: use it as it is).
    pub size: Option<u64>,
    /// Some job reads it: holes are not good enough.
    pub needs_data: bool,
    /// A job that uses it (for messages).
    pub job: String,
}

/// Collect per-file needs of `jobs` (local targets only).
pub fn needs<'a>(jobs: impl IntoIterator<Item = &'a JobSpec>) -> BTreeMap<PathBuf, FileNeed> {
    let mut map: BTreeMap<PathBuf, FileNeed> = BTreeMap::new();
    for j in jobs {
        let Some(path) = j.target.local_path() else { continue };
        let size = j.filesize.or(j.size.map(|s| j.offset + s));
        let e =
            map.entry(path.to_path_buf()).or_insert(FileNeed { size: None, needs_data: false, job: j.name.clone() });
        e.size = match (e.size, size) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        e.needs_data |= j.reads();
    }
    map
}

/// Make sure `path` exists and is at least `need.size` bytes. Returns a message if it
/// created or extended the file.
pub fn layout(path: &Path, need: &FileNeed) -> Result<Option<String>> {
    let meta = std::fs::metadata(path);
    let (exists, len) = match &meta {
        Ok(m) if m.file_type().is_block_device() || m.file_type().is_char_device() => return Ok(None),
        Ok(m) => (true, m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (false, 0),
        Err(e) => return Err(Error::io(format!("stat {}", path.display()), std::io::Error::from(e.kind()))),
    };
    let Some(size) = need.size else {
        if exists {
            return Ok(None);
        }
        return Err(Error::new(
            ErrorKind::Option,
            format!(
                "job {}: {} does not exist and no size= or filesize= says how large to make it",
                need.job,
                path.display()
            ),
        ));
    };
    if exists && len >= size {
        return Ok(None);
    }
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        return Err(Error::new(ErrorKind::Io, format!("job {}: directory {} does not exist", need.job, dir.display())));
    }
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
    if need.needs_data {
        let mut rng = SmallRng::seed_from_u64(size);
        let mut chunk = vec![0u8; CHUNK];
        let mut pos = len;
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(pos)).map_err(|e| Error::io(format!("seek {}", path.display()), e))?;
        let rounds = (size - pos).div_ceil(CHUNK as u64);
        for _ in 0..rounds {
            let n = usize::try_from((size - pos).min(CHUNK as u64)).unwrap_or(CHUNK);
            rng.fill_bytes(&mut chunk[..n]);
            file.write_all(&chunk[..n]).map_err(|e| Error::io(format!("lay out {}", path.display()), e))?;
            pos += n as u64;
        }
        file.sync_all().map_err(|e| Error::io(format!("sync {}", path.display()), e))?;
    } else {
        file.set_len(size).map_err(|e| Error::io(format!("extend {}", path.display()), e))?;
    }
    Ok(Some(format!("{}: Laying out IO file ({} bytes) {}", need.job, size, path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobFile;

    #[test]
    fn creates_and_extends() {
        let dir = std::env::temp_dir().join(format!("qpath-bench-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a");
        let _ = std::fs::remove_file(&f);
        let text = format!(
            "[r]\nfilename={}\nrw=read\nsize=3m\n[w]\nfilename={}\nrw=write\nsize=1m\n",
            f.display(),
            f.display()
        );
        let jf = JobFile::parse(&text, "t").unwrap();
        let n = needs(&jf.jobs);
        let need = &n[&f];
        assert_eq!(need.size, Some(3 << 20));
        assert!(need.needs_data);
        assert!(layout(&f, need).unwrap().is_some());
        assert_eq!(std::fs::metadata(&f).unwrap().len(), 3 << 20);
        assert!(layout(&f, need).unwrap().is_none(), "second layout is a no-op");
        let missing = FileNeed { size: None, needs_data: true, job: "x".into() };
        assert!(layout(&dir.join("nope"), &missing).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
