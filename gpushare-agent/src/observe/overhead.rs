//! The driver's own memory per GPU model: what a CUDA context takes, allowed beyond every quota
//! once per workload and GPU.
//!
//! NVML's per-process usage counts the process's CUDA context (hundreds of MiB, by model and
//! driver: KAI-Scheduler #2212), so a workload that allocates exactly its request shows more than
//! it and would be acted on for memory it never asked for. The allowance is the driver's, per GPU
//! and workload, never per process: a tenant gains no room by spawning more processes.
//!
//! Where the quota file sets no size for a model, it is learned here: the smallest usage of any
//! process seen on a GPU of that model (a process holds at least its context), counted only from
//! processes at most [`LEARNED_CAP`] (larger ones say nothing about the context) and only once
//! [`MIN_PROCESSES`] distinct processes are seen. A tenant can lower the learned figure only
//! towards the real context (no process is smaller), and raise it at most to the cap (by being the
//! only small processes seen): the cap bounds what anyone gains from it.

use std::collections::{BTreeSet, HashMap};

use crate::{
    quota::OverheadSetting,
    sample::{ContextOverhead, GpuSample, OverheadSource},
};

/// A learned overhead never exceeds this (a bare context is ~300-550 MiB on current models).
pub const LEARNED_CAP: u64 = 512 << 20;

/// Distinct small processes seen on a model before its overhead is learned.
pub const MIN_PROCESSES: usize = 3;

/// What is learned of one GPU model.
#[derive(Debug, Default)]
struct Learned {
    /// The smallest usage seen (bytes, > 0, at most [`LEARNED_CAP`]).
    min: u64,
    /// The pids of the small processes seen, until there are [`MIN_PROCESSES`].
    pids: BTreeSet<u32>,
}

impl Learned {
    fn bytes(&self) -> Option<u64> {
        (self.pids.len() >= MIN_PROCESSES).then_some(self.min)
    }
}

/// The context overhead learned per GPU model on this node.
#[derive(Debug, Default)]
pub struct Overheads {
    by_model: HashMap<String, Learned>,
}

impl Overheads {
    /// Learns from `sample`'s processes (verified, usage known) and writes each GPU's overhead
    /// into it, as `setting` says.
    pub fn fill(&mut self, sample: &mut GpuSample, setting: &OverheadSetting) {
        self.learn(sample);
        for d in &mut sample.devices {
            d.context_overhead = self.of_model(&d.name, setting);
        }
    }

    fn learn(&mut self, sample: &GpuSample) {
        for p in &sample.processes {
            let Some(bytes) = p.used_bytes.filter(|b| (1..=LEARNED_CAP).contains(b)) else {
                continue;
            };
            let Some(d) = sample.devices.iter().find(|d| d.index == p.device_index) else {
                continue;
            };
            let l = match self.by_model.get_mut(d.name.as_str()) {
                Some(l) => l,
                None => self.by_model.entry(d.name.clone()).or_default(),
            };
            l.min = if l.pids.is_empty() {
                bytes
            } else {
                l.min.min(bytes)
            };
            if l.pids.len() < MIN_PROCESSES {
                l.pids.insert(p.pid);
            }
        }
    }

