//! A fake GPU process for gpushare's tests.
//!
//! Opens the device nodes given with `--device` (fake nvidia nodes with /dev/null's numbers), prints
//! `ready <pid>` and then obeys commands on stdin, one per line, answering `ok` to each:
//!
//! - `ioctl N`: N ioctls shaped like NV_ESC_RM_CONTROL (not allocations)
//! - `alloc N`: N ioctls shaped like NV_ESC_RM_ALLOC
//! - `talloc`: one NV_ESC_RM_ALLOC ioctl, answered `ok <ns>` with CLOCK_BOOTTIME read immediately
//!   before it (the clock of the eBPF event time), so a bench can time a reaction from the ioctl
//! - `xfer N`: N NV_ESC_RM_ALLOC requests wrapped in NV_ESC_IOCTL_XFER_CMD
//! - `open PATH [open|openat|openat2] [thread] [ro]`: open PATH read-write (read-only with `ro`,
//!   e.g. to block on a FIFO) through that syscall (default openat), from a new thread with
//!   `thread` (it exits afterwards, the fd stays); answers `ok <fd>` or `error <errno>`. The fd is kept open; later ioctls still go to the first device.
//! - `flood FDS PATH COUNT_FILE`: hold FDS more fds (dups of /dev/null), answer `ok`, then try to
//!   open PATH (a missing `/dev/nvidia*` node) for ever, 100 µs apart (so the thread is seen
//!   asleep, out of the open, rather than running), writing the number of attempts to COUNT_FILE
//!   every 1024 (what a hostile tenant without a GPU does to an agent that checks opens by
//!   listing fds)
//! - `mem DIR DEVICE BYTES`: write BYTES to `DIR/<pid>.<DEVICE>` (the mock NVML's per-process memory)
//! - `exit [CODE]`: exit
//!
//! End of input exits 0. Static-friendly: std and libc only.
//!
//! Without a driver to talk to, memory "allocations" go through the mock NVML's
//! `process_memory_dir` (`<dir>/<pid>.<device index>` holds the bytes the process uses):
//!
//! - `--mem-dir DIR --mem BYTES`: at start, write BYTES to `DIR/<pid>.<device>`
//! - `--mem-device N`: the NVML device index (default: `$GPUSHARE_LAUNCH_GPU_INDEX`, which
//!   `gpushare-agent launch` sets, else 0)
//! - `--grow-to BYTES --grow-after SECS`: SECS seconds after start, write BYTES instead
//! - `--no-stdin`: read no commands; run until a signal ends it (for `gpushare-agent launch`,
//!   whose services should not depend on a pipe)
//!
//! The memory file is removed when the process exits (end of input, `exit`, SIGTERM, SIGINT or
//! SIGHUP). SIGUSR1 (what the agent's ladder sends first) does not end it: each one is logged to
//! stderr as `fake-gpu-proc <pid>: SIGUSR1 received`.

use std::{
    ffi::CString,
    fs::{File, OpenOptions},
    io::{BufRead, Write},
    os::fd::AsRawFd,
    sync::atomic::{AtomicPtr, Ordering},
    time::Duration,
};

use gpushare_common::ioctl::{
    IoctlXfer, NV_ESC_IOCTL_XFER_CMD, NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL, nv_iowr,
};

/// The memory file to remove when a signal ends the process (a leaked `CString`), or null.
static MEM_FILE: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Memory reported through the mock NVML's `process_memory_dir`.
struct MemPlan {
    dir: String,
    device: u32,
    bytes: u64,
    grow: Option<(u64, Duration)>,
}

fn bytes_arg(flag: &str, v: Option<String>) -> u64 {
    v.and_then(|v| v.parse().ok())
        .unwrap_or_else(|| usage(&format!("{flag} needs a number of bytes")))
}

