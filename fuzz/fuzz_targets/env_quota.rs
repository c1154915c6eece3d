//! A container's environment (GPUShare's and HAMi's quota variables) must never make the agent panic,
//! and no variable may remove or raise a limit another one sets.
//!
//! Input: the raw bytes of an environment block (NUL-separated `NAME=value`, as in
//! `/proc/<pid>/environ`), read with `parse_environ` and then `env_quota` under both GPUShare units.
#![no_main]

use gpushare_agent::{
    grants::env::{EnvQuotaReport, env_quota, parse_environ},
    quota::{EnvQuota, GpuInfo, GpuShareUnit, GrantSource},
};
use libfuzzer_sys::fuzz_target;

fn gpus() -> Vec<GpuInfo> {
    (0..2)
        .map(|i| GpuInfo {
            index: i,
            uuid: format!("GPU-{i}"),
            memory_total: 80 << 30,
            minor: Some(i),
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let env = parse_environ(data);
    let entries = data.split(|&b| b == 0).filter(|e| !e.is_empty()).count();
    assert!(env.len() <= entries);
    for (name, value) in &env {
        assert!(!name.contains('=') && !name.contains('\0'), "{name:?}");
        assert!(!value.contains('\0'), "{value:?}");
    }
    let pairs: Vec<(&str, &str)> = env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let gpus = gpus();

    let gib = env_quota(pairs.iter().copied(), GpuShareUnit::GiB, &gpus);
    let mib = env_quota(pairs.iter().copied(), GpuShareUnit::MiB, &gpus);
    check(&gib);
    check(&mib);

    // Every value counts and the smallest wins: repeating the environment changes no limit.
    let doubled = env_quota(
        pairs.iter().chain(pairs.iter()).copied(),
        GpuShareUnit::GiB,
        &gpus,
    );
    assert_eq!(doubled.quota, gib.quota);

    // HAMi's values carry their own units: the GPUShare unit does not matter to them.
    let hami =
        |r: &EnvQuotaReport| matches!(&r.quota, Some(q) if q.sources == GrantSource::Hami.into());
    if hami(&gib) && hami(&mib) {
        assert_eq!(gib.quota, mib.quota);
    }

    // An extra variable never removes or raises a limit.
    for extra in ["0", "junk", "1g"] {
        let mut more = pairs.clone();
        more.push(("CUDA_DEVICE_MEMORY_LIMIT", extra));
        more.push(("ALIYUN_COM_GPU_MEM_CONTAINER", extra));
        let with = env_quota(more.iter().copied(), GpuShareUnit::GiB, &gpus);
        if let Some(q) = &gib.quota {
            let Some(w) = &with.quota else {
                panic!("{extra:?} removed {q:?}");
            };
            if let Some(b) = q.each_gpu {
                assert!(w.each_gpu.is_some_and(|a| a <= b), "{q:?} -> {w:?}");
            }
            for (d, b) in &q.per_gpu {
                let a = w.per_gpu.iter().find(|(e, _)| e == d).map(|(_, a)| *a);
                assert!(a.is_some_and(|a| a <= *b), "{q:?} -> {w:?}");
            }
        }
    }
});

fn check(r: &EnvQuotaReport) {
    if let Some(q) = &r.quota {
        check_quota(q);
    }
    for e in &r.problems {
        assert!(e.value.chars().count() <= 64, "{e:?}");
        let shown = e.to_string();
        assert!(shown.starts_with(&format!("`{}=", e.var)), "{shown:?}");
    }
    let _ = r.unit_check.describe();
}

fn check_quota(q: &EnvQuota) {
    // Zero means "no limit": a quota has at least one limit, and none of them is zero.
    assert!(!q.per_gpu.is_empty() || q.each_gpu.is_some(), "{q:?}");
    assert!(q.per_gpu.iter().all(|(_, b)| *b > 0), "{q:?}");
    assert!(q.each_gpu.is_none_or(|b| b > 0), "{q:?}");
    // No device is limited twice, and the limit for every GPU caps each per-device one.
    for (i, (d, b)) in q.per_gpu.iter().enumerate() {
        assert!(q.per_gpu[..i].iter().all(|(e, _)| e != d), "{q:?}");
        assert!(q.each_gpu.is_none_or(|e| *b <= e), "{q:?}");
    }
    let _ = q.sources.as_str();
    for (d, _) in &q.per_gpu {
        let _ = d.to_string();
    }
}
