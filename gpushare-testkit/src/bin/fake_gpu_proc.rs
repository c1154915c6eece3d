//! A fake GPU process for gpushare's tests.
//!
//! Opens the device nodes given with `--device` (fake nvidia nodes with /dev/null's numbers), prints
//! `ready <pid>` and then obeys commands on stdin, one per line, answering `ok` to each:
//!
//! - `ioctl N`: N ioctls shaped like NV_ESC_RM_CONTROL (not allocations)
//! - `alloc N`: N ioctls shaped like NV_ESC_RM_ALLOC
//! - `xfer N`: N NV_ESC_RM_ALLOC requests wrapped in NV_ESC_IOCTL_XFER_CMD
//! - `mem DIR DEVICE BYTES`: write BYTES to `DIR/<pid>.<DEVICE>` (the mock NVML's per-process memory)
//! - `exit [CODE]`: exit
//!
//! End of input exits 0. Static-friendly: std and libc only.

use std::{
    fs::{File, OpenOptions},
    io::{BufRead, Write},
    os::fd::AsRawFd,
};

use gpushare_common::ioctl::{
    IoctlXfer, NV_ESC_IOCTL_XFER_CMD, NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL, nv_iowr,
};

fn main() {
    let mut devices = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => devices.push(
                args.next()
                    .unwrap_or_else(|| usage("--device needs a path")),
            ),
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
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
    let _ = writeln!(out, "ready {pid}");
    let _ = out.flush();
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
            Some("exit") => std::process::exit(n(1) as i32 * (words.len() > 1) as i32),
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
        "usage: gpushare-fake-gpu-proc [--device PATH]...  (commands on stdin: ioctl N | alloc N | xfer N | mem DIR DEV BYTES | exit [CODE])"
    );
    std::process::exit(2)
}