fn main() {
    let mut devices = Vec::new();
    let mut mem_dir = None;
    let mut mem = None;
    let mut mem_device = None;
    let mut grow_to = None;
    let mut grow_after = None;
    let mut no_stdin = false;
    // Its own path (argument 0) may be any bytes: tests name the executable so to name the
    // process (`std::env::args` would panic on it).
    let mut args = std::env::args_os().skip(1).map(|a| {
        a.into_string()
            .unwrap_or_else(|a| usage(&format!("argument {a:?} is not UTF-8")))
    });
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => devices.push(
                args.next()
                    .unwrap_or_else(|| usage("--device needs a path")),
            ),
            "--mem-dir" => {
                mem_dir = Some(
                    args.next()
                        .unwrap_or_else(|| usage("--mem-dir needs a directory")),
                )
            }
            "--mem" => mem = Some(bytes_arg("--mem", args.next())),
            "--mem-device" => mem_device = Some(bytes_arg("--mem-device", args.next()) as u32),
            "--grow-to" => grow_to = Some(bytes_arg("--grow-to", args.next())),
            "--grow-after" => {
                grow_after = Some(
                    args.next()
                        .and_then(|v| v.parse::<f64>().ok())
                        .filter(|s| s.is_finite() && *s >= 0.0)
                        .map(Duration::from_secs_f64)
                        .unwrap_or_else(|| usage("--grow-after needs seconds")),
                )
            }
            "--no-stdin" => no_stdin = true,
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let plan = match (mem_dir, mem.or(grow_to)) {
        (Some(dir), Some(_)) => Some(MemPlan {
            dir,
            device: mem_device.unwrap_or_else(|| {
                std::env::var("GPUSHARE_LAUNCH_GPU_INDEX")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            }),
            bytes: mem.unwrap_or(0),
            grow: grow_to.map(|b| (b, grow_after.unwrap_or(Duration::ZERO))),
        }),
        (None, None) if grow_after.is_none() => None,
        _ => usage("--mem/--grow-to and --mem-dir go together"),
    };
    install_signal_handlers();
    let files: Vec<File> = devices
        .iter()
        .map(|d| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(d)
                .unwrap_or_else(|e| {
                    eprintln!("fake-gpu-proc: cannot open {d}: {e}");
                    std::process::exit(2)
                })
        })
        .collect();
    let fd = files.first().map(|f| f.as_raw_fd()).unwrap_or(-1);
    let pid = std::process::id();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if let Some(plan) = plan {
        let path = format!("{}/{pid}.{}", plan.dir, plan.device);
        if let Ok(c) = CString::new(path.clone()) {
            MEM_FILE.store(c.into_raw(), Ordering::SeqCst);
        }
        if let Err(e) = write_mem(&path, plan.bytes) {
            eprintln!("fake-gpu-proc: cannot write {path}: {e}");
            std::process::exit(2)
        }
        if let Some((bytes, after)) = plan.grow {
            std::thread::spawn(move || {
                std::thread::sleep(after);
                if let Err(e) = write_mem(&path, bytes) {
                    eprintln!("fake-gpu-proc: cannot write {path}: {e}");
                } else {
                    eprintln!("fake-gpu-proc {pid}: now using {bytes} bytes");
                }
            });
        }
    }
    let _ = writeln!(out, "ready {pid}");
    let _ = out.flush();
    if no_stdin {
        drop(out);
        loop {
            // SAFETY: pause(2) waits for a signal; the handlers end the process or return.
            unsafe { libc::pause() };
        }
    }
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| {
            words
                .get(i)
                .and_then(|w| w.parse::<u64>().ok())
                .unwrap_or(1)
        };
        match words.first().copied() {
            Some("ioctl") => issue(fd, nv_iowr(NV_ESC_RM_CONTROL, 32), n(1), false),
            Some("alloc") => issue(fd, nv_iowr(NV_ESC_RM_ALLOC, 48), n(1), false),
            Some("talloc") => {
                let at = boot_time_ns();
                issue(fd, nv_iowr(NV_ESC_RM_ALLOC, 48), 1, false);
                let _ = writeln!(out, "ok {at}");
                let _ = out.flush();
                continue;
            }
            Some("xfer") => issue(fd, nv_iowr(NV_ESC_IOCTL_XFER_CMD, 16), n(1), true),
            Some("mem") if words.len() == 4 => {
                let path = format!("{}/{pid}.{}", words[1], words[2]);
                let tmp = format!("{path}.tmp");
                if std::fs::write(&tmp, words[3])
                    .and_then(|_| std::fs::rename(&tmp, &path))
                    .is_err()
                {
                    let _ = writeln!(out, "error writing {path}");
                    let _ = out.flush();
                    continue;
                }
            }
            Some("open") if words.len() >= 2 => {
                let how = words.get(2).copied().unwrap_or("openat").to_string();
                let path = words[1].to_string();
                let opts = words.get(3..).unwrap_or(&[]);
                let ro = opts.contains(&"ro");
                let answer = if opts.contains(&"thread") {
                    std::thread::spawn(move || open_with(&path, &how, ro))
                        .join()
                        .unwrap_or(Err(libc::EIO))
                } else {
                    open_with(&path, &how, ro)
                };
                let _ = match answer {
                    Ok(fd) => writeln!(out, "ok {fd}"),
                    Err(errno) => writeln!(out, "error {errno}"),
                };
                let _ = out.flush();
                continue;
            }
            Some("flood") if words.len() == 4 => {
                let n = words[1].parse::<usize>().unwrap_or(0);
                match hold_fds(n) {
                    Ok(held) => {
                        let _ = writeln!(out, "ok");
                        let _ = out.flush();
                        flood(words[2], words[3], held)
                    }
                    Err(e) => {
                        let _ = writeln!(out, "error {e}");
                        let _ = out.flush();
                        continue;
                    }
                }
            }
            Some("exit") => {
                remove_mem_file();
                std::process::exit(n(1) as i32 * (words.len() > 1) as i32)
            }
            Some(other) => {
                let _ = writeln!(out, "error unknown command {other}");
                let _ = out.flush();
                continue;
            }
            None => continue,
        }
        let _ = writeln!(out, "ok");
        let _ = out.flush();
    }
    remove_mem_file();
}

