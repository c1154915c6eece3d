//! The freeze ledger: every freeze the agent applies is written here *before* it is applied, so a
//! restarted agent (after SIGKILL, OOM, a crash) knows what it froze and can thaw what no longer
//! applies. The file is JSON, replaced atomically (write a temporary file, rename it over).
//!
//! Design note: the ledger must never be the reason a freeze is stranded. Reading it never fails
//! on its content: fields this version does not know (a newer version wrote the file) are kept and
//! written back; a byte that is not UTF-8 is replaced and the rest read; a file that still does not
//! parse is moved aside as `freezes.json.corrupt` with a located warning, and the list is rebuilt
//! from the marks the agent also leaves on every group it freezes (see [`super::marks`]). Only a
//! state directory that cannot be created is an error.

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
/// The format this version writes.
pub const LEDGER_VERSION: u32 = 2;

/// One freeze the agent applied (or was about to apply).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FreezeRecord {
    /// Workload key (e.g. `docker://<id>`).
    pub workload: String,
    /// The frozen group's directory: its bytes, written as `sys::kernel_text` spells them (a
    /// group's name need not be UTF-8, and a freeze that cannot be written is not made).
    #[serde(with = "kernel_path")]
    pub cgroup_dir: PathBuf,
    /// Which freezer.
    pub freezer: Freezer,
    /// Seconds since the epoch when the freeze was recorded.
    pub frozen_at_unix: u64,
    /// Why, in words.
    pub reason: String,
    /// The group's inode when it was frozen: a group recreated under the same path is another one.
    /// Absent in records of the first format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
    /// The GPU scope whose ladder froze it (`all` or an index). Absent in the first format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The workload's GPU memory was checkpointed to host memory (the `suspend` step) before the
    /// group was frozen. Absent for a plain freeze.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<SuspendRecord>,
    /// Fields written by a newer version, kept as they were.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A suspension: which processes were checkpointed and how much GPU memory they held.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SuspendRecord {
    /// The processes checkpointed (or being checkpointed).
    pub processes: Vec<crate::attribution::ProcessIdentity>,
    /// GPU memory moved to host memory, bytes per GPU index.
    pub per_gpu: BTreeMap<u32, u64>,
    /// Seconds since the epoch when the suspend was recorded.
    pub since_unix: u64,
}

