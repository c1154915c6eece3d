//! What the node shows of the mechanisms beside gpushare's ladder (issue 42, [`crate::verify`]):
//! the in-process limiter mapped in each GPU process (`/proc/<pid>/maps`), the MPS pipe
//! directory as each process sees it (through `/proc/<pid>/root`), and the kernel's `dmem`
//! controller on a workload's group.
//!
//! Cost: only what a grant claims is read. A process's maps where a HAMi variable claims the
//! in-process limiter: when it is new (a pid with another start time is another process) and,
//! while no limiter was seen in it, again when its mapping changed (a library loaded after
//! start): its size in `/proc/<pid>/statm` (a few dozen bytes) is looked at every [`RECHECK`],
//! the maps read only when it differs from the size they were read at (an unmap and a map of
//! the same size between two looks is missed: the limiter then reads "not mapped", never a false
//! "in force"). Its pipe directory once where an MPS variable claims MPS. The `dmem` capability
//! is probed once.

use std::{
    collections::HashMap,
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use crate::{
    attribution::procinfo::ProcessIdentity,
    sys::{kernel_text, proc_maps},
    verify::DmemFact,
};

/// The file name (prefix) of HAMi-core's limiter library.
pub const LIMITER_LIBRARY: &[u8] = b"libvgpu.so";
/// MPS's pipe directory when `CUDA_MPS_PIPE_DIRECTORY` is not set.
pub const DEFAULT_MPS_PIPE: &str = "/tmp/nvidia-mps";
/// How often a process without a limiter is looked at again (its mapping's size).
pub const RECHECK: Duration = Duration::from_secs(10);

/// What was read of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessMechanisms {
    /// Whether the limiter library is mapped (`None`: its maps were unreadable).
    pub limiter_mapped: Option<bool>,
    /// Whether the MPS pipe directory (its `control` pipe) exists as it sees it (`None`:
    /// unreadable).
    pub mps_pipe_present: Option<bool>,
}

struct Cached {
    start_ticks: u64,
    /// When its mapping was last looked at, what its maps said (`None`: unreadable), and its
    /// size when they were read (`None`: unreadable); `None`: not read.
    limiter: Option<(Instant, Option<bool>, Option<u64>)>,
    /// Its pipe directory, when looked at.
    pipe: Option<Option<bool>>,
}

/// Reads and caches [`ProcessMechanisms`] per process, and `dmem` per group.
pub struct MechanismReader {
    proc_root: PathBuf,
    v2_root: PathBuf,
    processes: HashMap<u32, Cached>,
    dmem: Option<bool>,
    reads: u64,
}

impl MechanismReader {
    /// Over `/proc` at `proc_root` and the cgroup v2 hierarchy at `v2_root`.
    pub fn new(proc_root: PathBuf, v2_root: PathBuf) -> Self {
        Self {
            proc_root,
            v2_root,
            processes: HashMap::new(),
            dmem: None,
            reads: 0,
        }
    }

    /// Processes whose maps were read, in total.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// What `id`'s process shows of what is asked: its maps (`limiter`) read when it is new, or
    /// has no limiter and its mapping's size, looked at every [`RECHECK`], changed; its MPS pipe
    /// directory (`pipe`) looked at once. Nothing is read for a process no grant asks about (a node without HAMi or MPS reads
    /// no maps and no pipe directory).
    pub fn process(
        &mut self,
        id: ProcessIdentity,
        now: Instant,
        limiter: bool,
        pipe: bool,
    ) -> ProcessMechanisms {
        let c = self.processes.entry(id.pid).or_insert(Cached {
            start_ticks: id.start_ticks,
            limiter: None,
            pipe: None,
        });
        if c.start_ticks != id.start_ticks {
            // Another process under the same pid.
            *c = Cached {
                start_ticks: id.start_ticks,
                limiter: None,
                pipe: None,
            };
        }
        let dir = self.proc_root.join(id.pid.to_string());
        if limiter {
            let read = match c.limiter {
                None => true,
                Some((_, Some(true), _)) => false,
                Some((at, _, _)) if now.duration_since(at) < RECHECK => false,
                Some((_, mapped, read_at)) => {
                    let changed = vm_size(&dir).is_none_or(|size| Some(size) != read_at);
                    if !changed {
                        // The same mapping: nothing to read until the next look.
                        c.limiter = Some((now, mapped, read_at));
                    }
                    changed
                }
            };
            if read {
                self.reads += 1;
                // The size first: a mapping that changes after it is seen at the next look.
                let size = vm_size(&dir);
                let mapped = std::fs::read(dir.join("maps"))
                    .ok()
                    .map(|m| proc_maps::maps_library(&m, LIMITER_LIBRARY));
                c.limiter = Some((now, mapped, size));
            }
        }
        if pipe && c.pipe.is_none() {
            c.pipe = Some(pipe_present(&dir));
        }
        ProcessMechanisms {
            limiter_mapped: c.limiter.and_then(|(_, m, _)| m),
            mps_pipe_present: c.pipe.flatten(),
        }
    }