/// Opens `path` read-write with the raw syscall `how` (open, openat or openat2); the fd stays open.
fn open_with(path: &str, how: &str, ro: bool) -> Result<i32, i32> {
    let c = CString::new(path).map_err(|_| libc::EINVAL)?;
    let mode = if ro { libc::O_RDONLY } else { libc::O_RDWR };
    let flags = (mode | libc::O_CLOEXEC) as libc::c_long;
    // SAFETY: raw open-family syscalls on a NUL-terminated path (and an open_how on the stack).
    let fd = unsafe {
        match how {
            #[cfg(target_arch = "x86_64")]
            "open" => libc::syscall(libc::SYS_open, c.as_ptr(), flags, 0),
            "openat2" => {
                // struct open_how { u64 flags; u64 mode; u64 resolve; }
                let open_how: [u64; 3] = [flags as u64, 0, 0];
                libc::syscall(
                    libc::SYS_openat2,
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    open_how.as_ptr(),
                    size_of::<[u64; 3]>(),
                )
            }
            "openat" => libc::syscall(libc::SYS_openat, libc::AT_FDCWD, c.as_ptr(), flags, 0),
            _ => return Err(libc::ENOSYS),
        }
    };
    if fd < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    } else {
        Ok(fd as i32)
    }
}

/// CLOCK_BOOTTIME now, in ns.
/// Raises the soft fd limit as far as needed (within the hard one) and holds `n` dups of
/// /dev/null.
fn hold_fds(n: usize) -> std::io::Result<Vec<File>> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(n as u64 + 64);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    let null = File::open("/dev/null")?;
    (0..n).map(|_| null.try_clone()).collect()
}