impl SuspendRecord {
    /// The pids of the recorded processes that still run (the same process: start time checked).
    pub fn live_pids(&self) -> Vec<u32> {
        self.processes
            .iter()
            .filter(|id| crate::attribution::procinfo::is_same_process(**id))
            .map(|id| id.pid)
            .collect()
    }
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct LedgerFile {
    version: u32,
    freezes: Vec<FreezeRecord>,
    /// Processes restored from a checkpoint by this state directory's agent (or `thaw --all`)
    /// that still run: each is checkpointed again before it is killed (cuda-checkpoint #53). An
    /// older version keeps the field as one it does not know.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    restored: Vec<crate::attribution::ProcessIdentity>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

/// The ledger, in memory and on disk.
pub struct FreezeLedger {
    path: PathBuf,
    records: BTreeMap<PathBuf, FreezeRecord>,
    restored: std::collections::BTreeSet<crate::attribution::ProcessIdentity>,
    extra: BTreeMap<String, serde_json::Value>,
    read_only: bool,
}

impl FreezeLedger {
    /// Opens (or creates) the ledger in `state_dir`. Returns warnings for the log (a repaired or
    /// unreadable file); fails only when the directory cannot be created or the file not read.
    pub fn open(state_dir: &Path) -> Result<(Self, Vec<String>)> {
        fs::create_dir_all(state_dir)
            .with_context(|| format!("creating state directory {}", state_dir.display()))?;
        let path = state_dir.join(LEDGER_FILE);
        let mut warnings = Vec::new();
        let (records, restored, extra) = match fs::read(&path) {
            Ok(bytes) => match parse(&bytes) {
                Ok((file, repaired)) => {
                    if repaired {
                        warnings.push(format!(
                            "{}: bytes that are not UTF-8 were replaced; every record was read",
                            path.display()
                        ));
                    }
                    if file.version > LEDGER_VERSION {
                        warnings.push(format!(
                            "{} was written by a newer version (format {}); reading what this \
                             version knows and keeping the rest",
                            path.display(),
                            file.version
                        ));
                    }
                    let records = file
                        .freezes
                        .into_iter()
                        .map(|r| (r.cgroup_dir.clone(), r))
                        .collect();
                    (records, file.restored.into_iter().collect(), file.extra)
                }
                Err(e) => {
                    let aside = path.with_extension("json.corrupt");
                    let _ = fs::rename(&path, &aside);
                    warnings.push(format!(
                        "{}:{}:{}: unreadable freeze ledger ({e}); moved to {}; the freezes it \
                         listed are found again from the marks on the cgroups",
                        path.display(),
                        e.line(),
                        e.column(),
                        aside.display()
                    ));
                    (BTreeMap::new(), Default::default(), BTreeMap::new())
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (BTreeMap::new(), Default::default(), BTreeMap::new())
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok((
            Self {
                path,
                records,
                restored,
                extra,
                read_only: false,
            },
            warnings,
        ))
    }

    /// From now on changes stay in memory (a dry run writes nothing).
    pub fn set_read_only(&mut self) {
        self.read_only = true;
    }

    /// Changes are written again (a dry run that took a workload acts on it: its freezes are
    /// recorded before they happen like any other).
    pub fn set_writable(&mut self) {
        self.read_only = false;
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

    /// Adds records found elsewhere (the marks on the cgroups) that the file does not list, and
    /// persists when any was added. Returns how many.
    pub fn merge(&mut self, found: Vec<FreezeRecord>) -> Result<usize> {
        let mut added = 0;
        for rec in found {
            if !self.records.contains_key(&rec.cgroup_dir) {
                self.records.insert(rec.cgroup_dir.clone(), rec);
                added += 1;
            }
        }
        if added > 0 {
            self.persist()?;
        }
        Ok(added)
    }

    /// Forgets a group (after it was thawed or removed) and persists.
    pub fn remove(&mut self, cgroup_dir: &Path) -> Result<()> {
        if self.records.remove(cgroup_dir).is_some() {
            self.persist()?;
        }
        Ok(())
    }

    /// The processes recorded as restored from a checkpoint (see [`Self::remember_restored`]).
    pub fn restored(&self) -> impl Iterator<Item = &crate::attribution::ProcessIdentity> {
        self.restored.iter()
    }

    /// Records `ids` as restored from a checkpoint (before the restore: a process that stays
    /// checkpointed is checkpointed again for free) and persists; processes that no longer run
    /// (start time checked) are dropped on the way.
    pub fn remember_restored(
        &mut self,
        ids: impl IntoIterator<Item = crate::attribution::ProcessIdentity>,
    ) -> Result<()> {
        let before = self.restored.clone();
        self.restored.extend(ids);
        self.restored
            .retain(|id| crate::attribution::procinfo::is_same_process(*id));
        if self.restored == before {
            return Ok(());
        }
        self.persist()
    }

    fn persist(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let file = LedgerFile {
            version: LEDGER_VERSION,
            freezes: self.records.values().cloned().collect(),
            restored: self.restored.iter().copied().collect(),
            extra: self.extra.clone(),
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

/// Parses the file's bytes; `true` when bytes that are not UTF-8 had to be replaced first.
fn parse(bytes: &[u8]) -> Result<(LedgerFile, bool), serde_json::Error> {
    match serde_json::from_slice::<LedgerFile>(bytes) {
        Ok(f) => Ok((f, false)),
        Err(e) if std::str::from_utf8(bytes).is_err() => {
            let text = String::from_utf8_lossy(bytes);
            serde_json::from_str::<LedgerFile>(&text)
                .map(|f| (f, true))
                .map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}

/// A path in JSON as [`crate::sys::kernel_text`] spells its bytes: the same string as serde's own
/// for a UTF-8 path, where serde's fails on any other.
mod kernel_path {
    use std::{
        ffi::OsStr,
        os::unix::ffi::OsStrExt,
        path::{Path, PathBuf},
    };

    use crate::sys::kernel_text;

    pub fn serialize<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&kernel_text::of_path(p))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        let text: String = serde::Deserialize::deserialize(d)?;
        Ok(PathBuf::from(OsStr::from_bytes(&kernel_text::bytes(&text))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group whose name is not UTF-8 (a glob quota's workload a tenant named): its freeze is
    /// recorded and read back byte for byte; serde's own path encoding refused it, and with the
    /// record the freeze itself.
    #[test]
    fn a_group_whose_name_is_not_utf8_is_recorded_byte_for_byte() {
        use std::os::unix::ffi::OsStrExt;
        let mut r = rec("/sys/fs/cgroup/a");
        r.cgroup_dir = Path::new("/sys/fs/cgroup").join(std::ffi::OsStr::from_bytes(b"t\xff"));
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            json.contains(r#""cgroup_dir":"/sys/fs/cgroup/t\u0000ÿ""#),
            "{json}"
        );
        let back: FreezeRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back.cgroup_dir, r.cgroup_dir);
        // A UTF-8 path is written as before.
        let plain = serde_json::to_string(&rec("/sys/fs/cgroup/é")).unwrap();
        assert!(
            plain.contains(r#""cgroup_dir":"/sys/fs/cgroup/é""#),
            "{plain}"
        );
    }

    fn rec(dir: &str) -> FreezeRecord {
        FreezeRecord {
            workload: "docker://x".into(),
            cgroup_dir: dir.into(),
            freezer: Freezer::V2,
            frozen_at_unix: 1,
            reason: "test".into(),
            inode: Some(7),
            scope: Some("all".into()),
            suspended: None,
            extra: BTreeMap::new(),
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpushare-ledger-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// A state directory `name` whose ledger file holds `bytes`.
    fn with_ledger_file(name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
        let dir = tmp(name);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(LEDGER_FILE), bytes).unwrap();
        dir
    }

    #[test]
    fn records_survive_a_reopen_and_removals_too() {
        let dir = tmp("reopen");
        let (mut l, w) = FreezeLedger::open(&dir).unwrap();
        assert!(w.is_empty());
        l.record(rec("/a")).unwrap();
        l.record(rec("/b")).unwrap();
        l.remove(Path::new("/a")).unwrap();
        let (l2, _) = FreezeLedger::open(&dir).unwrap();
        assert_eq!(l2.records().cloned().collect::<Vec<_>>(), vec![rec("/b")]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_first_format_is_still_read() {
        let dir = with_ledger_file(
            "v1",
            r#"{"version": 1, "freezes": [{"workload": "docker://x", "cgroup_dir": "/a",
               "freezer": "v2", "frozen_at_unix": 1, "reason": "r"}]}"#,
        );
        let (l, w) = FreezeLedger::open(&dir).unwrap();
        assert!(w.is_empty(), "{w:?}");
        let r = l.records().next().unwrap();
        assert_eq!((r.inode, r.scope.as_deref()), (None, None));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fields_of_a_newer_version_are_kept_and_written_back() {
        let dir = with_ledger_file(
            "newer",
            r#"{"version": 9, "written_by": "gpushare 9", "freezes": [{"workload": "docker://x",
               "cgroup_dir": "/a", "freezer": "v2", "frozen_at_unix": 1, "reason": "r",
               "checkpointed": {"bytes": 5}}]}"#,
        );
        let (mut l, w) = FreezeLedger::open(&dir).unwrap();
        assert!(w[0].contains("newer version"), "{w:?}");
        assert_eq!(l.records().count(), 1);
        l.record(rec("/b")).unwrap();
        let text = fs::read_to_string(dir.join(LEDGER_FILE)).unwrap();
        assert!(text.contains("\"written_by\": \"gpushare 9\""), "{text}");
        assert!(text.contains("\"checkpointed\""), "{text}");
        assert!(!dir.join("freezes.json.corrupt").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_byte_that_is_not_utf8_is_replaced_and_every_record_read() {
        let mut bytes =
            br#"{"version": 2, "freezes": [{"workload": "docker://x", "cgroup_dir": "/a",
               "freezer": "v2", "frozen_at_unix": 1, "reason": "over "#
                .to_vec();
        bytes.push(0xff);
        bytes.extend_from_slice(br#""}]}"#);
        let dir = with_ledger_file("utf8", &bytes);
        let (l, w) = FreezeLedger::open(&dir).unwrap();
        assert_eq!(l.records().count(), 1);
        assert!(w[0].contains("not UTF-8"), "{w:?}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_ledger_is_moved_aside_with_a_located_warning() {
        let dir = with_ledger_file("bad", "{\"version\": 1,\n \"freezes\": [oops]}");
        let (mut l, w) = FreezeLedger::open(&dir).unwrap();
        assert!(w[0].contains("freezes.json:2:"), "{w:?}");
        assert_eq!(l.records().count(), 0);
        assert!(dir.join("freezes.json.corrupt").exists());
        assert_eq!(l.merge(vec![rec("/m")]).unwrap(), 1, "rebuilt from marks");
        assert_eq!(l.merge(vec![rec("/m")]).unwrap(), 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Restored processes survive a reopen (the next agent checkpoints them again before a
    /// kill); one that no longer runs is dropped at the next write.
    #[test]
    fn restored_processes_survive_a_reopen_and_ended_ones_are_dropped() {
        let dir = tmp("restored");
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let me = crate::attribution::procinfo::snapshot(std::process::id())
            .unwrap()
            .identity;
        let it = crate::attribution::procinfo::snapshot(child.id())
            .unwrap()
            .identity;
        let (mut l, _) = FreezeLedger::open(&dir).unwrap();
        l.remember_restored([me, it]).unwrap();
        let (mut l, _) = FreezeLedger::open(&dir).unwrap();
        assert_eq!(l.restored().copied().collect::<Vec<_>>().len(), 2);
        child.kill().unwrap();
        child.wait().unwrap();
        l.remember_restored([]).unwrap();
        let (l, _) = FreezeLedger::open(&dir).unwrap();
        assert_eq!(l.restored().copied().collect::<Vec<_>>(), vec![me]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_state_dir_refuses_the_record() {
        // Root writes anywhere, so the unwritable directory is one below a regular file.
        let base = tmp("file");
        fs::write(&base, "not a dir").unwrap();
        assert!(FreezeLedger::open(&base.join("sub")).is_err());
        fs::remove_file(&base).unwrap();
    }
}
