//! The attribution pipeline against the real kernel: two cgroups, fake GPU processes opening a
//! fake nvidia node and issuing ioctls, the eBPF programs and the agent's table.

use std::time::{Duration, Instant};

use gpushare_agent::{
    attribution::{CgroupResolver, Change, Source, WorkloadKind, cgroupfs, tracker::Tracker},
    ebpf::{KernelPrograms, LoadOptions},
};
use gpushare_testkit::{FakeDeviceNode, FakeGpuProcess, nvml::Scenario, unique};

use crate::util::{AgentProcess, agent_dir, kernel_holds, one_gpu, poll_until, workload};
use crate::util::{group, needs_root};

fn tracker(min_interval_ns: u64) -> Tracker {
    let opts = LoadOptions {
        alloc_event_min_interval_ns: min_interval_ns,
        only: None,
        events_bytes: None,
    };
    let kernel = KernelPrograms::load(&opts).expect("eBPF programs load (root, BTF)");
    let root = cgroupfs::find_cgroup2_mount().expect("cgroup2 mounted");
    Tracker::with_kernel(kernel, CgroupResolver::new(root))
}

#[test]
fn ebpf_attributes_gpu_tasks_to_their_cgroups_counts_ioctls_and_forgets_exits() {
    needs_root!("ebpf_attributes_gpu_tasks");
    // Rate limit of 50 ms: a burst of allocations yields one prompt event, not one per call.
    let mut tracker = tracker(50_000_000);
    let node = FakeDeviceNode::create(&unique("attr")).unwrap();
    let cg_a = group("a");
    let cg_b = group("b");

    let mut a = FakeGpuProcess::spawn(Some(&cg_a), &[node.path()], &[]).unwrap();
    let mut b = FakeGpuProcess::spawn(Some(&cg_b), &[node.path()], &[]).unwrap();
    let (pa, pb) = (a.pid(), b.pid());
    // A process that never opens a device stays unknown, even in the same cgroup.
    let bystander = FakeGpuProcess::spawn(Some(&cg_a), &[], &[]).unwrap();

    let seen = poll_until(&mut tracker, Duration::from_secs(5), |t, _| {
        t.table().get(pa).is_some() && t.table().get(pb).is_some()
    });
    assert!(
        seen.contains(&Change::Added(pa)),
        "open of A seen: {seen:?}"
    );
    assert!(
        seen.contains(&Change::Added(pb)),
        "open of B seen: {seen:?}"
    );
    assert!(
        tracker.table().get(bystander.pid()).is_none(),
        "non-GPU task tracked"
    );

    for (pid, cg) in [(pa, &cg_a), (pb, &cg_b)] {
        let t = tracker.table().get(pid).unwrap();
        assert_eq!(t.identity.pid, pid);
        assert_eq!(t.cgroup_id, cg.id(), "cgroup id of {pid}");
        assert_eq!(
            t.cgroup_path.as_deref(),
            Some(cg.rel_path()),
            "cgroup path of {pid}"
        );
        let w = t.workload.as_ref().unwrap();
        assert_eq!(w.kind, WorkloadKind::Cgroup);
        assert_eq!(w.key(), format!("cgroup://{}", cg.rel_path()));
        assert_eq!(
            t.comm, "gpushare-fake-g",
            "comm is the kernel's 15-byte name"
        );
        assert_eq!(t.source, Source::Ebpf);
    }

    // ioctls: A issues 2000 plain + 20 direct allocations, B 1000 plain + 10 wrapped allocations.
    a.command("ioctl 2000").unwrap();
    a.command("alloc 20").unwrap();
    b.command("ioctl 1000").unwrap();
    b.command("xfer 10").unwrap();
    let seen = poll_until(&mut tracker, Duration::from_secs(5), |_, seen| {
        seen.contains(&Change::AllocHint(pa)) && seen.contains(&Change::AllocHint(pb))
    });
    assert!(
        seen.contains(&Change::AllocHint(pa)),
        "direct RM_ALLOC reported: {seen:?}"
    );
    assert!(
        seen.contains(&Change::AllocHint(pb)),
        "wrapped RM_ALLOC reported: {seen:?}"
    );
    tracker.refresh_ioctl_counts();
    let ta = tracker.table().get(pa).unwrap();
    let tb = tracker.table().get(pb).unwrap();
    assert_eq!(ta.alloc_ioctls, 20);
    assert_eq!(tb.alloc_ioctls, 10);
    // Every ioctl of the task is counted; the runtime may add a handful of its own (e.g. TCGETS).
    within_a_few_percent(ta.ioctls, 2020);
    within_a_few_percent(tb.ioctls, 1010);
    // The burst was rate limited to a few events, not 20.
    assert!(
        (1..20).contains(&ta.alloc_events),
        "alloc events of A: {}",
        ta.alloc_events
    );

    // Exit: A ends normally, B is killed. Both are forgotten, and so are their kernel counts.
    a.finish().unwrap();
    b.kill();
    let seen = poll_until(&mut tracker, Duration::from_secs(5), |t, _| {
        t.table().get(pa).is_none() && t.table().get(pb).is_none()
    });
    assert!(
        seen.contains(&Change::Removed(pa)) && seen.contains(&Change::Removed(pb)),
        "{seen:?}"
    );
    let kernel = tracker.kernel().unwrap();
    assert!(kernel.ioctl_counts(pa).is_none() && kernel.ioctl_counts(pb).is_none());
    assert!(!kernel.gpu_tasks().iter().any(|(t, _)| *t == pa || *t == pb));
    assert_eq!(tracker.kernel_counters().events_lost, 0);
    drop(bystander);
}

