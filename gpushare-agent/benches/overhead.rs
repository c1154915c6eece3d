//! Syscall overhead of gpushare's eBPF programs, measured side by side in one run.
//!
//! Each round measures the same operations with no programs attached ("bare") and with the agent's
//! programs loaded, for a non-GPU task and for a GPU task (this process after opening a fake nvidia
//! node). Rounds alternate so drift hits both sides; the table shows medians over rounds.
//! Needs root; fails loudly rather than print a figure it could not measure.
//!
//! Run: `cargo bench -p gpushare-agent --bench overhead` (as root), or `cargo xtask bench`.

use std::{
    fs::OpenOptions,
    os::fd::AsRawFd,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use gpushare_agent::ebpf::{KernelPrograms, LoadOptions};
use gpushare_common::ioctl::{NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL, nv_iowr};
use gpushare_testkit::{FakeDeviceNode, unique};

const ROUNDS: usize = 5;
const IOCTLS: u32 = 200_000;
const OPENS: u32 = 50_000;
const SPAWNS: u32 = 200;

#[derive(Default)]
struct Series {
    bare: Vec<f64>,
    with: Vec<f64>,
}

fn main() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("overhead bench: FAILED: needs root to load eBPF programs; no figure printed");
        std::process::exit(1);
    }
    let node = FakeDeviceNode::create(&unique("bench")).expect("fake nvidia node");
    let mut rows: Vec<(&str, &str, Series)> = vec![
        ("ioctl", "non-GPU", Series::default()),
        ("ioctl (RM_CONTROL shape)", "GPU", Series::default()),
        ("ioctl (RM_ALLOC shape)", "GPU", Series::default()),
        ("openat + close", "non-GPU", Series::default()),
        ("fork + exec /bin/true", "non-GPU", Series::default()),
        ("fork + exec + nvidia open", "GPU", Series::default()),
    ];
    let fake_proc = gpushare_testkit::target_profile_dir().join("gpushare-fake-gpu-proc");
    let fake_proc = fake_proc.exists().then_some(fake_proc).or_else(|| {
        // `cargo bench` builds into target/release; the fake process may only exist in debug.
        let p = gpushare_testkit::target_profile_dir().join("../debug/gpushare-fake-gpu-proc");
        p.exists().then_some(p)
    });
    let Some(fake_proc) = fake_proc else {
        eprintln!(
            "overhead bench: FAILED: gpushare-fake-gpu-proc is not built (run `cargo build`)"
        );
        std::process::exit(1);
    };
    for round in 0..ROUNDS {
        eprint!("\rround {}/{ROUNDS}", round + 1);
        for with in [false, true] {
            let programs =
                with.then(|| KernelPrograms::load(&LoadOptions::default()).expect("load programs"));
            let null = OpenOptions::new().read(true).open("/dev/null").unwrap();
            let m = [
                per_call(IOCTLS, || unsafe {
                    libc::ioctl(null.as_raw_fd(), libc::TCGETS as _, 0)
                }),
                0.0,
                0.0,
                per_call(OPENS, || {
                    let f = OpenOptions::new().read(true).open("/etc/hostname");
                    drop(f);
                    0
                }),
                per_call(SPAWNS, || spawn(Path::new("/bin/true"), &[])),
                per_call(SPAWNS, || {
                    spawn(&fake_proc, &["--device", node.path().to_str().unwrap()])
                }),
            ];
            // Now become a GPU task: open the fake nvidia node.
            let gpu = OpenOptions::new()
                .read(true)
                .write(true)
                .open(node.path())
                .unwrap();
            let mut arg = [0u8; 64];
            let control = per_call(IOCTLS, || unsafe {
                libc::ioctl(
                    gpu.as_raw_fd(),
                    nv_iowr(NV_ESC_RM_CONTROL, 32) as _,
                    arg.as_mut_ptr(),
                )
            });
            let alloc = per_call(IOCTLS, || unsafe {
                libc::ioctl(
                    gpu.as_raw_fd(),
                    nv_iowr(NV_ESC_RM_ALLOC, 48) as _,
                    arg.as_mut_ptr(),
                )
            });
            if let Some(p) = &programs {
                assert!(
                    p.gpu_tasks().iter().any(|(t, _)| *t == std::process::id()),
                    "the bench process was not recognised as a GPU task"
                );
            }
            drop(gpu);
            drop(programs);
            for (i, v) in [m[0], control, alloc, m[3], m[4], m[5]]
                .into_iter()
                .enumerate()
            {
                let s = &mut rows[i].2;
                if with { s.with.push(v) } else { s.bare.push(v) }
            }
        }
    }
    eprintln!();
    println!("eBPF overhead per call, median of {ROUNDS} alternating rounds (ns)");
    println!(
        "{:<28} {:<8} {:>12} {:>16} {:>8}",
        "operation", "task", "bare", "with programs", "ratio"
    );
    for (op, task, s) in &rows {
        let (b, w) = (median(&s.bare), median(&s.with));
        println!("{op:<28} {task:<8} {b:>12.1} {w:>16.1} {:>7.2}x", w / b);
    }
}

fn spawn(bin: &Path, args: &[&str]) -> i32 {
    let status = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("spawn");
    assert!(status.success(), "{} failed", bin.display());
    0
}

fn per_call(n: u32, mut f: impl FnMut() -> i32) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(f());
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
