//! The freeze ledger: every freeze the agent applies is written here *before* it is applied, so a
//! restarted agent (after SIGKILL, OOM, a crash) knows what it froze and can thaw what no longer
//! applies. The file is JSON, replaced atomically (write a temporary file, rename it over).

use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use super::freeze::Freezer;

/// File name inside the state directory.
pub const LEDGER_FILE: &str = "freezes.json";

/// One freeze the agent applied (or was about to apply).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreezeRecord {
    /// Workload key (e.g. `docker://<id>`).
    pub workload: String,
    /// The frozen group's directory.
    pub cgroup_dir: PathBuf,
    /// Which freezer.
    pub freezer: Freezer,
    /// Seconds since the epoch when the freeze was recorded.
    pub frozen_at_unix: u64,
    /// Why, in words.
    pub reason: String,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LedgerFile {
    version: u32,
    freezes: Vec<FreezeRecord>,
}

/// The ledger, in memory and on disk.
pub struct FreezeLedger {
    path: PathBuf,
    records: BTreeMap<PathBuf, FreezeRecord>,
}

impl FreezeLedger {
    /// Opens (or creates) the ledger in `state_dir`. A corrupt file is moved aside as
    /// `freezes.json.corrupt` and reported in the returned warning; the ledger then starts empty.
    pub fn open(state_dir: &Path) -> Result<(Self, Option<String>)> {
        fs::create_dir_all(state_dir)
            .with_context(|| format!("creating state directory {}", state_dir.display()))?;
        let path = state_dir.join(LEDGER_FILE);
        let mut warning = None;
        let records = match fs::read_to_string(&path) {
            Ok(text) => match serde_json::from_str::<LedgerFile>(&text) {
                Ok(file) => file
                    .freezes
                    .into_iter()
                    .map(|r| (r.cgroup_dir.clone(), r))
                    .collect(),
                Err(e) => {
                    let aside = path.with_extension("json.corrupt");
                    let _ = fs::rename(&path, &aside);
                    warning = Some(format!(
                        "{}:{}:{}: corrupt freeze ledger ({e}); moved to {}; groups it listed are \
                         not thawed automatically: check `cgroup.freeze` of gpushare's workloads",
                        path.display(),
                        e.line(),
                        e.column(),
                        aside.display()
                    ));
                    BTreeMap::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok((Self { path, records }, warning))
    }

    /// The ledger file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every recorded freeze.
    pub fn records(&self) -> impl Iterator<Item = &FreezeRecord> {
        self.records.values()
    }

    /// The record for a group, if the agent froze it.
    pub fn get(&self, cgroup_dir: &Path) -> Option<&FreezeRecord> {
        self.records.get(cgroup_dir)
    }

    /// Records a freeze and persists it; the caller freezes only after this succeeded.
    pub fn record(&mut self, rec: FreezeRecord) -> Result<()> {
        let previous = self.records.insert(rec.cgroup_dir.clone(), rec.clone());
        if let Err(e) = self.persist() {
            match previous {
                Some(p) => self.records.insert(rec.cgroup_dir.clone(), p),
                None => self.records.remove(&rec.cgroup_dir),
            };
            return Err(e);
        }
        Ok(())
    }

    /// Forgets a group (after it was thawed or removed) and persists.
    pub fn remove(&mut self, cgroup_dir: &Path) -> Result<()> {
        if self.records.remove(cgroup_dir).is_some() {
            self.persist()?;
        }
        Ok(())
    }

    fn persist(&self) -> Result<()> {
        let file = LedgerFile {
            version: 1,
            freezes: self.records.values().cloned().collect(),
        };
        let text = serde_json::to_string_pretty(&file)?;
        let tmp = self.path.with_extension("json.tmp");
        // No fsync: the ledger guards against the *agent* dying, and a written-and-renamed file
        // survives that in the page cache. A machine crash loses the freezes themselves too (cgroups
        // do not outlive a reboot), so syncing would only add latency to every freeze (~100 ms here).
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            fs::rename(&tmp, &self.path)?;
            Ok(())
        };
        write().with_context(|| format!("writing freeze ledger {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(dir: &str) -> FreezeRecord {
        FreezeRecord {
            workload: "docker://x".into(),
            cgroup_dir: dir.into(),
            freezer: Freezer::V2,
            frozen_at_unix: 1,
            reason: "test".into(),
        }
    }

    #[test]
    fn records_survive_a_reopen_and_removals_too() {
        let dir = std::env::temp_dir().join(format!("gpushare-ledger-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (mut l, w) = FreezeLedger::open(&dir).unwrap();
        assert!(w.is_none());
        l.record(rec("/a")).unwrap();
        l.record(rec("/b")).unwrap();
        l.remove(Path::new("/a")).unwrap();
        let (l2, _) = FreezeLedger::open(&dir).unwrap();
        assert_eq!(l2.records().cloned().collect::<Vec<_>>(), vec![rec("/b")]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_ledger_is_moved_aside_with_a_located_warning() {
        let dir = std::env::temp_dir().join(format!("gpushare-ledger-bad-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join(LEDGER_FILE),
            "{\"version\": 1,\n \"freezes\": [oops]}",
        )
        .unwrap();
        let (l, w) = FreezeLedger::open(&dir).unwrap();
        let w = w.expect("warning");
        assert!(w.contains("freezes.json:2:"), "{w}");
        assert_eq!(l.records().count(), 0);
        assert!(dir.join("freezes.json.corrupt").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_state_dir_refuses_the_record() {
        // Root writes anywhere, so the unwritable directory is one below a regular file.
        let base =
            std::env::temp_dir().join(format!("gpushare-ledger-file-{}", std::process::id()));
        fs::write(&base, "not a dir").unwrap();
        assert!(FreezeLedger::open(&base.join("sub")).is_err());
        fs::remove_file(&base).unwrap();
    }
}