    /// Forgets processes `live` says are gone.
    pub fn retain(&mut self, live: impl Fn(u32) -> bool) {
        self.processes.retain(|pid, _| live(*pid));
    }

    /// `dmem.max` of the group at `cgroup` (a path in the v2 hierarchy) for the GPU `region`
    /// names (`None`: the first region listed), with the controller probed once.
    pub fn dmem(&mut self, cgroup: &str, region: Option<&str>) -> DmemFact {
        let has = *self.dmem.get_or_insert_with(|| {
            std::fs::read(self.v2_root.join("cgroup.controllers"))
                .is_ok_and(|c| c.split(|b| b.is_ascii_whitespace()).any(|w| w == b"dmem"))
        });
        if !has {
            return DmemFact::NoController;
        }
        let file = kernel_text::under(&self.v2_root, cgroup).join("dmem.max");
        match std::fs::read(&file) {
            Ok(text) => dmem_max(&text, region),
            Err(e) => DmemFact::Unreadable {
                reason: format!("{}: {e}", file.display()),
            },
        }
    }
}

/// `dmem.max`'s line for `region` (or the first): `<region> <bytes|max>`.
pub fn dmem_max(text: &[u8], region: Option<&str>) -> DmemFact {
    for line in text.split(|&b| b == b'\n') {
        let mut words = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|w| !w.is_empty());
        let (Some(name), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        if region.is_some_and(|r| r.as_bytes() != name) {
            continue;
        }
        return match value {
            b"max" => DmemFact::Max(None),
            v => match std::str::from_utf8(v).ok().and_then(|v| v.parse().ok()) {
                Some(b) => DmemFact::Max(Some(b)),
                None => DmemFact::Unreadable {
                    reason: format!("dmem.max: `{}`", kernel_text::text(line)),
                },
            },
        };
    }
    DmemFact::Unreadable {
        reason: "dmem.max names no region of this GPU".into(),
    }
}

/// How long the look at one process's pipe directory may take. The tenant names the directory:
/// a FUSE mount that never answers (any user may mount one in its own namespace) would block a
/// lookup, and with it the step, for ever.
pub const PIPE_LOOK: Duration = Duration::from_millis(200);

/// Looks still blocked (each on a thread of its own); while this many are, no new one starts.
const STUCK_MAX: usize = 4;
static STUCK: AtomicUsize = AtomicUsize::new(0);

/// The size of the process at `dir` (a `/proc/<pid>` directory), in pages: the first field of
/// its `statm`, which any mapping or unmapping changes. `None`: unreadable.
fn vm_size(dir: &Path) -> Option<u64> {
    let statm = std::fs::read(dir.join("statm")).ok()?;
    let first = statm.split(|b| b.is_ascii_whitespace()).next()?;
    std::str::from_utf8(first).ok()?.parse().ok()
}

