//! The quota configuration in force: loaded from the main file and drop-in directories, reloaded
//! when they change, with the last good configuration kept when a new one is invalid.
//!
//! - Reads: the operator's quota file and its `quotas.d/` drop-ins, `launch`'s runtime drop-ins,
//!   watched ([`QuotaStore`]); what they say is parsed and checked in [`crate::quota`] (pure).
//! - Grants, per GPU, with source the entry that names the workload (its file, line, selector and
//!   name: `QuotaSource::File`): an entry's `gpu_memory` on the GPU it names, on each GPU, or over
//!   all in total, with its enforcement; the most specific selector wins, and a file entry wins
//!   over every other source (`QuotaSet::resolve`, which falls back on the grants of this room).
//!
//! Nothing the operator said is forgotten:
//! - a reload that fails keeps the last good configuration in force (in memory);
//! - every successful load also keeps the operator's files (the main file and its `quotas.d/`) in
//!   the state directory, `<state dir>/last-good-quotas/`, exactly as they were parsed;
//! - a start with an invalid configuration uses that kept copy (with the live runtime drop-ins of
//!   `launch`, which the agent does not keep: they come and go with their services), and says so;
//!   without one, the agent observes only ([`QuotaStore::observe_only`]: alerts and metrics, no
//!   signal, freeze or kill) until a valid configuration loads. The built-in defaults alone never
//!   turn enforcement on: they know nothing of the operator's `protect` list, ladder or
//!   `env_quotas = false`.

