//! Small JSON state files that several processes read and write: the mock libcuda's per-process
//! checkpoint states and the mock NVML's driver-enforced memory limits.
//!
//! Writers serialize on an advisory lock (`<file>.lock`, `flock`) for the whole
//! read-modify-write and replace the file atomically (temporary name + `rename`), so readers
//! never take the lock and never see a half-written file.

use serde::{Serialize, de::DeserializeOwned};
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Identity of one version of a file (as seen by stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileKey {
    /// The key of `m`.
    pub fn of(m: &fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// The key of the file at `path` now; `None` when it does not exist (or cannot be seen).
    pub fn at(path: &Path) -> Option<Self> {
        fs::metadata(path).ok().map(|m| Self::of(&m))
    }
}

/// `path` read and parsed; a missing file is `T::default()`.
pub fn read<T: DeserializeOwned + Default>(path: &Path) -> Result<T, String> {
    let mut text = String::new();
    match fs::File::open(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(T::default()),
        Err(e) => return Err(format!("{}: cannot read: {e}", path.display())),
        Ok(mut f) => f
            .read_to_string(&mut text)
            .map_err(|e| format!("{}: cannot read: {e}", path.display()))?,
    };
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads `path` (missing: default), lets `f` change the value, and writes it back atomically,
/// all under the file's lock. `f`'s result is returned; when `f` fails nothing is written.
pub fn update<T, R, E>(
    path: &Path,
    f: impl FnOnce(&mut T) -> Result<R, E>,
) -> Result<Result<R, E>, String>
where
    T: DeserializeOwned + Serialize + Default,
{
    let lock_path = sibling(path, ".lock");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("{}: cannot open: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("{}: cannot lock: {e}", lock_path.display()))?;
    let mut value: T = read(path)?;
    let result = f(&mut value);
    if result.is_ok() {
        write_atomic(path, &value)?;
    }
    drop(lock);
    Ok(result)
}

/// Replaces `path` with `value` (temporary name in the same directory + rename).
pub fn write_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), String> {
    static N: AtomicU64 = AtomicU64::new(0);
    let tmp = sibling(
        path,
        &format!(
            ".tmp.{}.{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ),
    );
    let text = serde_json::to_vec_pretty(value).map_err(|e| e.to_string())?;
    fs::write(&tmp, text)
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = fs::remove_file(&tmp);
            format!("{}: cannot write: {e}", path.display())
        })
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// A state file re-read only when its stat key changes (one stat per look).
#[derive(Debug)]
pub struct Watched<T> {
    path: PathBuf,
    seen: Option<Option<FileKey>>,
    current: T,
}

impl<T: DeserializeOwned + Default + PartialEq> Watched<T> {
    /// Watches `path`; nothing is read until the first [`Watched::refresh`].
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            seen: None,
            current: T::default(),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last good content (default before the first good read).
    pub fn current(&self) -> &T {
        &self.current
    }

    /// Looks at the file; `Ok(true)` when a new, different content is now current. A bad file
    /// keeps the last good content and is reported once per change of the file.
    pub fn refresh(&mut self) -> Result<bool, String> {
        let key = FileKey::at(&self.path);
        if self.seen == Some(key) {
            return Ok(false);
        }
        self.seen = Some(key);
        let value: T = read(&self.path)?;
        if value == self.current {
            return Ok(false);
        }
        self.current = value;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn update_is_atomic_and_keeps_nothing_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let r: Result<u32, ()> = update(&path, |m: &mut BTreeMap<String, u32>| {
            m.insert("a".into(), 1);
            Ok(7)
        })
        .unwrap();
        assert_eq!(r, Ok(7));
        let r: Result<(), &str> = update(&path, |m: &mut BTreeMap<String, u32>| {
            m.insert("b".into(), 2);
            Err("no")
        })
        .unwrap();
        assert_eq!(r, Err("no"));
        let m: BTreeMap<String, u32> = read(&path).unwrap();
        assert_eq!(m, BTreeMap::from([("a".to_owned(), 1)]));
        // Only the file and its lock are left: no temporary files.
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["s.json", "s.json.lock"]);
    }

    #[test]
    fn watched_reports_changes_and_keeps_the_last_good_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let mut w: Watched<BTreeMap<String, u32>> = Watched::new(path.clone());
        assert_eq!(w.refresh(), Ok(false), "missing file is the default");
        write_atomic(&path, &BTreeMap::from([("a", 1)])).unwrap();
        assert_eq!(w.refresh(), Ok(true));
        assert_eq!(w.refresh(), Ok(false));
        fs::write(&path, "{ not json").unwrap();
        assert!(w.refresh().unwrap_err().contains("s.json"));
        assert_eq!(w.refresh(), Ok(false), "reported once per change");
        assert_eq!(w.current().get("a"), Some(&1));
    }
}
