//! The resume rule, one for every path that brings a suspended workload back: the policy's
//! resume (release, quota raised, elastic room, a workload no longer liable), SIGTERM and
//! `gpushare-agent thaw --all`.
//!
//! A restore runs only when every GPU of the footprint can hold its share now: a restore without
//! room fails with `CUDA_ERROR_OUT_OF_MEMORY`, and on real drivers can leave the process
//! unrestorable for good (cuda-checkpoint#44, docs/suspend.md). What NVML already lists for the
//! workload on a GPU is its own memory back (a resume that restored but could not unlock): that
//! much needs no room again. A GPU that is not in the sample, or degraded, has no room: the
//! workload stays suspended (fail safe) until its data is good.

use std::collections::BTreeMap;

use crate::{quota::ByteSize, sample::GpuSample};

/// `Ok` when every GPU of `per_gpu` (bytes to restore per GPU index) has room for its share in
/// `sample`, counting `listed(gpu)` (what NVML lists for the workload there now) as room; else
/// why not, in words (the first GPU without room).
pub fn resume_room(
    per_gpu: &BTreeMap<u32, u64>,
    sample: &GpuSample,
    listed: impl Fn(u32) -> u64,
) -> Result<(), String> {
    resume_room_keeping(per_gpu, sample, listed, 0)
}

/// [`resume_room`], leaving `reserve` bytes free on each GPU besides: an elastic borrower the
/// policy holds suspended comes back only with `elastic_reserve` to spare, as the policy's own
/// resume would ([`super::pressure`]), also at shutdown.
pub fn resume_room_keeping(
    per_gpu: &BTreeMap<u32, u64>,
    sample: &GpuSample,
    listed: impl Fn(u32) -> u64,
    reserve: u64,
) -> Result<(), String> {
    for (&gpu, &bytes) in per_gpu {
        let Some(d) = sample.devices.iter().find(|d| d.index == gpu) else {
            return Err(format!(
                "GPU {gpu} is not sampled: its free memory is unknown"
            ));
        };
        if !sample.device_ok(gpu) {
            return Err(format!("GPU {gpu} is degraded: its free memory is unknown"));
        }
        let back = listed(gpu);
        if d.memory_free.saturating_add(back) < bytes.saturating_add(reserve) {
            let back = if back > 0 {
                format!(" (and {} of it back already)", ByteSize(back).approx())
            } else {
                String::new()
            };
            let reserve = if reserve > 0 {
                format!(" and the elastic reserve {}", ByteSize(reserve).approx())
            } else {
                String::new()
            };
            return Err(format!(
                "GPU {gpu} has {} free{back}, its restore needs {}{reserve}",
                ByteSize(d.memory_free).approx(),
                ByteSize(bytes).approx()
            ));
        }
    }
    Ok(())
}

/// What NVML lists in `sample` for the processes `pids` on GPU `gpu`, bytes (the `listed` of
/// [`resume_room`] where no attribution is at hand: shutdown, `thaw --all`).
pub fn listed_for(sample: &GpuSample, pids: &[u32], gpu: u32) -> u64 {
    sample
        .processes
        .iter()
        .filter(|p| p.device_index == gpu && pids.contains(&p.pid))
        .map(|p| p.used_bytes.unwrap_or(0))
        .fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{DeviceHealth, DeviceSample, ProcessSample};

    const GIB: u64 = 1 << 30;

    fn sample(free: &[(u32, u64)], degraded: &[u32]) -> GpuSample {
        GpuSample {
            taken_at: None,
            devices: free
                .iter()
                .map(|&(index, f)| DeviceSample {
                    index,
                    uuid: format!("GPU-{index}"),
                    name: "t".into(),
                    memory_total: 80 * GIB,
                    memory_used: 80 * GIB - f,
                    memory_free: f,
                    memory_reserved: 0,
                    ..DeviceSample::default()
                })
                .collect(),
            health: free
                .iter()
                .map(|&(i, _)| {
                    let h = if degraded.contains(&i) {
                        DeviceHealth::Degraded { reason: "x".into() }
                    } else {
                        DeviceHealth::Ok
                    };
                    (i, h)
                })
                .collect(),
            processes: vec![ProcessSample {
                pid: 7,
                device_index: 1,
                device_uuid: "GPU-1".into(),
                used_bytes: Some(3 * GIB),
                ..ProcessSample::default()
            }],
            problems: Vec::new(),
        }
    }

    #[test]
    fn room_is_needed_on_every_gpu_of_the_footprint() {
        let fp = BTreeMap::from([(0, 6 * GIB), (1, 2 * GIB)]);
        let none = |_| 0;
        assert_eq!(
            resume_room(&fp, &sample(&[(0, 6 * GIB), (1, 2 * GIB)], &[]), none),
            Ok(())
        );
        let e = resume_room(&fp, &sample(&[(0, 6 * GIB), (1, 2 * GIB - 1)], &[]), none);
        assert!(
            e.as_ref().is_err_and(|e| e.starts_with("GPU 1 has")),
            "{e:?}"
        );
        let e = resume_room(&fp, &sample(&[(0, 4 * GIB), (1, 2 * GIB)], &[]), none).unwrap_err();
        assert_eq!(e, "GPU 0 has 4.0 GiB free, its restore needs 6.0 GiB");
    }

    #[test]
    fn an_elastic_reserve_is_kept_free_besides() {
        let fp = BTreeMap::from([(0, 6 * GIB)]);
        let s = sample(&[(0, 8 * GIB)], &[]);
        assert_eq!(resume_room_keeping(&fp, &s, |_| 0, 2 * GIB), Ok(()));
        let e = resume_room_keeping(&fp, &s, |_| 0, 2 * GIB + 1).unwrap_err();
        assert!(e.ends_with("and the elastic reserve 2.0 GiB"), "{e}");
    }

    #[test]
    fn an_unsampled_or_degraded_gpu_has_no_room() {
        let fp = BTreeMap::from([(0, GIB), (1, GIB)]);
        let e = resume_room(&fp, &sample(&[(0, 80 * GIB)], &[]), |_| 0).unwrap_err();
        assert!(e.contains("GPU 1 is not sampled"), "{e}");
        let e = resume_room(&fp, &sample(&[(0, 80 * GIB), (1, 80 * GIB)], &[1]), |_| 0);
        assert!(e.is_err_and(|e| e.contains("degraded")));
    }

    #[test]
    fn memory_listed_for_the_workload_counts_as_room() {
        let s = sample(&[(1, GIB)], &[]);
        let fp = BTreeMap::from([(1, 4 * GIB)]);
        assert_eq!(listed_for(&s, &[7], 1), 3 * GIB);
        assert_eq!(listed_for(&s, &[8], 1), 0);
        assert_eq!(listed_for(&s, &[7], 0), 0);
        assert_eq!(resume_room(&fp, &s, |g| listed_for(&s, &[7], g)), Ok(()));
        let e = resume_room(&fp, &s, |g| listed_for(&s, &[8], g)).unwrap_err();
        assert!(!e.contains("back already"), "{e}");
        let fp = BTreeMap::from([(1, 5 * GIB)]);
        let e = resume_room(&fp, &s, |g| listed_for(&s, &[7], g)).unwrap_err();
        assert!(e.contains("3.0 GiB of it back already"), "{e}");
    }
}
