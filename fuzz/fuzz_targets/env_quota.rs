//! A workload's environment (GPUShare's and HAMi's quota variables) must never make the agent panic.
//!
//! Input: the raw bytes of `/proc/<pid>/environ` (NUL-separated `NAME=value`), read with
//! `parse_environ` and then `env_quota` under both GPUShare units.
#![no_main]

use gpushare_agent::quota::{
    EnvQuota, EnvQuotaError, EnvSource, GpuShareUnit, env_quota, parse_environ,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let env = parse_environ(data);
    let entries = data.split(|&b| b == 0).filter(|e| !e.is_empty()).count();
    assert!(env.len() <= entries);
    for (name, value) in &env {
        assert!(!name.contains('=') && !name.contains('\0'), "{name:?}");
        assert!(!value.contains('\0'), "{value:?}");
    }
    let pairs: Vec<(&str, &str)> = env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();

    let gib = env_quota(pairs.iter().copied(), GpuShareUnit::GiB);
    let mib = env_quota(pairs.iter().copied(), GpuShareUnit::MiB);
    check(&gib, GpuShareUnit::GiB);
    check(&mib, GpuShareUnit::MiB);

    // The first occurrence of a name wins (getenv(3)): repeating the environment changes nothing.
    let doubled = env_quota(pairs.iter().chain(pairs.iter()).copied(), GpuShareUnit::GiB);
    assert_eq!(doubled, gib);

    // HAMi's values carry their own units: the GPUShare unit does not matter to them.
    let hami = |r: &Result<Option<EnvQuota>, EnvQuotaError>| matches!(r, Ok(Some(q)) if q.source == EnvSource::Hami);
    if hami(&gib) || hami(&mib) {
        assert_eq!(gib, mib);
    }
    // A GPUShare quota in GiB is 1024 times the same number in MiB (which cannot overflow then).
    if let Ok(Some(q)) = &gib
        && q.source == EnvSource::GpuShare
    {
        let Ok(Some(m)) = &mib else {
            panic!("GiB gave {q:?} but MiB gave {mib:?}");
        };
        let scale = |q: &EnvQuota| -> Vec<u64> {
            q.per_gpu
                .iter()
                .map(|(_, b)| *b)
                .chain(q.each_gpu)
                .collect()
        };
        let mib_bytes: Vec<u64> = scale(m).iter().map(|b| b << 10).collect();
        assert_eq!(scale(q), mib_bytes);
        assert_eq!(
            q.per_gpu.iter().map(|(d, _)| d).collect::<Vec<_>>(),
            m.per_gpu.iter().map(|(d, _)| d).collect::<Vec<_>>()
        );
    }
});

fn check(r: &Result<Option<EnvQuota>, EnvQuotaError>, unit: GpuShareUnit) {
    match r {
        Ok(None) => {}
        Ok(Some(q)) => {
            // Zero means "no limit": a quota has at least one limit, and none of them is zero.
            assert!(!q.per_gpu.is_empty() || q.each_gpu.is_some(), "{q:?}");
            assert!(q.per_gpu.iter().all(|(_, b)| *b > 0), "{q:?}");
            assert!(q.each_gpu.is_none_or(|b| b > 0), "{q:?}");
            // No device is limited twice.
            for (i, (d, _)) in q.per_gpu.iter().enumerate() {
                assert!(q.per_gpu[..i].iter().all(|(e, _)| e != d), "{q:?}");
            }
            if q.source == EnvSource::GpuShare {
                // One limit, on one known device or on each device, in whole units.
                assert_eq!(
                    q.per_gpu.len() + usize::from(q.each_gpu.is_some()),
                    1,
                    "{q:?}"
                );
                let bytes = q.per_gpu.first().map(|(_, b)| *b).or(q.each_gpu).unwrap();
                assert_eq!(bytes % unit.bytes(), 0, "{q:?}");
            }
            let _ = q.source.as_str();
            for (d, _) in &q.per_gpu {
                let _ = d.to_string();
            }
        }
        Err(e) => {
            assert!(e.value.chars().count() <= 64, "{e:?}");
            let shown = e.to_string();
            assert!(shown.starts_with(&format!("`{}=", e.var)), "{shown:?}");
        }
    }
}