    /// The overhead allowed on a GPU of `model`.
    pub fn of_model(&self, model: &str, setting: &OverheadSetting) -> ContextOverhead {
        if let Some(bytes) = setting.set_for(model) {
            return ContextOverhead {
                bytes,
                source: if bytes == 0 {
                    OverheadSource::None
                } else {
                    OverheadSource::Set
                },
            };
        }
        if !setting.learn {
            return ContextOverhead::default();
        }
        match self.by_model.get(model).map(Learned::bytes) {
            Some(Some(bytes)) => ContextOverhead {
                bytes,
                source: OverheadSource::Learned,
            },
            _ => ContextOverhead {
                bytes: 0,
                source: OverheadSource::Learning,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::sample::{DeviceSample, ProcessSample};

    const MIB: u64 = 1 << 20;

    fn sample(procs: &[(u32, u32, Option<u64>)]) -> GpuSample {
        GpuSample {
            devices: [(0, "Tesla T4"), (1, "Tesla T4"), (2, "NVIDIA H100")]
                .iter()
                .map(|&(index, name)| DeviceSample {
                    index,
                    name: name.into(),
                    ..Default::default()
                })
                .collect(),
            processes: procs
                .iter()
                .map(|&(pid, device_index, used_bytes)| ProcessSample {
                    pid,
                    device_index,
                    device_uuid: "GPU-x".into(),
                    used_bytes,
                    utilization: None,
                })
                .collect(),
            taken_at: None,
            health: Vec::new(),
            problems: Vec::new(),
        }
    }

    fn fill(
        o: &mut Overheads,
        procs: &[(u32, u32, Option<u64>)],
        s: &OverheadSetting,
    ) -> Vec<(u64, &'static str)> {
        let mut sample = sample(procs);
        o.fill(&mut sample, s);
        sample
            .devices
            .iter()
            .map(|d| (d.context_overhead.bytes, d.context_overhead.source.as_str()))
            .collect()
    }

    #[test]
    fn the_smallest_process_of_a_model_is_learned_once_enough_distinct_ones_are_seen() {
        let auto = OverheadSetting::default();
        let mut o = Overheads::default();
        // Two small processes (one on two GPUs of the model): still learning.
        let seen = fill(
            &mut o,
            &[
                (10, 0, Some(400 * MIB)),
                (10, 1, Some(300 * MIB)),
                (11, 0, Some(350 * MIB)),
            ],
            &auto,
        );
        assert_eq!(
            seen,
            vec![(0, "learning"), (0, "learning"), (0, "learning")]
        );
        // A third distinct one: the smallest of all is the model's; another model learns nothing.
        let seen = fill(&mut o, &[(12, 1, Some(320 * MIB))], &auto);
        assert_eq!(
            seen,
            vec![
                (300 * MIB, "learned"),
                (300 * MIB, "learned"),
                (0, "learning")
            ]
        );
        // A smaller one later lowers it; the same pid again counts once.
        let seen = fill(&mut o, &[(12, 0, Some(290 * MIB))], &auto);
        assert_eq!(seen[0], (290 * MIB, "learned"));
    }

    #[test]
    fn large_unknown_and_empty_usages_teach_nothing_so_no_one_inflates_it_past_the_cap() {
        let auto = OverheadSetting::default();
        let mut o = Overheads::default();
        let big = LEARNED_CAP + 1;
        let seen = fill(
            &mut o,
            &[
                (1, 0, Some(big)),
                (2, 0, Some(20 << 30)),
                (3, 0, None),
                (4, 0, Some(0)),
                (5, 1, Some(big)),
            ],
            &auto,
        );
        assert_eq!(seen[0], (0, "learning"));
        // At the cap exactly: counted, and the figure is the cap at most.
        let seen = fill(
            &mut o,
            &[
                (6, 0, Some(LEARNED_CAP)),
                (7, 0, Some(LEARNED_CAP)),
                (8, 1, Some(LEARNED_CAP)),
            ],
            &auto,
        );
        assert_eq!(seen[0], (LEARNED_CAP, "learned"));
    }

    #[test]
    fn a_size_set_wins_per_model_or_for_every_model_and_none_turns_it_off() {
        let mut o = Overheads::default();
        let procs = [
            (1, 2, Some(500 * MIB)),
            (2, 2, Some(510 * MIB)),
            (3, 2, Some(505 * MIB)),
        ];
        let per_model = OverheadSetting {
            learn: true,
            every: None,
            models: BTreeMap::from([("Tesla T4".to_string(), 450 * MIB)]),
        };
        let seen = fill(&mut o, &procs, &per_model);
        assert_eq!(
            seen,
            vec![
                (450 * MIB, "set"),
                (450 * MIB, "set"),
                (500 * MIB, "learned")
            ]
        );
        let every = OverheadSetting {
            learn: false,
            every: Some(100 * MIB),
            models: BTreeMap::new(),
        };
        assert_eq!(fill(&mut o, &[], &every), vec![(100 * MIB, "set"); 3]);
        let none = OverheadSetting {
            learn: false,
            every: Some(0),
            models: BTreeMap::new(),
        };
        assert_eq!(fill(&mut o, &[], &none), vec![(0, "none"); 3]);
        let off = OverheadSetting {
            learn: false,
            every: None,
            models: BTreeMap::new(),
        };
        assert_eq!(fill(&mut o, &[], &off), vec![(0, "none"); 3]);
    }
}
