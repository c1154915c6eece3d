//! Quota files (`quotas.toml` and drop-ins) and the size parser must never panic, and their errors
//! must always be located.
//!
//! Input: the text of a quota file (invalid UTF-8 is replaced, as a lossy reader would). Besides the
//! file as a whole, every line and the whole input go through `parse_size`.
#![no_main]

use gpushare_agent::{
    attribution::parse_cgroup_path,
    quota::{
        ByteSize, DeviceRef, EnvQuota, GrantSource, LocatedError, QuotaSet, QuotaSource, Tolerance,
        WorkloadMeta, fmt_duration, parse_size, parse_str,
    },
};
use libfuzzer_sys::fuzz_target;

const ORIGIN: &str = "/etc/gpushare/quotas.toml";

const ID: &str = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";
const UID: &str = "0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a";

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    check_sizes(&text);
    check_file(&text);
});

/// `parse_size` on the whole input and on each line; a parsed size shown by `ByteSize` (exact by
/// design) parses back to the same number of bytes.
fn check_sizes(text: &str) {
    for s in std::iter::once(text).chain(text.lines().take(64)) {
        match parse_size(s) {
            Ok(n) => {
                let shown = ByteSize(n).to_string();
                assert_eq!(parse_size(&shown), Ok(n), "{s:?} -> {n} -> {shown:?}");
                assert_eq!(parse_size(&format!("{n}B")), Ok(n));
                // The parser trims its input.
                assert_eq!(parse_size(&format!(" {s}\t")), Ok(n));
                let _ = ByteSize(n).approx();
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

fn check_errors(errors: &[LocatedError]) {
    assert!(!errors.is_empty(), "an Err carries at least one error");
    for e in errors {
        let loc = &e.location;
        assert_eq!(loc.file, ORIGIN);
        assert!(loc.line >= 1 && loc.col >= 1, "{loc:?}");
        let shown = e.to_string();
        let prefix = format!("{ORIGIN}:{}:{}: ", loc.line, loc.col);
        assert!(shown.starts_with(&prefix), "{shown:?}");
    }
}

fn check_file(text: &str) {
    let lines = text.matches('\n').count() + 1;
    let file = match parse_str(text, ORIGIN) {
        Ok(file) => file,
        Err(errors) => {
            check_errors(&errors);
            // Errors come in file order, and point into the file.
            assert!(
                errors.windows(2).all(|w| {
                    (w[0].location.line, w[0].location.col)
                        <= (w[1].location.line, w[1].location.col)
                }),
                "{errors:?}"
            );
            assert!(
                errors.iter().all(|e| e.location.line <= lines),
                "{errors:?}"
            );
            // `QuotaSet::parse` is `parse_str` then `build`: the same errors.
            assert_eq!(QuotaSet::parse(text, ORIGIN).err(), Some(errors));
            return;
        }
    };
    assert_eq!(file.origin, ORIGIN);
    for e in &file.entries {
        for at in [&e.origin, &e.selector_at] {
            assert!(at.file == ORIGIN && at.line >= 1 && at.col >= 1 && at.line <= lines);
        }
    }

    let set = QuotaSet::build(file.clone(), Vec::new());
    assert_eq!(set.clone(), QuotaSet::parse(text, ORIGIN));
    // The same file as its own drop-in: every entry is a duplicate and `[defaults]` is not allowed
    // there, so this loads only when the file has neither.
    let twice = QuotaSet::build(file.clone(), vec![file.clone()]);
    if let Err(errors) = &twice {
        check_errors(errors);
    }
    assert_eq!(
        twice.is_ok(),
        set.is_ok() && file.entries.is_empty() && file.defaults.is_none(),
    );
    // As a drop-in after an empty main file: `[defaults]` is the only new way to fail.
    let has_defaults = file.defaults.is_some();
    let dropin = QuotaSet::build(parse_str("", "main.toml").unwrap(), vec![file]);
    if let Err(errors) = &dropin {
        check_errors(errors);
    }
    assert_eq!(dropin.is_ok(), set.is_ok() && !has_defaults);

    let set = match set {
        Ok(set) => set,
        Err(errors) => {
            check_errors(&errors);
            return;
        }
    };
    check_set(&set);
}

fn check_set(set: &QuotaSet) {
    let rows = set.describe();
    assert_eq!(rows.len(), set.entries().len());
    let defaults = set.defaults();
    let _ = defaults.enforcement.ladder_text();
    let _ = ByteSize(defaults.elastic_reserve).to_string();
    let _ = set.protect_patterns();
    for e in set.entries() {
        assert_eq!(e.origin.file, ORIGIN);
        let shown = ByteSize(e.gpu_memory).to_string();
        assert_eq!(parse_size(&shown), Ok(e.gpu_memory), "{shown}");
        let enf = &e.enforcement;
        match enf.tolerance {
            Tolerance::Percent(h) => assert!(h <= 10_000, "{h}"),
            Tolerance::Bytes(b) => assert_eq!(parse_size(&enf.tolerance.to_string()), Ok(b)),
        }
        let _ = enf.tolerance.allowance(e.gpu_memory);
        let _ = fmt_duration(enf.grace);
        // A ladder escalates: rank and `after` never decrease.
        assert!(
            enf.ladder
                .windows(2)
                .all(|w| w[0].action.rank() <= w[1].action.rank() && w[0].after <= w[1].after),
            "{:?}",
            enf.ladder
        );
        let _ = enf.ladder_text();
        let _ = e.selector.describe();
        let _ = e.selector.specificity();
    }

    let env = EnvQuota {
        sources: GrantSource::Hami.into(),
        per_gpu: vec![(DeviceRef::Index(0), 1 << 30)],
        each_gpu: Some(2 << 30),
    };
    for path in [
        format!("/docker/{ID}"),
        format!("/kubepods/burstable/pod{UID}/{ID}"),
        format!("/kubepods/burstable/pod{UID}"),
        "/system.slice/render.service".to_string(),
        "/gpushare.slice/job-1/train".to_string(),
        "/".to_string(),
    ] {
        let mut w = WorkloadMeta::new(parse_cgroup_path(&path));
        for names in [false, true] {
            if names {
                w.container_name = Some("server".into());
                w.pod_namespace = Some("ml".into());
                w.pod_name = Some("inference-0".into());
            }
            let _ = set.is_protected(&w);
            let named = set.named_by_file(&w);
            // Without an env quota only a file entry can give a quota.
            let q = set.resolve(&w, None);
            assert_eq!(q.is_some(), named, "{path}");
            if w.id.is_host() {
                assert!(!named, "the host is never named");
            }
            if let Some(q) = set.resolve(&w, Some(&env)) {
                assert!(!q.limits.is_empty());
                assert_eq!(matches!(q.source, QuotaSource::File { .. }), named);
                let _ = q.source.to_string();
            }
        }
    }
}