/// Tries to open `path` for ever (it should fail), 100 µs apart, writing the number of tries to
/// `count_file` every 1024. `held` stays open all along.
fn flood(path: &str, count_file: &str, held: Vec<File>) -> ! {
    let c = CString::new(path).unwrap_or_else(|_| usage("flood: bad path"));
    let mut tries: u64 = 0;
    loop {
        // SAFETY: a NUL-terminated path; a successful open's fd is closed at once.
        let fd =
            unsafe { libc::openat(libc::AT_FDCWD, c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd >= 0 {
            // SAFETY: the fd just opened.
            unsafe { libc::close(fd) };
        }
        tries += 1;
        std::thread::sleep(Duration::from_micros(100));
        if tries.is_multiple_of(1024) {
            let _ = std::fs::write(count_file, tries.to_string());
            std::hint::black_box(&held);
        }
    }
}

fn boot_time_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn write_mem(path: &str, bytes: u64) -> std::io::Result<()> {
    let tmp = format!("{path}.tmp");
    std::fs::write(&tmp, bytes.to_string())?;
    std::fs::rename(&tmp, path)
}

fn remove_mem_file() {
    let p = MEM_FILE.load(Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: a NUL-terminated path leaked for the life of the process.
        unsafe { libc::unlink(p) };
    }
}

extern "C" fn on_usr1(_: libc::c_int) {
    // Only async-signal-safe calls: the message is built on the stack, written with write(2).
    let mut buf = [0u8; 64];
    let head = b"fake-gpu-proc ";
    let tail = b": SIGUSR1 received\n";
    let mut n = 0;
    for &b in head {
        buf[n] = b;
        n += 1;
    }
    // SAFETY: getpid(2) is async-signal-safe.
    let mut pid = unsafe { libc::getpid() } as u32;
    let mut digits = [0u8; 10];
    let mut d = 0;
    loop {
        digits[d] = b'0' + (pid % 10) as u8;
        d += 1;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    while d > 0 {
        d -= 1;
        buf[n] = digits[d];
        n += 1;
    }
    for &b in tail {
        buf[n] = b;
        n += 1;
    }
    // SAFETY: write(2) of a stack buffer to stderr.
    unsafe { libc::write(2, buf.as_ptr().cast(), n) };
}

extern "C" fn on_stop(sig: libc::c_int) {
    remove_mem_file();
    // SAFETY: _exit(2) is async-signal-safe.
    unsafe { libc::_exit(128 + sig) };
}

fn install_signal_handlers() {
    // SAFETY: installing handlers that only make async-signal-safe calls.
    unsafe {
        libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(sig, on_stop as *const () as libc::sighandler_t);
        }
    }
}

fn issue(fd: i32, cmd: u32, n: u64, wrapped: bool) {
    let mut payload = [0u8; 64];
    let xfer = IoctlXfer {
        cmd: NV_ESC_RM_ALLOC,
        size: 48,
        ptr: payload.as_mut_ptr() as u64,
    };
    let arg: *const u8 = if wrapped {
        (&xfer as *const IoctlXfer).cast()
    } else {
        payload.as_ptr()
    };
    for _ in 0..n {
        // The fake node has /dev/null's numbers: the call fails with ENOTTY, which is fine; the
        // tracepoint has already seen it.
        unsafe { libc::ioctl(fd, cmd as _, arg) };
    }
}

fn usage(msg: &str) -> ! {
    if !msg.is_empty() {
        eprintln!("fake-gpu-proc: {msg}");
    }
    eprintln!(
        "usage: gpushare-fake-gpu-proc [--device PATH]... [--mem-dir DIR --mem BYTES [--mem-device N] [--grow-to BYTES --grow-after SECS]] [--no-stdin]\n  (commands on stdin: ioctl N | alloc N | talloc | xfer N | open PATH [open|openat|openat2] [thread] | mem DIR DEV BYTES | exit [CODE])"
    );
    std::process::exit(2)
}