fn within_a_few_percent(got: u64, want: u64) {
    let lo = want;
    let hi = want + want / 20 + 10;
    assert!(
        (lo..=hi).contains(&got),
        "ioctl count {got}, expected {want} (+5%)"
    );
}

#[test]
fn gpu_task_that_moves_cgroup_is_reattributed_on_its_next_allocation() {
    needs_root!("gpu_task_that_moves_cgroup");
    let mut tracker = tracker(0);
    let node = FakeDeviceNode::create(&unique("move")).unwrap();
    let from = group("from");
    let to = group("to");
    let mut p = FakeGpuProcess::spawn(Some(&from), &[node.path()], &[]).unwrap();
    let pid = p.pid();
    poll_until(&mut tracker, Duration::from_secs(5), |t, _| {
        t.table().get(pid).is_some()
    });
    assert_eq!(
        tracker.table().get(pid).unwrap().cgroup_path.as_deref(),
        Some(from.rel_path())
    );
    std::fs::write(to.procs_file(), pid.to_string()).unwrap();
    p.command("alloc 1").unwrap();
    poll_until(&mut tracker, Duration::from_secs(5), |t, _| {
        t.table()
            .get(pid)
            .and_then(|e| e.cgroup_path.clone())
            .as_deref()
            == Some(to.rel_path())
    });
    assert_eq!(tracker.table().get(pid).unwrap().cgroup_id, to.id());
}

#[test]
fn procfs_fallback_attributes_pids_and_reconcile_forgets_dead_ones() {
    needs_root!("procfs_fallback");
    let root = cgroupfs::find_cgroup2_mount().unwrap();
    let mut tracker = Tracker::procfs_only(CgroupResolver::new(root), "test".into());
    let cg = group("procfs");
    let p = FakeGpuProcess::spawn(Some(&cg), &[], &[]).unwrap();
    let pid = p.pid();
    let entry = tracker
        .table_mut()
        .attribute_pid(pid)
        .cloned()
        .expect("attributed");
    assert_eq!(entry.cgroup_path.as_deref(), Some(cg.rel_path()));
    assert_eq!(entry.cgroup_id, cg.id());
    assert_eq!(entry.source, Source::Procfs);
    assert!(tracker.poll().is_empty(), "no kernel events without eBPF");
    // The process dies with no exit event: reconciliation notices.
    p.kill();
    let report = tracker.reconcile();
    assert_eq!(report.removed, vec![pid]);
    assert!(tracker.table().get(pid).is_none());
    assert!(
        tracker.table_mut().attribute_pid(pid).is_none(),
        "a dead pid is not attributed"
    );
}