/// Whether the MPS pipe directory of the process at `dir` (`/proc/<pid>`) has its `control`
/// pipe, as the process sees it (through its root); `None` when its environment is unreadable or
/// the look did not end within [`PIPE_LOOK`] (it is then left to its thread, and given up on).
fn pipe_present(dir: &Path) -> Option<bool> {
    if STUCK.load(Ordering::Relaxed) >= STUCK_MAX {
        return None;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dir.to_path_buf();
    STUCK.fetch_add(1, Ordering::Relaxed);
    let spawned = std::thread::Builder::new()
        .name("mps-pipe-look".into())
        .spawn(move || {
            let present = look_at_pipe(&d);
            STUCK.fetch_sub(1, Ordering::Relaxed);
            let _ = tx.send(present);
        });
    if spawned.is_err() {
        STUCK.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    match rx.recv_timeout(PIPE_LOOK) {
        Ok(present) => present,
        Err(_) => {
            log::warn!(
                "{}: its MPS pipe directory did not answer within {PIPE_LOOK:?} (a FUSE mount \
                 that never answers?): not looked at again",
                dir.display()
            );
            None
        }
    }
}

/// [`pipe_present`]'s look, which may block: the environment read as a stream (a tenant sizes
/// it; only one variable is kept), the directory resolved inside the process's root
/// (`openat2` with `RESOLVE_IN_ROOT`: its absolute symlinks stay in its root, never the host's).
fn look_at_pipe(dir: &Path) -> Option<bool> {
    let environ = std::fs::File::open(dir.join("environ")).ok()?;
    let pipe = pipe_directory(std::io::BufReader::new(environ)).ok()?;
    let root = std::fs::File::open(dir.join("root")).ok()?;
    let mut rel = pipe.strip_prefix(b"/").unwrap_or(&pipe).to_vec();
    rel.extend_from_slice(b"/control");
    let path = std::ffi::CString::new(rel).ok()?;
    // SAFETY: `open_how` is plain integers; all zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT;
    // SAFETY: a valid directory fd, a NUL-terminated path and an `open_how` of its own size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd >= 0 {
        // SAFETY: the fd was just opened here and is owned by nothing else.
        drop(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) });
        return Some(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        // A kernel before 5.6: looked up through the root link (absolute symlinks as the host's).
        Some(libc::ENOSYS) => {
            let mut p = dir.join("root");
            p.push(std::ffi::OsStr::from_bytes(path.as_bytes()));
            Some(p.exists())
        }
        _ => Some(false),
    }
}

