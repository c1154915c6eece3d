//! The scenario's `cuda` section: every knob parses, bad ones are errors that name the field (and
//! carry a line and column when serde finds them), and the pid helpers the mock libcuda uses.

use gpushare_fake_driver::cuda::{ProcessState, code};
use gpushare_fake_driver::scenario::parse;
use std::collections::BTreeSet;
use std::path::Path;

fn err(text: &str) -> (String, Option<(usize, usize)>) {
    let e = parse(text, Path::new("/s.json")).unwrap_err();
    (e.to_string(), e.line_column())
}

#[test]
fn every_knob_parses() {
    let s = parse(
        r#"{ "devices": [], "cuda": {
            "checkpoint_delay_ms": 5, "restore_delay_ms": 6, "persistence_mode": true,
            "fail": { "cuCheckpointProcessLock": 999, "cuInit": 100 },
            "processes": { "42": { "lock_timeout": true,
                                   "checkpoint_error": { "code": 801 },
                                   "restore_error": { "code": 304, "state": "failed" },
                                   "checkpoint_delay_ms": 1, "restore_delay_ms": 2 } } } }"#,
        Path::new("/s.json"),
    )
    .unwrap();
    let p = s.cuda.process(42);
    assert!(p.lock_timeout);
    assert_eq!(
        p.checkpoint_error.unwrap().code.get(),
        code::ERROR_NOT_SUPPORTED
    );
    assert_eq!(p.checkpoint_error.unwrap().state, None);
    assert_eq!(p.restore_error.unwrap().state, Some(ProcessState::Failed));
    assert_eq!(s.cuda.process(43), Default::default());
    assert_eq!(s.cuda.fail.get("cuInit").map(|c| c.get()), Some(100));
}