/// A suspension's checkpointed process holds no device and NVML lists none of it: the next agent
/// tracks it from the record, by pid and start time (a reused pid is not taken).
#[test]
fn a_recorded_process_without_a_device_is_tracked_only_under_its_own_start_time() {
    needs_root!("a_recorded_process_without_a_device_is_tracked");
    let root = cgroupfs::find_cgroup2_mount().unwrap();
    let mut tracker = Tracker::procfs_only(CgroupResolver::new(root), "test".into());
    let cg = group("recorded");
    let p = crate::util::sleeping(&cg);
    let id = gpushare_agent::attribution::procinfo::snapshot(p.pid())
        .unwrap()
        .identity;
    let reused = gpushare_agent::attribution::ProcessIdentity {
        start_ticks: id.start_ticks + 1,
        ..id
    };
    assert_eq!(tracker.track_processes(&[reused]), 0, "another process");
    assert!(tracker.table().get(p.pid()).is_none());
    assert_eq!(tracker.track_processes(&[id]), 1);
    let entry = tracker.table().get(p.pid()).expect("tracked");
    assert_eq!(entry.identity, id);
    assert_eq!(entry.cgroup_path.as_deref(), Some(cg.rel_path()));
    assert_eq!(tracker.track_processes(&[id]), 0, "tracked already");
    assert!(tracker.reconcile().removed.is_empty(), "kept while it runs");
    assert!(tracker.table().get(p.pid()).is_some());
}

#[test]
fn reconcile_recovers_a_gpu_task_whose_open_event_was_missed() {
    needs_root!("reconcile_recovers");
    let node = FakeDeviceNode::create(&unique("pre")).unwrap();
    let cg = group("pre");
    // Started before the agent: no open event will ever arrive for it.
    let p = FakeGpuProcess::spawn(Some(&cg), &[node.path()], &[]).unwrap();
    let mut tracker = tracker(0);
    // Found at start by the /proc fd scan, and put in the kernel table so ioctls count.
    let t = tracker
        .table()
        .get(p.pid())
        .expect("bootstrapped from /proc");
    assert_eq!(t.cgroup_path.as_deref(), Some(cg.rel_path()));
    assert!(kernel_holds(&tracker, p.pid()));
    let pid = p.pid();
    p.kill();
    // Its exit event is delivered (it is in the kernel table now).
    poll_until(&mut tracker, Duration::from_secs(5), |t, _| {
        t.table().get(pid).is_none()
    });
    assert!(tracker.table().get(pid).is_none());
}

