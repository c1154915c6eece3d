//! Syscall overhead of gpushare's eBPF programs, measured side by side in one run.
//!
//! Each round measures the same operations with no programs attached ("bare") and with programs
//! loaded, for a non-GPU task and for a GPU task (this process after opening a fake nvidia node).
//! A fake GPU process stays resident the whole time, so the kernel's GPU task table is never empty
//! (as on a real GPU node). Configurations alternate within a round, in a rotating order, so drift
//! hits every side; a figure is the median over rounds of the best of a few batches in a round.
//!
//! - default: bare against the probe set the agent ships (`ebpf::PROBE_SETS[0]`);
//! - `--variants`: bare against every probe set of `ebpf::PROBE_SETS` and the sched programs alone
//!   (the comparison table in docs/performance.md).
//!
//! `--agent-bins A:B` adds agent binaries as configurations (each runs, with its own programs, against
//! an empty mock GPU while the operations are measured): an older build's, for a before and after.
//! `--sets 'NAME;NAME'` measures only those (with bare); `--rounds N` sets the rounds.
//! `GPUSHARE_BENCH_QUICK=1`: one round, few iterations, figures not to be judged (a smoke run).
//! Needs root; fails loudly rather than print a figure it could not measure.
//!
//! Run: `cargo bench -p gpushare-agent --bench overhead [-- --variants]` (as root), or
//! `cargo xtask bench`.