use std::{
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use log::{error, info, warn};

use crate::quota::{
    QuotaSet,
    file::{ConfigFiles, LocatedError, build_files, read_files},
};

/// Where in the state directory the last good configuration's files are kept.
pub const KEPT_DIR: &str = "last-good-quotas";

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
    /// Drop-in directories: first the operator's `<main dir>/quotas.d`, then the runtime
    /// `/run/gpushare/quotas.d` (where `launch` registers services), if any.
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
    state_dir: Option<PathBuf>,
    current: QuotaSet,
    /// Changes whenever `current` is replaced.
    generation: u64,
    valid: bool,
    observe_only: bool,
    kept_in_force: Option<PathBuf>,
    last_reload_unix: f64,
    fingerprint: Vec<(PathBuf, u64, i128)>,
    last_errors: Vec<String>,
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl QuotaStore {
    /// Loads the configuration, keeping nothing on disk; an invalid one at start means observe
    /// only. For tests and benchmarks; the agent uses [`QuotaStore::load_with_state`].
    pub fn load(paths: QuotaPaths) -> Self {
        Self::load_with_state(paths, None)
    }

    /// Loads the configuration. Each successful load keeps the operator's files in
    /// `<state_dir>/last-good-quotas/`; an invalid configuration at start uses that copy, or else
    /// means observe only (see the module note).
    pub fn load_with_state(paths: QuotaPaths, state_dir: Option<PathBuf>) -> Self {
        let mut s = Self {
            paths,
            state_dir,
            current: QuotaSet::empty(),
            generation: 0,
            valid: false,
            observe_only: false,
            kept_in_force: None,
            last_reload_unix: 0.0,
            fingerprint: Vec::new(),
            last_errors: Vec::new(),
        };
        if !s.reload(true) {
            s.start_without_a_valid_configuration();
        }
        s
    }

    /// The set in force.
    pub fn current(&self) -> &QuotaSet {
        &self.current
    }

    /// A number that changes whenever the set in force is replaced (what was built from it is
    /// still good while it is the same).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the files on disk loaded cleanly the last time.
    pub fn valid(&self) -> bool {
        self.valid
    }

    /// Whether enforcement is off because no configuration of the operator's is in force: the
    /// files were invalid at start and no last good copy was kept. Alerts and metrics only.
    pub fn observe_only(&self) -> bool {
        self.observe_only
    }

    /// The kept copy in force since a start with invalid files, until a valid load.
    pub fn kept_in_force(&self) -> Option<&Path> {
        self.kept_in_force.as_deref()
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

    /// Where the last good configuration's files are kept, when there is a state directory.
    pub fn kept_dir(&self) -> Option<PathBuf> {
        self.state_dir.as_ref().map(|d| d.join(KEPT_DIR))
    }

    /// Reloads if any file changed (or when `force`). Returns whether the set in force changed.
    pub fn reload(&mut self, force: bool) -> bool {
        let fp = self.paths.fingerprint();
        if !force && fp == self.fingerprint {
            return false;
        }
        self.fingerprint = fp;
        let (files, mut errors) = read_files(&self.paths.main, &self.paths.dropin_dirs);
        let built = build_files(&files).and_then(|set| {
            if errors.is_empty() {
                Ok(set)
            } else {
                Err(std::mem::take(&mut errors))
            }
        });
        match built {
            Ok(set) => {
                let n = set.describe().len();
                self.current = set;
                self.generation += 1;
                self.valid = true;
                if self.observe_only || self.kept_in_force.is_some() {
                    info!("a valid quota configuration is in force again: enforcement follows it");
                }
                self.observe_only = false;
                self.kept_in_force = None;
                self.last_errors.clear();
                self.last_reload_unix = now_unix();
                info!(
                    "quotas loaded from {} (+ drop-ins): {n} entries",
                    self.paths.main.display()
                );
                for w in self.current.warnings() {
                    warn!("{w}");
                }
                self.keep(&files);
                true
            }
            Err(mut e) => {
                errors.append(&mut e);
                self.valid = false;
                self.last_errors = errors.iter().map(|e| e.to_string()).collect();
                for e in &self.last_errors {
                    error!("{e}");
                }
                if self.last_reload_unix > 0.0 || self.kept_in_force.is_some() {
                    error!(
                        "quota configuration rejected ({} error(s)); the last good configuration stays in force",
                        self.last_errors.len()
                    );
                }
                false
            }
        }
    }

    /// At start, with invalid files: the kept copy, else observe only.
    fn start_without_a_valid_configuration(&mut self) {
        let n = self.last_errors.len();
        let Some(kept) = self.kept_dir().filter(|d| d.is_dir()) else {
            self.observe_only = true;
            error!(
                "quota configuration rejected at start ({n} error(s)) and no last good configuration is kept:                  observe only (alerts and metrics; no signal, freeze or kill) until a valid configuration loads"
            );
            return;
        };
        // The operator's kept files, with the live runtime drop-ins; without them if together
        // they do not load (a launch registered a quota that clashes with a kept entry).
        let main = kept.join("quotas.toml");
        let mut dirs = vec![kept.join("quotas.d")];
        dirs.extend(self.paths.dropin_dirs.iter().skip(1).cloned());
        let attempt = |dirs: &[PathBuf]| -> Result<QuotaSet, Vec<LocatedError>> {
            let (files, errors) = read_files(&main, dirs);
            let set = build_files(&files)?;
            if errors.is_empty() {
                Ok(set)
            } else {
                Err(errors)
            }
        };
        let loaded = attempt(&dirs).or_else(|e| {
            warn!(
                "the kept configuration does not load with the runtime drop-ins ({}); using it alone",
                e.first().map(ToString::to_string).unwrap_or_default()
            );
            attempt(&dirs[..1])
        });
        match loaded {
            Ok(set) => {
                let saved = std::fs::read_to_string(kept.join("SAVED"))
                    .map(|s| format!(" ({})", s.trim()))
                    .unwrap_or_default();
                error!(
                    "quota configuration rejected at start ({n} error(s)): using the last good configuration kept in {}{saved} until the files are fixed",
                    kept.display()
                );
                self.current = set;
                self.generation += 1;
                self.kept_in_force = Some(kept);
                self.last_reload_unix = now_unix();
            }
            Err(e) => {
                self.observe_only = true;
                error!(
                    "quota configuration rejected at start ({n} error(s)) and the kept copy in {} does not load either ({}): \
                     observe only (alerts and metrics; no signal, freeze or kill) until a valid configuration loads",
                    kept.display(),
                    e.first().map(ToString::to_string).unwrap_or_default()
                );
            }
        }
    }

    /// Keeps the operator's files of a configuration that loaded (the main file and the first
    /// drop-in directory) in the state directory, replacing the previous copy as a whole.
    fn keep(&self, files: &ConfigFiles) {
        let Some(kept) = self.kept_dir() else { return };
        if let Err(e) = write_kept(&kept, files) {
            warn!(
                "cannot keep the quota configuration in {} ({e}); a start with invalid files would observe only",
                kept.display()
            );
        }
    }
}

/// Writes the copy into a fresh directory beside `kept`, then swaps it in, so a crash leaves the
/// old copy or the new one, never half of one.
fn write_kept(kept: &Path, files: &ConfigFiles) -> std::io::Result<()> {
    let parent = kept.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(".{KEPT_DIR}.new"));
    let old = parent.join(format!(".{KEPT_DIR}.old"));
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = std::fs::remove_dir_all(&old);
    std::fs::create_dir_all(tmp.join("quotas.d"))?;
    let (main_path, main_text) = &files.main;
    if let Some(text) = main_text {
        std::fs::write(tmp.join("quotas.toml"), text)?;
    }
    let mut sources = vec![format!("{}", main_path.display())];
    if let Some((dir, dropins)) = files.dropins.first() {
        for (path, text) in dropins {
            if let Some(name) = path.file_name() {
                std::fs::write(tmp.join("quotas.d").join(name), text)?;
            }
        }
        sources.push(format!("{}/*.toml", dir.display()));
    }
    std::fs::write(
        tmp.join("SAVED"),
        format!(
            "saved at {:.0} (seconds since the epoch) from {}\n",
            now_unix(),
            sources.join(" and ")
        ),
    )?;
    if kept.exists() {
        std::fs::rename(kept, &old)?;
    }
    std::fs::rename(&tmp, kept)?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Self {
            let d = std::env::temp_dir()
                .join(format!("gpushare-quota-store-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(d.join("etc/quotas.d")).unwrap();
            std::fs::create_dir_all(d.join("run")).unwrap();
            Self(d)
        }

        fn paths(&self) -> QuotaPaths {
            QuotaPaths::new(self.0.join("etc/quotas.toml"), Some(self.0.join("run")))
        }

        fn write(&self, rel: &str, text: &str) {
            std::fs::write(self.0.join(rel), text).unwrap();
        }

        fn store(&self) -> QuotaStore {
            QuotaStore::load_with_state(self.paths(), Some(self.0.join("state")))
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const GOOD: &str = "protect = [\"unit://sshd.service\"]\n[defaults]\nenv_quotas = false\n";
    const BAD: &str = "[[quota]]\nunit = \"a\"\ngpu_memory = 5\n";

    #[test]
    fn an_invalid_start_without_a_kept_copy_observes_only_until_a_valid_load() {
        let d = Dir::new("observe");
        d.write("etc/quotas.toml", BAD);
        let mut s = d.store();
        assert!(s.observe_only());
        assert!(!s.valid());
        assert_eq!(s.current(), &QuotaSet::empty());
        d.write("etc/quotas.toml", GOOD);
        assert!(s.reload(true));
        assert!(!s.observe_only() && s.valid());
        // A later invalid reload keeps the good set in force, and enforcement on.
        d.write("etc/quotas.toml", BAD);
        assert!(!s.reload(true));
        assert!(!s.observe_only() && !s.valid());
        assert!(!s.current().defaults().env_quotas);
    }

    #[test]
    fn each_good_load_is_kept_and_an_invalid_start_uses_the_copy() {
        let d = Dir::new("kept");
        d.write("etc/quotas.toml", GOOD);
        d.write(
            "etc/quotas.d/10-a.toml",
            "[[quota]]\nunit = \"a\"\ngpu_memory = \"1GiB\"\n",
        );
        // A launch's runtime drop-in: not kept (it comes and goes with its service).
        d.write(
            "run/launch-x.toml",
            "[[quota]]\ncgroup = \"/gpushare.slice/x.scope\"\ngpu_memory = \"1GiB\"\n",
        );
        let s = d.store();
        assert!(s.valid());
        let kept = d.0.join("state").join(KEPT_DIR);
        assert_eq!(
            std::fs::read_to_string(kept.join("quotas.toml")).unwrap(),
            GOOD
        );
        assert!(kept.join("quotas.d/10-a.toml").exists());
        assert!(!kept.join("quotas.d/launch-x.toml").exists());
        assert!(
            std::fs::read_to_string(kept.join("SAVED"))
                .unwrap()
                .contains("quotas.toml")
        );
        drop(s);
        // Broken while the agent was down: the kept copy (with the live runtime drop-in) is used.
        d.write("etc/quotas.toml", BAD);
        let mut s = d.store();
        assert!(!s.valid() && !s.observe_only());
        assert_eq!(s.kept_in_force(), Some(kept.as_path()));
        assert_eq!(s.current().protect_patterns(), vec!["unit://sshd.service"]);
        assert!(!s.current().defaults().env_quotas);
        assert_eq!(
            s.current().entries().len(),
            2,
            "kept entry and the live launch entry"
        );
        assert!(
            s.errors()[0].contains("etc/quotas.toml:3:14"),
            "{:?}",
            s.errors()
        );
        // Fixed: the files are in force again.
        d.write("etc/quotas.toml", "");
        assert!(s.reload(true));
        assert_eq!(s.kept_in_force(), None);
        assert!(s.current().defaults().env_quotas);
    }

    #[test]
    fn a_kept_copy_that_does_not_load_means_observe_only() {
        let d = Dir::new("kept-bad");
        std::fs::create_dir_all(d.0.join("state").join(KEPT_DIR)).unwrap();
        d.write(&format!("state/{KEPT_DIR}/quotas.toml"), BAD);
        d.write("etc/quotas.toml", BAD);
        assert!(d.store().observe_only());
    }
}

#[cfg(test)]
mod watch_tests {
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