/// An allocation ioctl makes the agent re-sample at once, not at its next periodic sample: with a
/// 30 s interval, the usage the mock reports after an `alloc` shows within a few seconds (a bound
/// that tells "at once" from "30 s later", not a speed claim), and the agent's log says the
/// re-sample was asked for by this process's allocation (another test's device open also makes
/// the agent re-sample, and could otherwise satisfy the first check alone).
#[test]
fn an_allocation_ioctl_makes_the_agent_re_sample_at_once() {
    needs_root!("an_allocation_ioctl_makes_the_agent_re_sample_at_once");
    const GIB: u64 = 1 << 30;
    const INTERVAL: Duration = Duration::from_secs(30);
    const BOUND: Duration = Duration::from_secs(3);
    let node = FakeDeviceNode::create(&unique("resample")).unwrap();
    let cg = group("resample");
    let mut p = FakeGpuProcess::spawn(Some(&cg), &[node.path()], &[]).unwrap();
    let key = format!("cgroup://{}", cg.rel_path());
    let sc = Scenario::create(&one_gpu(&[(p.pid(), GIB)])).unwrap();
    let started = Instant::now();
    let agent = AgentProcess::start_in(agent_dir(""), &sc, &[], "30s");
    let used = |s: &gpushare_agent::snapshot::Snapshot| {
        workload(s, &key, "GPU-loop").map(|w| w.used_bytes)
    };
    // The first sample, at start, sees 1 GiB.
    agent.wait_for(Duration::from_secs(5), |s| used(s) == Some(GIB));
    // The process allocates: the mock now reports 3 GiB, and its RM_ALLOC ioctl is traced.
    sc.write(&one_gpu(&[(p.pid(), 3 * GIB)])).unwrap();
    let t = Instant::now();
    p.command("alloc 1").unwrap();
    // Another process's device open at the same moment (as another test's would be): it too
    // makes the agent re-sample, so the usage alone does not prove which event did.
    let _other = FakeGpuProcess::spawn(None, &[node.path()], &[]).unwrap();
    agent.wait_for(BOUND, |s| used(s) == Some(3 * GIB));
    assert!(
        started.elapsed() < INTERVAL - BOUND,
        "inconclusive: the periodic sample may have come ({:?} since the start)",
        started.elapsed()
    );
    // Any GPU task's event (another test's device open) also makes the agent re-sample: the
    // agent must say that this one was asked for by this process's allocation.
    let ours = format!("an allocation ioctl of GPU task {}", p.pid());
    assert!(
        agent
            .log()
            .lines()
            .any(|l| l.contains("re-sample wanted by") && l.contains(&ours)),
        "no re-sample was asked for by the allocation of {} (another process's event re-sampled)\n{}",
        p.pid(),
        agent.log()
    );
    eprintln!("re-sampled {:?} after the allocation", t.elapsed());
}

#[test]
fn reconcile_replaces_a_confirmed_task_whose_pid_was_reused_while_its_events_waited() {
    needs_root!("reconcile_replaces_a_reused_pid");
    let mut tracker = tracker(0);
    let node = FakeDeviceNode::create(&unique("reuse")).unwrap();
    let first = FakeGpuProcess::spawn(None, &[node.path()], &[]).unwrap();
    let pid = first.pid();
    poll_until(&mut tracker, Duration::from_secs(5), |t, _| {
        t.table().get(pid).is_some()
    });
    let old = tracker
        .table()
        .get(pid)
        .expect("first process seen")
        .identity;
    // A reconcile confirms it (and remembers its kernel entry, so the next one may skip /proc).
    assert!(!tracker.reconcile().removed.contains(&pid));
    // It lives a while, as GPU processes do: start times have clock-tick resolution (10 ms), and a
    // reuse within the same tick would be the same identity.
    crate::util::wait_clock_tick_after_start(pid);
    // It exits and its pid goes to a new GPU process, with no event applied in between (as when
    // the ring buffer overflowed): only the kernel table tells.
    first.kill();
    let mut second = None;
    for _ in 0..50 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
        let p = FakeGpuProcess::spawn(None, &[node.path()], &[]).unwrap();
        if p.pid() == pid {
            second = Some(p);
            break;
        }
    }
    let second = second.expect("could not make the pid be reused in 50 tries");
    // (Other tests' GPU processes come and go too: only this pid is looked at.)
    let report = tracker.reconcile();
    assert!(report.removed.contains(&pid), "the old process is gone");
    assert!(
        report.added.contains(&pid),
        "the new one is found in the kernel table"
    );
    let now = tracker.table().get(pid).unwrap().identity;
    assert_ne!(
        now.start_ticks, old.start_ticks,
        "the table holds the new process"
    );
    assert_eq!(
        now,
        gpushare_agent::attribution::procinfo::snapshot(pid)
            .unwrap()
            .identity
    );
    drop(second);
}