use std::{
    fs::OpenOptions,
    os::fd::AsRawFd,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use gpushare_agent::ebpf::{KernelPrograms, LoadOptions, PROBE_SETS};
use gpushare_common::ioctl::{
    IoctlXfer, NV_ESC_IOCTL_XFER_CMD, NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL, nv_iowr,
};
use gpushare_testkit::{FakeDeviceNode, FakeGpuProcess, unique};

/// `NVOS54_PARAMETERS` (open-gpu-kernel-modules, `src/common/sdk/nvidia/inc/nvos.h`): the
/// argument of `NV_ESC_RM_CONTROL`, the most frequent RM escape. 32 bytes, so libcuda passes it
/// directly (`_IOWR('F', 0x2A, 32)` = 0xc020462a); only arguments over the platform's ioctl size
/// field go through `NV_ESC_IOCTL_XFER_CMD`.
#[repr(C)]
#[derive(Default)]
struct Nvos54 {
    h_client: u32,
    h_object: u32,
    cmd: u32,
    flags: u32,
    params: u64,
    params_size: u32,
    status: u32,
}

/// `NVOS64_PARAMETERS`: the argument of `NV_ESC_RM_ALLOC` (44 bytes, 48 with alignment).
#[repr(C)]
#[derive(Default)]
struct Nvos64 {
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    h_class: u32,
    alloc_params: u64,
    rights: u64,
    params_size: u32,
    flags: u32,
    status: u32,
}

/// `NV_ESC_RM_VID_HEAP_CONTROL`: an escape whose argument is too large for the ioctl size field,
/// so it comes wrapped in `NV_ESC_IOCTL_XFER_CMD` (the probe must read the wrapper to see it is
/// not an allocation).
const NV_ESC_RM_VID_HEAP_CONTROL: u32 = 0x4A;

#[derive(Clone, Copy)]
struct Sizes {
    rounds: usize,
    fast: u32,
    opens: u32,
    spawns: u32,
}

struct Op {
    name: &'static str,
    task: &'static str,
}

const OPS: &[Op] = &[
    Op {
        name: "getpid (no probe wants it)",
        task: "non-GPU",
    },
    Op {
        name: "ioctl (TCGETS)",
        task: "non-GPU",
    },
    Op {
        name: "openat + close",
        task: "non-GPU",
    },
    Op {
        name: "fork + exec /bin/true",
        task: "non-GPU",
    },
    Op {
        name: "ioctl (RM_CONTROL, 32 B)",
        task: "GPU",
    },
    Op {
        name: "ioctl (XFER-wrapped, no alloc)",
        task: "GPU",
    },
    Op {
        name: "ioctl (RM_ALLOC, 48 B)",
        task: "GPU",
    },
    Op {
        name: "fork + exec + nvidia open",
        task: "GPU",
    },
];

struct Config {
    name: String,
    programs: Option<Vec<&'static str>>,
    /// An agent binary to run instead (its own programs, e.g. an older build's, for a before and
    /// after in one run).
    agent: Option<std::path::PathBuf>,
    /// Whether the programs must see the GPU tasks (a probe set; not a floor).
    check: bool,
    /// Per op, one figure per round.
    results: Vec<Vec<f64>>,
}

impl Config {
    /// The bench itself loading `programs` (none: bare), with no results yet.
    fn loading(name: impl Into<String>, programs: Option<&[&'static str]>, check: bool) -> Self {
        Self {
            name: name.into(),
            programs: programs.map(<[_]>::to_vec),
            agent: None,
            check,
            results: vec![Vec::new(); OPS.len()],
        }
    }
}

/// A panic, not `exit`: destructors still remove the cgroups, device nodes and processes.
fn fail(msg: &str) -> ! {
    panic!("overhead bench: FAILED: {msg}; no figure printed");
}

fn main() {
    if unsafe { libc::geteuid() } != 0 {
        fail("needs root to load eBPF programs");
    }
    let args: Vec<String> = std::env::args().collect();
    // `--sets 'A;B'`: only these configurations (probe sets or floors, by name), with bare.
    let only_sets: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--sets")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(';').map(str::to_string).collect());
    let variants = only_sets.is_some() || args.iter().any(|a| a == "--variants");
    let rounds_arg: Option<usize> = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok());
    let quick = std::env::var_os("GPUSHARE_BENCH_QUICK").is_some();
    let sizes = if quick {
        Sizes {
            rounds: 1,
            fast: 5_000,
            opens: 1_000,
            spawns: 10,
        }
    } else {
        Sizes {
            rounds: rounds_arg.unwrap_or(5),
            fast: 300_000,
            opens: 50_000,
            spawns: 200,
        }
    };
    let node = FakeDeviceNode::create(&unique("bench")).expect("fake nvidia node");
    let fake_proc = gpushare_testkit::workspace_bin("gpushare-fake-gpu-proc");
    if !fake_proc.exists() {
        fail("gpushare-fake-gpu-proc is not built (run `cargo build`)");
    }
    let mut configs = vec![Config::loading("bare", None, false)];
    if variants {
        // Floors: the sched programs alone; a syscall tracepoint no operation here makes (open(2):
        // Rust opens with openat), i.e. the syscall slow path every syscall takes once anything
        // hooks sys_enter; an empty program on every syscall (tp_btf).
        for (name, progs) in [
            (
                "sched only",
                &["sched_process_exec", "sched_process_exit"][..],
            ),
            ("floor: tp on open(2)", &["sys_enter_open"][..]),
            ("floor: empty tp_btf", &["floor_btf_sys_enter"][..]),
        ] {
            configs.push(Config::loading(name, Some(progs), false));
        }
        for (name, progs, _) in PROBE_SETS {
            configs.push(Config::loading(*name, Some(progs), true));
        }
    } else {
        configs.push(Config::loading(
            format!("with programs ({})", PROBE_SETS[0].0),
            Some(PROBE_SETS[0].1),
            true,
        ));
    }
    if let Some(only) = &only_sets {
        if let Some(unknown) = only.iter().find(|n| !configs.iter().any(|c| &c.name == *n)) {
            fail(&format!("no configuration named {unknown:?}"));
        }
        configs.retain(|c| c.programs.is_none() || only.contains(&c.name));
    }
    // `--agent-bins A:B`: each agent binary runs as a configuration of its own.
    if let Some(bins) = args
        .iter()
        .position(|a| a == "--agent-bins")
        .and_then(|i| args.get(i + 1))
    {
        for bin in std::env::split_paths(bins) {
            if !bin.exists() {
                fail(&format!("no agent binary {}", bin.display()));
            }
            let name = format!("agent {}", bin.display());
            configs.push(Config {
                agent: Some(bin),
                ..Config::loading(name, None, false)
            });
        }
    }
    let n = configs.len();
    let mut foreign = std::collections::BTreeSet::new();
    for round in 0..sizes.rounds {
        for k in 0..n {
            // Rotate the order each round: no configuration always runs first or last.
            let c = &mut configs[(k + round) % n];
            foreign.extend(foreign_bpf(&[]));
            eprint!("\rround {}/{}: {:<24}", round + 1, sizes.rounds, c.name);
            let agent = c.agent.as_deref().map(RunningAgent::start);
            let m = measure(c.programs.as_deref(), c.check, &node, &fake_proc, sizes);
            drop(agent);
            for (i, v) in m.into_iter().enumerate() {
                c.results[i].push(v);
            }
        }
    }
    eprintln!();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "eBPF overhead per call, ns: median of {} rounds (best of 5 batches each), configurations alternating{}; load average {}",
        sizes.rounds,
        if quick {
            " [QUICK MODE: figures not to be judged]"
        } else {
            ""
        },
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    foreign.extend(foreign_bpf(&[]));
    if foreign.is_empty() {
        println!("no other process held eBPF programs during the run");
    } else {
        println!(
            "WARNING: other processes held eBPF programs during the run (their probes are in every figure, \"bare\" included): {}",
            foreign.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    if variants {
        print_variants(&configs);
        println!();
        for (name, _, what) in PROBE_SETS {
            println!("  {name}: {what}");
        }
    } else {
        print_default(&configs);
    }
}

fn print_default(configs: &[Config]) {
    println!(
        "{:<32} {:<8} {:>12} {:>16} {:>8} {:>10}",
        "operation", "task", "bare", "with programs", "ratio", "added ns"
    );
    for (i, op) in OPS.iter().enumerate() {
        let (b, w) = (
            median(&configs[0].results[i]),
            median(&configs[1].results[i]),
        );
        println!(
            "{:<32} {:<8} {b:>12.1} {w:>16.1} {:>7.2}x {:>10.1}",
            op.name,
            op.task,
            w / b,
            w - b
        );
    }
}

fn print_variants(configs: &[Config]) {
    print!("{:<32} {:<8} {:>9}", "operation", "task", "bare");
    for c in &configs[1..] {
        print!(" {:>22}", c.name);
    }
    println!();
    for (i, op) in OPS.iter().enumerate() {
        let b = median(&configs[0].results[i]);
        print!("{:<32} {:<8} {b:>9.1}", op.name, op.task);
        for c in &configs[1..] {
            let w = median(&c.results[i]);
            print!(" {:>22}", format!("{:+.1} ({:.2}x)", w - b, w / b));
        }
        println!();
    }
}

/// Every op once under `programs` (none: bare). Returns ns per call, in `OPS` order.
fn measure(
    programs: Option<&[&'static str]>,
    check: bool,
    node: &FakeDeviceNode,
    fake_proc: &Path,
    s: Sizes,
) -> Vec<f64> {
    let loaded = programs.map(|p| {
        KernelPrograms::load(&LoadOptions {
            only: Some(p.to_vec()),
            ..LoadOptions::default()
        })
        .unwrap_or_else(|e| fail(&format!("loading programs {p:?}: {e:#}")))
    });
    // A resident GPU task (started after the load, so the programs see its open): the kernel's
    // table is not empty, as on any GPU node.
    let resident = FakeGpuProcess::spawn(None, &[node.path()], &[])
        .unwrap_or_else(|e| fail(&format!("starting a fake GPU process: {e:#}")));
    let null = OpenOptions::new().read(true).open("/dev/null").unwrap();
    let mut out = vec![
        best_of(s.fast, || unsafe { libc::syscall(libc::SYS_getpid) as i32 }),
        best_of(s.fast, || unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            libc::ioctl(null.as_raw_fd(), libc::TCGETS as _, &mut t)
        }),
        best_of(s.opens, || {
            let f = OpenOptions::new().read(true).open("/etc/hostname");
            drop(f);
            0
        }),
        per_call(s.spawns, || spawn(Path::new("/bin/true"), &[])),
    ];
    // Now become a GPU task: open the fake nvidia node.
    let gpu = OpenOptions::new()
        .read(true)
        .write(true)
        .open(node.path())
        .unwrap();
    let mut control = Nvos54 {
        params_size: 16,
        ..Default::default()
    };
    let mut control_params = [0u8; 16];
    control.params = control_params.as_mut_ptr() as u64;
    out.push(best_of(s.fast, || unsafe {
        libc::ioctl(
            gpu.as_raw_fd(),
            nv_iowr(NV_ESC_RM_CONTROL, size_of::<Nvos54>() as u32) as _,
            &mut control,
        )
    }));
    let mut heap = [0u8; 512];
    let xfer = IoctlXfer {
        cmd: NV_ESC_RM_VID_HEAP_CONTROL,
        size: heap.len() as u32,
        ptr: heap.as_mut_ptr() as u64,
    };
    out.push(best_of(s.fast, || unsafe {
        libc::ioctl(
            gpu.as_raw_fd(),
            nv_iowr(NV_ESC_IOCTL_XFER_CMD, size_of::<IoctlXfer>() as u32) as _,
            &xfer,
        )
    }));
    let mut alloc = Nvos64::default();
    out.push(best_of(s.fast, || unsafe {
        libc::ioctl(
            gpu.as_raw_fd(),
            nv_iowr(NV_ESC_RM_ALLOC, size_of::<Nvos64>() as u32) as _,
            &mut alloc,
        )
    }));
    out.push(per_call(s.spawns, || {
        spawn(fake_proc, &["--device", node.path().to_str().unwrap()])
    }));
    if let Some(p) = &loaded
        && check
    {
        let tasks = p.gpu_tasks();
        for pid in [std::process::id(), resident.pid()] {
            if !tasks.iter().any(|(t, _)| *t == pid) {
                fail(&format!(
                    "{pid} was not recognised as a GPU task under {programs:?}"
                ));
            }
        }
        let me = p.ioctl_counts(std::process::id()).unwrap_or_default();
        if me.calls < 3 * u64::from(s.fast) {
            fail(&format!(
                "the GPU ioctls were not all counted under {programs:?}: {} of {}",
                me.calls,
                3 * s.fast
            ));
        }
    }
    drop(gpu);
    drop(resident);
    drop(loaded);
    out
}

/// An agent binary running against an empty mock GPU, stopped on drop.
struct RunningAgent {
    child: std::process::Child,
    dir: std::path::PathBuf,
    _scenario: gpushare_testkit::nvml::Scenario,
}

impl RunningAgent {
    fn start(bin: &Path) -> Self {
        let lib = gpushare_testkit::nvml::fake_nvml_lib();
        let scenario =
            gpushare_testkit::nvml::Scenario::create(&serde_json::json!({ "devices": [] }))
                .unwrap_or_else(|e| fail(&format!("mock NVML scenario: {e:#}")));
        let dir = gpushare_testkit::agent_dir("overhead-agent", "");
        let listen = format!("127.0.0.1:{}", gpushare_testkit::free_port());
        let child =
            gpushare_testkit::agent_command(bin, Some(&lib), scenario.path(), &dir, &listen, "1s")
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| fail(&format!("starting {}: {e}", bin.display())));
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while gpushare_agent::client::request(
            &gpushare_agent::client::Endpoint::Tcp(&listen),
            "GET",
            "/healthz",
            None,
        )
        .map(|r| r.0)
        .ok()
            != Some(200)
        {
            if Instant::now() > deadline {
                fail(&format!("{} did not become ready", bin.display()));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Self {
            child,
            dir,
            _scenario: scenario,
        }
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Other processes holding eBPF programs or links (e.g. another agent or test run), as "pid comm".
fn foreign_bpf(ours: &[u32]) -> Vec<String> {
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || ours.contains(&pid) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| {
                let t = t.to_string_lossy();
                t == "anon_inode:bpf-prog" || t == "anon_inode:bpf_link"
            })
        });
        if holds {
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            out.push(format!("{pid} {}", comm.trim()));
        }
    }
    out
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

/// ns per call: the best of 5 batches of `n / 5` calls (the least disturbed by other tenants).
fn best_of(n: u32, mut f: impl FnMut() -> i32) -> f64 {
    (0..5)
        .map(|_| per_call((n / 5).max(1), &mut f))
        .fold(f64::INFINITY, f64::min)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