#[test]
fn bad_knobs_are_errors_naming_the_field() {
    let (m, at) = err("{\n \"cuda\": { \"checkpoint_dealy_ms\": 1 }\n}");
    assert!(
        m.contains("checkpoint_dealy_ms") && m.contains("/s.json"),
        "{m}"
    );
    assert_eq!(at.map(|(l, _)| l), Some(2));

    let (m, at) =
        err(r#"{ "cuda": { "processes": { "1": { "checkpoint_error": { "code": 12345 } } } } }"#);
    assert!(
        m.contains("CUresult 12345 is not an error code this mock knows"),
        "{m}"
    );
    assert!(
        m.contains("801 CUDA_ERROR_NOT_SUPPORTED"),
        "lists the known codes: {m}"
    );
    assert!(at.is_some());
    let (m, _) = err(r#"{ "cuda": { "fail": { "cuInit": 0 } } }"#);
    assert!(m.contains("CUresult 0 is not an error code"), "{m}");
    let (m, _) = err(r#"{ "cuda": { "fail": { "cuCheckpointProcessFreeze": 1 } } }"#);
    assert!(
        m.contains("\"cuCheckpointProcessFreeze\" is not a function this mock can fail"),
        "{m}"
    );
    let (m, _) = err(r#"{ "cuda": { "fail": { "cuGetErrorString": 1 } } }"#);
    assert!(m.contains("not a function this mock can fail"), "{m}");
    let (m, _) = err(r#"{ "cuda": { "processes": { "abc": {} } } }"#);
    assert!(m.contains("expected key to be a number"), "{m}");

    let (m, at) = err(
        r#"{ "cuda": { "processes": { "7": { "checkpoint_error": { "code": 801, "state": "checkpointed" } } } } }"#,
    );
    assert!(
        m.contains("cuda.processes.7.checkpoint_error.state")
            && m.contains("one of: locked, failed"),
        "{m}"
    );
    assert_eq!(at, None, "a validation error, after parsing");
    let (m, _) = err(
        r#"{ "cuda": { "processes": { "7": { "restore_error": { "code": 2, "state": "running" } } } } }"#,
    );
    assert!(m.contains("one of: checkpointed, failed"), "{m}");
    let (m, _) = err(r#"{ "cuda": { "checkpoint_delay_ms": 600001 } }"#);
    assert!(
        m.contains("cuda.checkpoint_delay_ms: 600001 ms exceeds 600000 ms"),
        "{m}"
    );
    let (m, _) = err(r#"{ "cuda": { "processes": { "7": { "restore_delay_ms": 700000 } } } }"#);
    assert!(m.contains("cuda.processes.7.restore_delay_ms"), "{m}");
    let (m, _) = err(r#"{ "cuda": { "processes": { "0": {} } } }"#);
    assert!(m.contains("cuda.processes.0: not a valid pid"), "{m}");
    let (m, _) = err(r#"{ "cuda": { "processes": { "3000000000": {} } } }"#);
    assert!(m.contains("not a valid pid"), "{m}");
}

#[test]
fn gpu_pids_memory_and_hidden_pids() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("9.1"), "300").unwrap();
    let text = format!(
        r#"{{ "process_memory_dir": {:?}, "devices": [
             {{ "uuid": "a", "name": "a", "memory_total": 1000,
                "compute_processes": [ {{ "pid": 7, "used_memory": 100 }}, {{ "pid": 8, "used_memory": null }} ],
                "graphics_processes": [ {{ "pid": 7, "used_memory": 150 }} ] }},
             {{ "uuid": "b", "name": "b", "memory_total": 1000 }} ] }}"#,
        dir.path()
    );
    let mut s = parse(&text, Path::new("/s.json")).unwrap();
    assert_eq!(s.gpu_pids(), BTreeSet::from([7, 8, 9]));
    assert_eq!(s.process_memory(7), [(0, 150)]);
    assert_eq!(s.process_memory(9), [(1, 300)]);
    assert_eq!(s.process_memory(10), []);
    assert_eq!(s.memory(0).used_by_processes, 150);
    s.hidden_pids = BTreeSet::from([7, 9]);
    assert_eq!(
        s.compute_processes(0)
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>(),
        [8]
    );
    assert!(s.graphics_processes(0).is_empty());
    assert!(
        s.compute_processes(1).is_empty(),
        "process_memory_dir entries hide too"
    );
    assert_eq!(s.memory(0).used_by_processes, 0);
    assert_eq!(s.memory(0).free, 1000);
    assert_eq!(
        s.gpu_pids(),
        BTreeSet::from([7, 8, 9]),
        "hidden pids are still known"
    );
    assert_eq!(s.process_memory(7), [(0, 150)]);
}

/// Without graphics processes the counters are summed without a map (every sample of every
/// device): the same figures, `process_memory_dir` overrides included.
#[test]
fn memory_of_compute_processes_alone() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("7.0"), "250").unwrap();
    std::fs::write(dir.path().join("9.0"), "300").unwrap();
    let text = format!(
        r#"{{ "process_memory_dir": {:?}, "devices": [
             {{ "uuid": "a", "name": "a", "memory_total": 1000, "memory_reserved": 100,
                "compute_processes": [ {{ "pid": 7, "used_memory": 100 }}, {{ "pid": 8, "used_memory": null }} ] }} ] }}"#,
        dir.path()
    );
    let mut s = parse(&text, Path::new("/s.json")).unwrap();
    let m = s.memory(0);
    assert_eq!((m.used_by_processes, m.free, m.reserved), (550, 350, 100));
    std::fs::write(dir.path().join("9.0"), "900").unwrap();
    let m = s.memory(0);
    assert_eq!(
        (m.used_by_processes, m.free),
        (900, 0),
        "at most what is not reserved"
    );
    s.hidden_pids = BTreeSet::from([9]);
    assert_eq!(s.memory(0).used_by_processes, 250);
}

#[test]
fn memory_without_a_process_memory_dir_leaves_out_hidden_pids() {
    let text = r#"{ "devices": [ { "uuid": "a", "name": "a", "memory_total": 1000,
        "compute_processes": [ { "pid": 7, "used_memory": 100 }, { "pid": 8, "used_memory": null }, { "pid": 9, "used_memory": 50 } ],
        "graphics_processes": [ { "pid": 9, "used_memory": 500 } ] } ] }"#;
    let mut s = parse(text, Path::new("/s.json")).unwrap();
    assert_eq!(s.memory(0).used_by_processes, 600, "pid 9 once, its larger");
    s.hidden_pids = BTreeSet::from([9]);
    assert_eq!(s.memory(0).used_by_processes, 100);
    s.hidden_pids = BTreeSet::from([7]);
    assert_eq!(s.memory(0).used_by_processes, 500);
}
