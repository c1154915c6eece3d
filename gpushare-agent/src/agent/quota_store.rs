//! The quota configuration in force: loaded from the main file and drop-in directories, reloaded
//! when they change, with the last good configuration kept when a new one is invalid.

use std::{
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use log::{error, info};

use crate::quota::{QuotaSet, file::load_dir_set};

/// Whether a file-watch event on the quota directories can mean a changed configuration. Opens
/// cannot, and must not count: notify reports them (IN_OPEN), and every reload opens the drop-in
/// directories to list them, so counting them made each reload trigger the next one (about ten a
/// second, each holding the event loop in its 100 ms settle wait).
pub fn is_config_change(event: &notify::Event) -> bool {
    !matches!(
        event.kind,
        notify::EventKind::Access(notify::event::AccessKind::Open(_))
    )
}

/// Where quota files live.
#[derive(Clone, Debug)]
pub struct QuotaPaths {
    /// The main file (`/etc/gpushare/quotas.toml`); missing means "no entries".
    pub main: PathBuf,
    /// Drop-in directories (`<main dir>/quotas.d`, and the runtime `/run/gpushare/quotas.d`).
    pub dropin_dirs: Vec<PathBuf>,
}

impl QuotaPaths {
    /// The main file, its sibling `quotas.d`, and `runtime_dir` (launch's drop-ins).
    pub fn new(main: PathBuf, runtime_dir: Option<PathBuf>) -> Self {
        let mut dropin_dirs = vec![main.parent().unwrap_or(Path::new("/")).join("quotas.d")];
        dropin_dirs.extend(runtime_dir);
        Self { main, dropin_dirs }
    }

    /// Directories to watch for changes.
    pub fn watch_dirs(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self
            .main
            .parent()
            .map(Path::to_path_buf)
            .into_iter()
            .collect();
        v.extend(self.dropin_dirs.iter().cloned());
        v
    }

    /// (path, size, mtime) of every file that makes up the configuration, to tell a change.
    pub fn fingerprint(&self) -> Vec<(PathBuf, u64, i128)> {
        let mut files = vec![self.main.clone()];
        for dir in &self.dropin_dirs {
            if let Ok(rd) = std::fs::read_dir(dir) {
                let mut more: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "toml"))
                    .collect();
                more.sort();
                files.extend(more);
            }
        }
        files
            .into_iter()
            .map(|p| {
                let (size, mtime) = std::fs::metadata(&p)
                    .map(|m| {
                        let t = m
                            .modified()
                            .ok()
                            .and_then(|t| t.duration_since(UNIX_EPOCH).ok());
                        (m.len(), t.map_or(-1, |d| d.as_nanos() as i128))
                    })
                    .unwrap_or((0, -2));
                (p, size, mtime)
            })
            .collect()
    }
}

/// The configuration in force and the state of the last load.
pub struct QuotaStore {
    paths: QuotaPaths,
    current: QuotaSet,
    valid: bool,
    last_reload_unix: f64,
    fingerprint: Vec<(PathBuf, u64, i128)>,
    last_errors: Vec<String>,
}

impl QuotaStore {
    /// Loads the configuration; an invalid one at start leaves an empty set in force (and says so).
    pub fn load(paths: QuotaPaths) -> Self {
        let mut s = Self {
            paths,
            current: QuotaSet::empty(),
            valid: false,
            last_reload_unix: 0.0,
            fingerprint: Vec::new(),
            last_errors: Vec::new(),
        };
        s.reload(true);
        s
    }

    /// The set in force.
    pub fn current(&self) -> &QuotaSet {
        &self.current
    }

    /// Whether the files on disk loaded cleanly the last time.
    pub fn valid(&self) -> bool {
        self.valid
    }

    /// When the set in force was loaded, seconds since the epoch.
    pub fn last_reload_unix(&self) -> f64 {
        self.last_reload_unix
    }

    /// The errors of the last failed load (`file:line:col: message`).
    pub fn errors(&self) -> &[String] {
        &self.last_errors
    }

    /// The paths.
    pub fn paths(&self) -> &QuotaPaths {
        &self.paths
    }

    /// Reloads if any file changed (or when `force`). Returns whether the set in force changed.
    pub fn reload(&mut self, force: bool) -> bool {
        let fp = self.paths.fingerprint();
        if !force && fp == self.fingerprint {
            return false;
        }
        self.fingerprint = fp;
        match load_dir_set(&self.paths.main, &self.paths.dropin_dirs) {
            Ok(set) => {
                let n = set.describe().len();
                self.current = set;
                self.valid = true;
                self.last_errors.clear();
                self.last_reload_unix = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                info!(
                    "quotas loaded from {} (+ drop-ins): {n} entries",
                    self.paths.main.display()
                );
                true
            }
            Err(errors) => {
                self.valid = false;
                self.last_errors = errors.iter().map(|e| e.to_string()).collect();
                for e in &self.last_errors {
                    error!("{e}");
                }
                error!(
                    "quota configuration rejected ({} error(s)); the last good configuration stays in force",
                    self.last_errors.len()
                );
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::mpsc, time::Duration};

    use notify::Watcher;

    use super::*;

    /// Events that pass [`is_config_change`] within a short settle time.
    fn changes(rx: &mpsc::Receiver<notify::Event>) -> Vec<notify::Event> {
        std::thread::sleep(Duration::from_millis(300));
        rx.try_iter().filter(is_config_change).collect()
    }

    #[test]
    fn reading_the_configuration_is_not_a_change_but_writing_it_is() {
        let dir = std::env::temp_dir().join(format!("gpushare-qs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("quotas.d")).unwrap();
        std::fs::create_dir_all(dir.join("runtime")).unwrap();
        std::fs::write(dir.join("quotas.toml"), "").unwrap();
        std::fs::write(dir.join("runtime/a.toml"), "").unwrap();
        let paths = QuotaPaths::new(dir.join("quotas.toml"), Some(dir.join("runtime")));
        let (tx, rx) = mpsc::channel();
        let mut w = notify::recommended_watcher(move |r: notify::Result<notify::Event>| {
            if let Ok(e) = r {
                let _ = tx.send(e);
            }
        })
        .unwrap();
        for d in paths.watch_dirs() {
            w.watch(&d, notify::RecursiveMode::NonRecursive).unwrap();
        }
        let before = paths.fingerprint();
        let seen = changes(&rx);
        assert!(
            seen.is_empty(),
            "reading the files is not a change: {seen:?}"
        );
        std::fs::write(dir.join("runtime/b.toml"), "x").unwrap();
        assert!(!changes(&rx).is_empty(), "a new drop-in is a change");
        assert_ne!(paths.fingerprint(), before);
        std::fs::write(dir.join("quotas.toml"), "y").unwrap();
        assert!(!changes(&rx).is_empty(), "an edited main file is a change");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
