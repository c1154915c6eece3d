//! Hostile tenants: nothing a tenant controls (fds, opens of missing nodes, cgroups) costs the
//! agent's loop more than a bounded amount, and no tenant reads another's details from an
//! endpoint it can reach. Tests count work (the agent's `attribution_work` totals) and steps
//! completed, never times.

use std::{
    os::unix::process::CommandExt,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use gpushare_agent::client::{Endpoint, request};
use gpushare_testkit::{
    FakeDeviceNode,
    nvml::Scenario,
    process::{Flooder, NOBODY},
    unique, workspace_bin,
};

use crate::util::{
    AgentProcess, Reaped, cgroup_quota, counter_value, group, needs_root, one_gpu, sleeper,
    sleeping_group, wait_until, workload,
};

const GIB: u64 = 1 << 30;
const FREEZE: &str = "[defaults]\ngrace = \"0s\"\nladder = [ { action = \"freeze\" } ]\n";
/// Flooding processes, and the fds each holds (the box's hard limit is 20,000).
const FLOODERS: usize = 8;
const FLOOD_FDS: usize = 19_000;
/// The most `/proc/<pid>/fd` entries one failed open may cost the agent: a constant, whatever the
/// number of fds the tenant holds (listing its table costs all of them, four times).
const FD_ENTRIES_PER_FAILED_OPEN: u64 = 4;
/// The least share of its sample interval's steps the agent completes under the flood.
const MIN_STEP_SHARE: f64 = 0.5;

/// NVML samples the agent has taken (one a step at its interval).
fn samples(agent: &AgentProcess) -> f64 {
    let (_, m) = agent.get("/metrics");
    counter_value(&m, "gpushare_sample_duration_seconds_count", "")
}

/// Problem 3 of issue 20: eight unprivileged processes with ~20k fds each keep failing to open a
/// made-up `/dev/nvidia*` path while a workload goes over quota. Checking an open must not cost
/// the agent a listing of the opener's fd table, and the agent keeps stepping at its interval.
#[test]
fn a_flood_of_failed_nvidia_opens_from_fd_heavy_tenants_costs_the_agent_a_bounded_amount() {
    needs_root!("a_flood_of_failed_nvidia_opens_from_fd_heavy_tenants");
    let (victim, vp) = sleeping_group("flood-victim");
    let sc = Scenario::create(&one_gpu(&[])).unwrap();
    let quotas = format!("{FREEZE}{}", cgroup_quota(&victim, "1GiB"));
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let before = agent.wait_next_step().counters.attribution_work;
    let missing = format!("/dev/nvidia-{}", unique("missing"));
    let flooders: Vec<Flooder> = (0..FLOODERS)
        .map(|i| {
            Flooder::spawn(
                &workspace_bin("gpushare-fake-gpu-proc"),
                &agent.dir,
                i,
                &missing,
                FLOOD_FDS,
            )
        })
        .collect();
    wait_until(
        Duration::from_secs(60),
        || "the flooders did not get going".into(),
        || flooders.iter().all(|f| f.tries() >= 1024),
    );
    let samples0 = samples(&agent);
    let t0 = Instant::now();
    sc.write(&one_gpu(&[(vp.pid(), 2 * GIB)])).unwrap();
    wait_until(
        Duration::from_secs(120),
        || format!("the victim was never frozen\n{}", agent.log()),
        || victim.is_frozen(),
    );
    let frozen_after = t0.elapsed();
    // Some more steps under the flood, so the share covers several intervals.
    let s = agent.steps_over(Duration::from_secs(2), |_| {});
    let elapsed = t0.elapsed();
    let steps = samples(&agent) - samples0;
    let after = s.counters.attribution_work;
    let d = |k: &str| after.get(k).unwrap_or(0) - before.get(k).unwrap_or(0);
    let tries: u64 = flooders.iter().map(Flooder::tries).sum();
    let share = steps / (elapsed.as_secs_f64() / 0.2);
    eprintln!(
        "flood: {tries} failed opens tried by {FLOODERS} tenants with {FLOOD_FDS} fds each; \
         agent: {} open checks, {} failed opens seen, {} fd entries read; frozen after {:.2} s; \
         {steps} samples in {:.2} s (share {share:.2})",
        d("open_checks"),
        d("failed_opens"),
        d("fd_entries_read"),
        frozen_after.as_secs_f64(),
        elapsed.as_secs_f64(),
    );
    assert!(tries > 0);
    assert!(
        d("fd_entries_read") <= FD_ENTRIES_PER_FAILED_OPEN * d("failed_opens"),
        "the agent read {} fd entries for {} failed opens (at most {FD_ENTRIES_PER_FAILED_OPEN} \
         each): it lists the tenants' fd tables",
        d("fd_entries_read"),
        d("failed_opens")
    );
    assert!(
        share >= MIN_STEP_SHARE,
        "the agent completed {steps} of the {:.0} steps of {:.2} s at 200 ms under the flood",
        elapsed.as_secs_f64() / 0.2,
        elapsed.as_secs_f64()
    );
    drop(flooders);
}

/// A network namespace the test makes, removed on drop.
struct NetNs(String);

impl NetNs {
    fn create(name: &str) -> Self {
        ip(&["netns", "add", name]);
        Self(name.to_string())
    }

    /// Moves the calling thread (and what it spawns from now on) into the namespace.
    fn enter(&self) {
        let f = std::fs::File::open(format!("/run/netns/{}", self.0)).unwrap();
        // SAFETY: setns(2) on an fd just opened; it changes this thread's namespace only.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {args:?}: {out:?}");
}

/// A GPU process in `cg` (it opens a fake nvidia node, so the agent logs its name) whose name
/// (comm) holds an escape sequence and a line break; the node and the directory of its
/// executable go with the guards.
fn oddly_named_gpu_process(
    cg: &gpushare_testkit::TestCgroup,
) -> (Reaped, gpushare_testkit::TempTree, FakeDeviceNode) {
    let node = FakeDeviceNode::create(&unique("odd-name")).unwrap();
    let dir = gpushare_testkit::TempTree::new("gpushare-odd-name");
    let exe = dir.path().join(ODD_NAME);
    (spawn_copy(cg, &exe, &node), dir, node)
}

/// The fake GPU process, copied to `exe`, started in `cg` opening `node`.
fn spawn_copy(
    cg: &gpushare_testkit::TestCgroup,
    exe: &std::path::Path,
    node: &FakeDeviceNode,
) -> Reaped {
    std::fs::copy(workspace_bin("gpushare-fake-gpu-proc"), exe).unwrap();
    // Another test's fork may hold the copy's write descriptor for a moment (ETXTBSY until its
    // child execs): tried again, bounded.
    let mut tries = 0;
    let child = loop {
        match cg.spawn(
            Command::new(exe)
                .arg("--device")
                .arg(node.path())
                .stdin(Stdio::piped())
                .stdout(Stdio::null()),
        ) {
            Err(e)
                if tries < 100
                    && e.downcast_ref::<std::io::Error>()
                        .and_then(std::io::Error::raw_os_error)
                        == Some(libc::ETXTBSY) =>
            {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => break r.unwrap(),
        }
    };
    Reaped(child)
}

/// 15 bytes, as the kernel keeps a comm: an escape sequence that clears the screen, a line break.
const ODD_NAME: &str = "a\x1b[2J\x1b[Hb\nc";

/// Problem 5 of issue 20: a process name a tenant chooses reaches the operator's terminal
/// (`status`) and the agent's log escaped, never as control characters.
#[test]
fn status_and_the_log_show_a_process_name_with_control_characters_escaped() {
    needs_root!("status_and_the_log_show_a_process_name_with_control_characters_escaped");
    let cg = group("odd-name");
    let sc = Scenario::create(&one_gpu(&[])).unwrap();
    let quotas = format!("{FREEZE}{}", cgroup_quota(&cg, "4GiB"));
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    // Started after the agent, so the agent sees its open and logs it by name.
    let (p, _dir, _node) = oddly_named_gpu_process(&cg);
    sc.write(&one_gpu(&[(p.pid(), GIB)])).unwrap();
    let s = agent.wait_for(Duration::from_secs(20), |s| {
        s.processes.iter().any(|q| q.pid == p.pid())
    });
    let row = s.processes.iter().find(|q| q.pid == p.pid()).unwrap();
    assert_eq!(
        row.comm, ODD_NAME,
        "the API keeps the name as the kernel has it (JSON escapes it)"
    );
    let out = Command::new(workspace_bin("gpushare-agent"))
        .arg("status")
        .arg("--socket")
        .arg(agent.socket())
        .output()
        .unwrap();
    assert!(out.status.success(), "status: {out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains(r"a\u{1b}[2J\u{1b}[Hb\nc"),
        "the name is not shown escaped:\n{table}"
    );
    assert!(
        !table.contains('\x1b'),
        "a raw escape reached the terminal:\n{table:?}"
    );
    assert!(
        table.lines().all(|l| !l.starts_with("c ")),
        "the name's line break started a row of its own:\n{table}"
    );
    // The agent logs the new GPU task with its name: escaped, its line break indented.
    let log = agent.log();
    assert!(
        log.contains(r"a\u{1b}[2J\u{1b}[Hb"),
        "the log does not show the name escaped:\n{log}"
    );
    assert!(!log.contains('\x1b'), "a raw escape reached the log");
    assert!(
        log.lines().all(|l| !l.starts_with("c)")),
        "the name's line break started a log line of its own:\n{log}"
    );
}

/// Problem 4 of issue 20: per-workload and per-process detail is served on the root-only socket
/// only. A user without privilege gets nothing from the socket, and loopback serves `/metrics`
/// (without per-process series unless turned on) and `/healthz`, never the state.
#[test]
fn a_user_without_privilege_gets_no_workload_detail_from_the_socket_or_loopback() {
    needs_root!("a_user_without_privilege_gets_no_workload_detail");
    let cg = group("detail");
    let (p, _dir, _node) = oddly_named_gpu_process(&cg);
    let sc = Scenario::create(&one_gpu(&[(p.pid(), GIB)])).unwrap();
    let quotas = format!("{FREEZE}{}", cgroup_quota(&cg, "4GiB"));
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    agent.wait_for(Duration::from_secs(20), |s| {
        s.processes.iter().any(|q| q.pid == p.pid())
    });
    // The socket: `status` as nobody cannot even connect.
    let out = Command::new(workspace_bin("gpushare-agent"))
        .arg("status")
        .arg("--json")
        .arg("--socket")
        .arg(agent.socket())
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    assert!(!out.status.success(), "status answered nobody: {out:?}");
    assert!(out.stdout.is_empty(), "nobody read: {out:?}");
    // Loopback, which any local user reaches: no state, no per-process series.
    let (code, body) = agent.get("/api/v1/state");
    assert_eq!(code, 404, "loopback serves the state: {body}");
    let (code, metrics) = agent.get("/metrics");
    assert_eq!(code, 200);
    assert!(
        !metrics.contains("gpushare_process_gpu_memory_used_bytes{")
            && !metrics.contains(&format!("pid=\"{}\"", p.pid())),
        "per-process series are on by default:\n{metrics}"
    );
    assert_eq!(agent.get("/healthz").0, 200);
    // The operator turns per-process series on.
    drop(agent);
    let agent = AgentProcess::start(&sc, &quotas, &["--process-metrics"]);
    agent.wait_for(Duration::from_secs(20), |s| {
        s.processes.iter().any(|q| q.pid == p.pid())
    });
    let (_, metrics) = agent.get("/metrics");
    assert!(
        metrics.contains(&format!("pid=\"{}\"", p.pid())),
        "--process-metrics shows no per-process series:\n{metrics}"
    );
    assert_eq!(agent.get("/api/v1/state").0, 404);
}

/// Problem 4 of issue 20: a listener on an address that is not loopback (two network namespaces
/// the test makes, a veth pair between them, the agent in one, the client in the other) answers
/// `/metrics` and `/healthz` only.
#[test]
fn a_listener_on_a_non_loopback_address_answers_metrics_and_health_only() {
    needs_root!("a_listener_on_a_non_loopback_address_answers_metrics_and_health_only");
    let tag = unique("ns");
    let (ns_agent, ns_client) = (
        NetNs::create(&format!("{tag}-a")),
        NetNs::create(&format!("{tag}-c")),
    );
    let (va, vc) = (
        format!("gsa{}", std::process::id() % 100_000),
        format!("gsc{}", std::process::id() % 100_000),
    );
    ip(&[
        "link",
        "add",
        &va,
        "netns",
        &ns_agent.0,
        "type",
        "veth",
        "peer",
        "name",
        &vc,
        "netns",
        &ns_client.0,
    ]);
    let net = 1 + std::process::id() % 250;
    let (addr_agent, addr_client) = (format!("10.213.{net}.1"), format!("10.213.{net}.2"));
    for (ns, dev, addr) in [
        (&ns_agent, &va, &addr_agent),
        (&ns_client, &vc, &addr_client),
    ] {
        ip(&[
            "-n",
            &ns.0,
            "addr",
            "add",
            &format!("{addr}/30"),
            "dev",
            dev,
        ]);
        ip(&["-n", &ns.0, "link", "set", dev, "up"]);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
    }
    let (cg, p) = sleeping_group("netns");
    let sc = Scenario::create(&one_gpu(&[(p.pid(), GIB)])).unwrap();
    let quotas = format!("{FREEZE}{}", cgroup_quota(&cg, "4GiB"));
    let listen = format!("{addr_agent}:{}", crate::util::free_port());
    let agent = std::thread::scope(|s| {
        s.spawn(|| {
            ns_agent.enter();
            let mut a = AgentProcess::unstarted(crate::util::agent_dir(&quotas), &sc, &[], "200ms");
            a.listen = listen.clone();
            a.restart();
            a
        })
        .join()
        .unwrap()
    });
    agent.wait_for(Duration::from_secs(20), |s| {
        s.processes.iter().any(|q| q.pid == p.pid())
    });
    let answers = std::thread::scope(|s| {
        s.spawn(|| {
            ns_client.enter();
            ["/metrics", "/healthz", "/api/v1/state", "/api/v1/release"].map(|path| {
                let (code, body) = request(&Endpoint::Tcp(&listen), "GET", path, None)
                    .unwrap_or_else(|e| panic!("GET {path} from the other namespace: {e:#}"));
                (path, code, body)
            })
        })
        .join()
        .unwrap()
    });
    let [metrics, health, state, release] = answers;
    assert_eq!(metrics.1, 200, "{metrics:?}");
    assert!(
        metrics
            .2
            .contains("gpushare_workload_gpu_memory_used_bytes")
    );
    assert!(!metrics.2.contains(&format!("pid=\"{}\"", p.pid())));
    assert_eq!(health.1, 200, "{health:?}");
    assert_eq!(state.1, 404, "the state is served off the node: {state:?}");
    assert_eq!(release.1, 404, "{release:?}");
    drop(agent);
}

/// A group below a test group whose name is bytes that are not UTF-8 (as any user may make below
/// its own delegated `user@UID.service`); its processes are killed and it is removed on drop.
struct ByteNamedGroup(std::path::PathBuf);

impl ByteNamedGroup {
    fn create(parent: &gpushare_testkit::TestCgroup, name: &[u8]) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let dir = parent.dir().join(std::ffi::OsStr::from_bytes(name));
        std::fs::create_dir(&dir).unwrap();
        Self(dir)
    }

    /// Moves `pid` into the group.
    fn adopt(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for ByteNamedGroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.freeze"), "0");
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        wait_until(
            Duration::from_secs(5),
            || format!("{} did not empty", self.0.display()),
            || std::fs::remove_dir(&self.0).is_ok(),
        );
    }
}

/// Issue 41: a name that is not UTF-8 hides no GPU memory. In a unit under a 2 GiB quota, one
/// GPU process is named with the byte 0xff (its executable is, so its comm is) and another sits
/// in a child group named 0xff; each uses 1.5 GiB, so the unit is over only if both are charged
/// to it. The agent once read `/proc/<pid>/status` and `/proc/<pid>/cgroup` as UTF-8, failed on
/// both, and charged neither: the unit ran at 3 GiB, never frozen.
#[test]
fn a_process_named_with_byte_0xff_and_one_in_a_0xff_group_are_charged_and_frozen() {
    needs_root!("a_process_named_with_byte_0xff_and_one_in_a_0xff_group_are_charged");
    let unit =
        gpushare_testkit::TestCgroup::create(&format!("{}.service", unique("bytes"))).unwrap();
    let unit_name = unit.rel_path().rsplit('/').next().unwrap().to_string();
    let key = format!("unit://{}", unit.rel_path());
    let quotas = format!("{FREEZE}\n[[quota]]\nunit = \"{unit_name}\"\ngpu_memory = \"2GiB\"\n");
    let sc = Scenario::create(&one_gpu(&[])).unwrap();
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let (named, _dir, _node) = gpu_process_named(&unit, b"gpu\xff\xfe");
    let child = ByteNamedGroup::create(&unit, b"\xff");
    let in_child = Reaped(unit.spawn(&mut sleeper()).unwrap());
    child.adopt(in_child.pid());
    assert!(
        std::fs::read(format!("/proc/{}/comm", named.pid()))
            .unwrap()
            .starts_with(b"gpu\xff\xfe"),
        "the kernel keeps the name's bytes"
    );
    let half = 3 * GIB / 2;
    sc.write(&one_gpu(&[(named.pid(), half), (in_child.pid(), half)]))
        .unwrap();
    let s = agent.wait_for(Duration::from_secs(20), |s| {
        workload(s, &key, "all").is_some_and(|w| w.state == "frozen")
    });
    assert!(unit.wait_frozen(true), "the unit is frozen at its root");
    let row = workload(&s, &key, "all").unwrap();
    assert_eq!(row.used_bytes, 3 * GIB, "both processes are charged");
    for pid in [named.pid(), in_child.pid()] {
        let p = s.processes.iter().find(|q| q.pid == pid).unwrap();
        assert_eq!(p.workload, key, "{p:?}");
    }
    let p = s.processes.iter().find(|q| q.pid == named.pid()).unwrap();
    assert_eq!(p.comm, "gpu\u{fffd}\u{fffd}", "the name, lossy for display");
}

/// A GPU process in `cg` whose executable, and so whose comm, is named `name` (bytes).
fn gpu_process_named(
    cg: &gpushare_testkit::TestCgroup,
    name: &[u8],
) -> (Reaped, gpushare_testkit::TempTree, FakeDeviceNode) {
    use std::os::unix::ffi::OsStrExt;
    let node = FakeDeviceNode::create(&unique("byte-name")).unwrap();
    let dir = gpushare_testkit::TempTree::new("gpushare-byte-name");
    let exe = dir.path().join(std::ffi::OsStr::from_bytes(name));
    (spawn_copy(cg, &exe, &node), dir, node)
}

/// `unshare` into a private mount namespace where a tmpfs is mounted at `point`, then exec the
/// arguments that follow: what a host with such a mount looks like, without touching the host's.
fn with_a_mount_at(point: &std::path::Path) -> Vec<std::ffi::OsString> {
    let mut w: Vec<std::ffi::OsString> = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        r#"mount -t tmpfs gpushare-odd-mount "$0" && exec "$@""#,
    ]
    .into_iter()
    .map(Into::into)
    .collect();
    w.push(point.as_os_str().to_owned());
    w
}

/// Issue 41: a mount whose path is not UTF-8, anywhere on the host (a FUSE mount any user may
/// make, an operator's Latin-1 share), stops neither the agent nor `thaw --all`. Both once read
/// `/proc/self/mountinfo` as UTF-8 and failed: the agent could not start (a crash loop under
/// systemd) and a crashed agent's freezes could not be undone. Here, in a private mount namespace
/// with a tmpfs at `.../m\xff`, the agent starts and freezes a workload over its quota, is
/// killed, and `thaw --all` in the same kind of namespace thaws it.
#[test]
fn a_mount_at_a_path_that_is_not_utf8_stops_neither_the_agent_nor_thaw_all() {
    needs_root!("a_mount_at_a_path_that_is_not_utf8_stops_neither_the_agent_nor_thaw_all");
    use std::os::unix::ffi::OsStrExt;
    let tree = gpushare_testkit::TempTree::new("gpushare-odd-mount");
    let point = tree.path().join(std::ffi::OsStr::from_bytes(b"m\xff"));
    std::fs::create_dir(&point).unwrap();
    let (cg, p) = sleeping_group("odd-mount");
    let sc = Scenario::create(&one_gpu(&[(p.pid(), 2 * GIB)])).unwrap();
    let quotas = format!("{FREEZE}{}", cgroup_quota(&cg, "1GiB"));
    let mut agent = AgentProcess::unstarted(crate::util::agent_dir(&quotas), &sc, &[], "200ms")
        .wrapped(&with_a_mount_at(&point));
    agent.restart();
    let pid = agent.pid().unwrap();
    let mounts = std::fs::read(format!("/proc/{pid}/mountinfo")).unwrap();
    assert!(
        mounts.windows(2).any(|w| w == b"m\xff"),
        "the agent does not see the odd mount"
    );
    wait_until(
        Duration::from_secs(20),
        || format!("the workload was never frozen\n{}", agent.log()),
        || cg.is_frozen(),
    );
    agent.sigkill();
    assert!(cg.is_frozen(), "the crash left the freeze in place");
    let mut thaw = Command::new(&with_a_mount_at(&point)[0]);
    thaw.args(&with_a_mount_at(&point)[1..])
        .arg(workspace_bin("gpushare-agent"))
        .args(["thaw", "--all", "--state-dir"])
        .arg(agent.dir.join("state"));
    let out = thaw.output().unwrap();
    assert!(
        out.status.success(),
        "thaw --all failed beside the odd mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(cg.wait_frozen(false), "thaw --all left the workload frozen");
    assert!(
        !std::fs::read("/proc/self/mountinfo")
            .unwrap()
            .windows(2)
            .any(|w| w == b"m\xff"),
        "the mount leaked into the host's namespace"
    );
}

/// Issue 41: a workload that dips under its quota for one sample in every few is frozen by the
/// step it dodged. Its ladder freezes after 2 s over; it is over for 1 s, then under for 0.3 s
/// (at least one sample of the agent's 200 ms), again and again. The agent once restarted the
/// clock at every compliant sample, so the workload, over quota three quarters of the time, was
/// never frozen; the clock now runs on through dips shorter than the cool-down.
#[test]
fn a_workload_dipping_under_its_quota_for_one_sample_in_every_few_is_frozen() {
    needs_root!("a_workload_dipping_under_its_quota_for_one_sample_in_every_few_is_frozen");
    let (cg, p) = sleeping_group("dodger");
    let sc = Scenario::create(&one_gpu(&[])).unwrap();
    let quotas = format!(
        "[defaults]\ngrace = \"0s\"\nladder = [ {{ action = \"freeze\", after = \"2s\" }} ]\n{}",
        cgroup_quota(&cg, "2GiB")
    );
    let agent = AgentProcess::start(&sc, &quotas, &[]);
    let t0 = Instant::now();
    let mut dips = 0;
    while !cg.is_frozen() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "never frozen after {dips} dips\n{}",
            agent.log()
        );
        sc.write(&one_gpu(&[(p.pid(), 3 * GIB)])).unwrap();
        std::thread::sleep(Duration::from_millis(1000));
        if cg.is_frozen() {
            break;
        }
        sc.write(&one_gpu(&[(p.pid(), GIB)])).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        dips += 1;
    }
    assert!(
        dips >= 1,
        "frozen before it ever dipped: the test proves nothing"
    );
}

/// Issue 41: a GPU process moved to another group (its pid written to that group's
/// `cgroup.procs`) is charged to its new group from the next step. It stayed charged to the old
/// one until it exec'd or allocated: the old group was frozen while the process ran on
/// elsewhere, and the new group's quota did not hold it. Here a 3 GiB process starts in a group
/// with room for it and is moved into one with a 2 GiB quota: that group is frozen, the old one
/// is not.
#[test]
fn a_gpu_process_moved_to_another_group_is_charged_to_the_new_one() {
    needs_root!("a_gpu_process_moved_to_another_group_is_charged_to_the_new_one");
    moved_and_charged(&[]);
}

/// The same without eBPF (`--no-ebpf`, the procfs fallback): no kernel program sees the move;
/// the reconcile (here every second) reads each GPU task's group again.
#[test]
fn without_ebpf_a_moved_gpu_process_is_charged_to_the_new_group_at_the_next_reconcile() {
    needs_root!("without_ebpf_a_moved_gpu_process_is_charged_to_the_new_group");
    moved_and_charged(&["--no-ebpf", "--reconcile-interval", "1s"]);
}

/// A 3 GiB process moved from a group with room for it into one with a 2 GiB quota, under an
/// agent started with `args`: the new group is frozen, the old one is not.
fn moved_and_charged(args: &[&str]) {
    let from = group("moved-from");
    let to = group("moved-to");
    let (from_key, to_key) = (
        format!("cgroup://{}", from.rel_path()),
        format!("cgroup://{}", to.rel_path()),
    );
    let quotas = format!(
        "{FREEZE}{}{}",
        cgroup_quota(&from, "8GiB"),
        cgroup_quota(&to, "2GiB")
    );
    let sc = Scenario::create(&one_gpu(&[])).unwrap();
    let agent = AgentProcess::start(&sc, &quotas, args);
    let (p, _dir, _node) = gpu_process_named(&from, b"mover");
    sc.write(&one_gpu(&[(p.pid(), 3 * GIB)])).unwrap();
    let charged_to = |s: &gpushare_agent::snapshot::Snapshot| {
        s.processes
            .iter()
            .find(|q| q.pid == p.pid())
            .map(|q| q.workload.clone())
    };
    agent.wait_for(Duration::from_secs(20), |s| {
        charged_to(s).as_deref() == Some(from_key.as_str())
    });
    std::fs::write(to.procs_file(), p.pid().to_string()).unwrap();
    let s = agent.wait_for(Duration::from_secs(20), |s| {
        workload(s, &to_key, "all").is_some_and(|w| w.state == "frozen")
    });
    assert_eq!(charged_to(&s).as_deref(), Some(to_key.as_str()));
    assert!(to.wait_frozen(true), "the new group is frozen at its root");
    assert!(!from.is_frozen(), "the old group is not frozen");
    assert!(
        workload(&s, &from_key, "all").is_none_or(|w| w.used_bytes == 0),
        "nothing is charged to the old group any more"
    );
}