#[test]
fn every_open_syscall_and_a_thread_make_a_gpu_task_and_a_failed_open_does_not() {
    needs_root!("every_open_syscall");
    let mut tracker = tracker(0);
    let node = FakeDeviceNode::create(&unique("opens")).unwrap();
    let path = node.path().to_str().unwrap().to_string();
    // A directory and a missing node whose names match /dev/nvidia*: their opens fail.
    let dir = format!("/dev/nvidia-gpushare-test-{}", unique("dir"));
    std::fs::create_dir(&dir).unwrap();
    let missing = format!("/dev/nvidia-gpushare-test-{}", unique("missing"));
    let spawn = || FakeGpuProcess::spawn(None, &[], &[]).unwrap();
    let mut opened = Vec::new();
    for how in [
        "open",
        "openat",
        "openat2",
        "openat thread",
        "openat2 thread",
    ] {
        let mut p = spawn();
        p.send(&format!("open {path} {how}")).unwrap();
        let answer = p.read_answer().unwrap();
        assert!(answer.starts_with("ok "), "{how}: {answer}");
        opened.push((how, p));
    }
    let mut failed = Vec::new();
    for (target, errno) in [(&dir, libc::EISDIR), (&missing, libc::ENOENT)] {
        for how in ["openat", "openat thread"] {
            let mut p = spawn();
            p.send(&format!("open {target} {how}")).unwrap();
            assert_eq!(
                p.read_answer().unwrap(),
                format!("error {errno}"),
                "{target} {how}"
            );
            // ioctls after a failed open are not a GPU task's either.
            p.command("ioctl 10").unwrap();
            failed.push(p);
        }
    }
    // A last GPU task, so that once it is seen every earlier event has been drained too.
    let mut last = spawn();
    last.send(&format!("open {path} openat")).unwrap();
    assert!(last.read_answer().unwrap().starts_with("ok "));
    let seen = poll_until(&mut tracker, Duration::from_secs(5), |t, _| {
        t.table().get(last.pid()).is_some()
    });
    for (how, p) in &opened {
        assert!(
            seen.contains(&Change::Added(p.pid())),
            "open through {how} not seen: {seen:?}"
        );
        assert_eq!(tracker.table().get(p.pid()).unwrap().source, Source::Ebpf);
    }
    let kernel_tasks = tracker.kernel().unwrap().gpu_tasks();
    for p in &failed {
        assert!(
            tracker.table().get(p.pid()).is_none(),
            "a failed open made {} a GPU task",
            p.pid()
        );
        assert!(
            !kernel_tasks.iter().any(|(t, _)| *t == p.pid()),
            "a failed open left {} in the kernel table",
            p.pid()
        );
        assert!(tracker.kernel().unwrap().ioctl_counts(p.pid()).is_none());
    }
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn an_open_still_in_progress_is_waited_for_and_counts_once_it_succeeds() {
    needs_root!("an_open_still_in_progress");
    let mut tracker = tracker(0);
    // A FIFO named like an nvidia node: opening it read-only blocks until a writer comes, as a
    // first open of a real GPU can take long.
    let fifo = format!("/dev/nvidia-gpushare-test-{}", unique("fifo"));
    let c = std::ffi::CString::new(fifo.clone()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut p = FakeGpuProcess::spawn(None, &[], &[]).unwrap();
    let pid = p.pid();
    p.send(&format!("open {fifo} openat ro")).unwrap();
    // The open is entered and stays blocked: the task is neither taken nor dropped.
    let seen = poll_until(&mut tracker, Duration::from_millis(600), |_, _| false);
    assert!(!seen.contains(&Change::Added(pid)), "{seen:?}");
    assert!(tracker.table().get(pid).is_none());
    // Where opens are checked on their exit (the agent's probes), nothing is recorded before the
    // result; where they are sent on their entry, the kernel entry of an open in progress stays.
    assert_eq!(
        kernel_holds(&tracker, pid),
        tracker
            .kernel()
            .is_some_and(|k| k.sends_unconfirmed_opens()),
        "the kernel entry of an open in progress"
    );
    // A writer lets the open complete: now it is a GPU task.
    let writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    assert!(p.read_answer().unwrap().starts_with("ok "));
    let seen = poll_until(&mut tracker, Duration::from_secs(5), |t, _| {
        t.table().get(pid).is_some()
    });
    assert!(seen.contains(&Change::Added(pid)), "{seen:?}");
    drop(writer);
    std::fs::remove_file(&fifo).unwrap();
}

/// A tenant that keeps opens of an nvidia-named path blocked (a FIFO named `/dev/nvidia-…` in its
/// own mount namespace, opened by 1,100 readers with no writer) fills no table the kernel needs:
/// a GPU task that opens a device node afterwards is still seen on its open.
#[test]
fn opens_a_tenant_keeps_blocked_do_not_hide_a_new_gpu_task() {
    use std::os::unix::process::CommandExt;
    needs_root!("opens_a_tenant_keeps_blocked_do_not_hide_a_new_gpu_task");
    const BLOCKED: usize = 1100;
    let mut tracker = tracker(50_000_000);
    let ready = std::env::temp_dir().join(unique("blocked-ready"));
    let script = format!(
        "mount -t tmpfs tenant /dev && mknod -m 666 /dev/null c 1 3 && mkfifo /dev/nvidia-tenant && i=0 && \
         while [ $i -lt {BLOCKED} ]; do cat /dev/nvidia-tenant & i=$((i+1)); done; \
         touch {}; wait",
        ready.display()
    );
    let tenant = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .process_group(0)
        .spawn()
        .expect("unshare runs");
    // The readers go with the test, passed or failed.
    struct KillGroup(std::process::Child);
    impl Drop for KillGroup {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the tenant's own process group.
            unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }
    let _kill = KillGroup(tenant);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ready.exists(), "the tenant's readers started");
    // Each reader is in its open (a FIFO's open waits for a writer).
    let in_open = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                std::fs::read_to_string(e.path().join("wchan"))
                    .is_ok_and(|w| w == "wait_for_partner")
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while in_open() < BLOCKED && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(in_open() >= BLOCKED, "{} readers in their open", in_open());
    let node = FakeDeviceNode::create(&unique("blocked")).unwrap();
    let cg = group("blocked");
    let p = FakeGpuProcess::spawn(Some(&cg), &[node.path()], &[]).unwrap();
    let pid = p.pid();
    let seen = poll_until(&mut tracker, Duration::from_secs(5), |t, _| {
        t.table().get(pid).is_some()
    });
    assert!(
        seen.contains(&Change::Added(pid)),
        "the open of GPU task {pid} was not seen with {BLOCKED} opens blocked: {seen:?}"
    );
    let _ = std::fs::remove_file(&ready);
}

/// The kernel counts every cgroup removed (what lets the agent skip looking at its limited
/// groups' inodes while none was): removing a group moves the count; without the program that
/// counts, nothing is claimed.
#[test]
fn the_kernel_counts_removed_cgroups() {
    needs_root!("the_kernel_counts_removed_cgroups");
    let tracker = tracker(0);
    let before = tracker
        .cgroups_removed()
        .expect("the agent's probe set counts removed cgroups");
    let cg = group("rmdir-count");
    drop(cg);
    let after = tracker.cgroups_removed().unwrap();
    assert!(
        after > before,
        "a cgroup was removed and the count did not move: {before} -> {after}"
    );
    let without = KernelPrograms::load(&LoadOptions {
        only: Some(vec!["sched_process_exec", "sched_process_exit"]),
        ..LoadOptions::default()
    })
    .unwrap();
    assert_eq!(without.cgroups_removed(), None);
}