/// `CUDA_MPS_PIPE_DIRECTORY` of an environment block (NUL-separated entries, read as a stream:
/// one entry at a time, each at most what the kernel allows one, 128 KiB), else the default. The
/// first entry counts, as `getenv` reads it.
pub fn pipe_directory(environ: impl std::io::BufRead) -> std::io::Result<Vec<u8>> {
    for entry in environ.split(0) {
        if let Some(v) = entry?.strip_prefix(b"CUDA_MPS_PIPE_DIRECTORY=") {
            if !v.is_empty() {
                return Ok(v.to_vec());
            }
            break;
        }
    }
    Ok(DEFAULT_MPS_PIPE.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dmem_max_lines() {
        let t = b"drm/0000:01:00.0/vram0 1073741824\ndrm/0000:02:00.0/vram0 max\n";
        assert_eq!(dmem_max(t, None), DmemFact::Max(Some(1 << 30)));
        assert_eq!(
            dmem_max(t, Some("drm/0000:02:00.0/vram0")),
            DmemFact::Max(None)
        );
        assert!(matches!(
            dmem_max(t, Some("drm/x")),
            DmemFact::Unreadable { .. }
        ));
        assert!(matches!(
            dmem_max(b"r junk\n", None),
            DmemFact::Unreadable { .. }
        ));
        assert!(matches!(dmem_max(b"", None), DmemFact::Unreadable { .. }));
    }

    #[test]
    fn the_pipe_directory_of_an_environment() {
        let dir = |e: &[u8]| pipe_directory(e).unwrap();
        assert_eq!(dir(b"A=1\0PATH=/bin\0"), b"/tmp/nvidia-mps");
        assert_eq!(
            dir(b"CUDA_MPS_PIPE_DIRECTORY=/run/mps\xff\0A=1\0"),
            b"/run/mps\xff"
        );
        assert_eq!(dir(b"CUDA_MPS_PIPE_DIRECTORY=\0"), b"/tmp/nvidia-mps");
        // The first counts, as getenv reads it; entries of any size before it are streamed.
        let mut big = vec![b'x'; 1 << 20];
        big.extend_from_slice(b"\0CUDA_MPS_PIPE_DIRECTORY=/a\0CUDA_MPS_PIPE_DIRECTORY=/b\0");
        assert_eq!(dir(&big), b"/a");
    }

    /// This process, read through the real `/proc`: its maps are readable, no `libvgpu.so` is
    /// mapped, and a second look within [`RECHECK`] reads nothing; a pid with another start time
    /// is another process; nothing is read where nothing is asked.
    #[test]
    fn reads_a_process_once_while_cached_and_only_what_is_asked() {
        let mut r = MechanismReader::new("/proc".into(), "/nonexistent".into());
        let me = ProcessIdentity {
            pid: std::process::id(),
            start_ticks: 1,
        };
        let now = Instant::now();
        let seen = r.process(me, now, false, false);
        assert_eq!((seen.limiter_mapped, seen.mps_pipe_present), (None, None));
        assert_eq!(r.reads(), 0, "nothing asked, nothing read");
        let seen = r.process(me, now, true, false);
        assert_eq!(seen.limiter_mapped, Some(false));
        assert_eq!(r.reads(), 1);
        r.process(me, now + Duration::from_secs(1), true, false);
        assert_eq!(r.reads(), 1);
        let other = ProcessIdentity {
            start_ticks: 2,
            ..me
        };
        r.process(other, now + RECHECK, true, false);
        assert_eq!(r.reads(), 2, "another start time is another process");
        // No MPS server here: /tmp/nvidia-mps/control is not there (unless one runs).
        let seen = r.process(other, now + RECHECK, true, true);
        assert_eq!(
            seen.mps_pipe_present,
            Some(Path::new("/tmp/nvidia-mps/control").exists())
        );
        assert_eq!(r.reads(), 2);
        assert_eq!(r.dmem("/x", None), DmemFact::NoController);
    }

    /// A process without the limiter: its maps are read again only when its mapping's size
    /// changed (looked at every [`RECHECK`]), never every step (issue 42's cost).
    #[test]
    fn maps_are_read_again_only_when_the_mapping_changed() {
        let proc = tempfile::tempdir().unwrap();
        let dir = proc.path().join("4711");
        std::fs::create_dir(&dir).unwrap();
        let lib = "7f00-7f10 r-xp 0 08:01 12 /usr/lib/libc.so.6\n";
        let vgpu = "7f20-7f30 r-xp 0 08:01 13 /usr/local/vgpu/libvgpu.so\n";
        let write = |statm: &str, maps: &str| {
            std::fs::write(dir.join("statm"), statm).unwrap();
            std::fs::write(dir.join("maps"), maps).unwrap();
        };
        write("1000 200 100 1 0 50 0\n", lib);
        let mut r = MechanismReader::new(proc.path().into(), "/nonexistent".into());
        let id = ProcessIdentity {
            pid: 4711,
            start_ticks: 9,
        };
        let t0 = Instant::now();
        let at = |n: u32| t0 + RECHECK * n;
        assert_eq!(
            r.process(id, at(0), true, false).limiter_mapped,
            Some(false)
        );
        assert_eq!(r.reads(), 1);
        // Looked at for ten RECHECKs, the same size: the maps are not read again.
        for n in 1..=10 {
            r.process(id, at(n), true, false);
        }
        assert_eq!(r.reads(), 1, "the same mapping, not read again");
        // The limiter loaded after start: the size changed, read at the next look.
        write("1400 200 100 1 0 50 0\n", &format!("{lib}{vgpu}"));
        let seen = r.process(id, at(10) + RECHECK / 2, true, false);
        assert_eq!(
            (seen.limiter_mapped, r.reads()),
            (Some(false), 1),
            "within RECHECK"
        );
        let seen = r.process(id, at(11), true, false);
        assert_eq!((seen.limiter_mapped, r.reads()), (Some(true), 2));
        // Mapped: never read again.
        write("1500 200 100 1 0 50 0\n", lib);
        r.process(id, at(20), true, false);
        assert_eq!(r.reads(), 2);
        // An unreadable size is a change: read each look.
        let other = ProcessIdentity { pid: 4712, ..id };
        std::fs::create_dir(proc.path().join("4712")).unwrap();
        r.process(other, at(0), true, false);
        r.process(other, at(1), true, false);
        assert_eq!(r.reads(), 4);
    }
}
