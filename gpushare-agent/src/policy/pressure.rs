//! Stage 3: elastic pressure.
//!
//! **Liable.** In `strict` mode an over liability is liable. In `elastic` mode it is liable only
//! while a GPU it uses is under pressure (free memory < `elastic_reserve`): the over-quota elastic
//! liabilities on that GPU are taken largest borrowing (usage − limit) first, until the borrowing
//! taken covers the shortfall (free + taken ≥ reserve).

use std::collections::BTreeMap;

use super::{
    input::{GpuScope, PolicyInput},
    plan::Plan,
    usage::Usage,
};
use crate::quota::Mode;

/// Elastic: on each GPU under pressure, take the largest borrowers until the shortfall is covered.
pub(super) fn apply_elastic_pressure(
    input: &PolicyInput,
    plans: &mut BTreeMap<&str, Plan>,
    usage: &Usage,
) {
    let sample = input.sample;
    let reserve = input.quotas.defaults().elastic_reserve;
    let on = |key: &str, dev: u32| {
        usage
            .get(key)
            .and_then(|u| u.get(&dev))
            .map_or((0, 0), |d| (d.bytes, d.listed))
    };
    for dev in &sample.devices {
        if !sample.device_ok(dev.index) {
            continue;
        }
        // Suspended borrowers come back smallest first, and only while the GPU keeps its
        // reserve with them back (free >= footprint + reserve): suspended largest first, resumed
        // last. The others stay suspended (liable). What NVML already lists for one is back on
        // the GPU (a resume that restored but did not finish): only the rest needs room.
        let mut projected = dev.memory_free;
        let mut suspended: Vec<(u64, u64, &str, GpuScope)> = Vec::new();
        for (key, plan) in plans.iter() {
            let Plan::Enforce { liabilities, .. } = plan else {
                continue;
            };
            for l in liabilities
                .iter()
                .filter(|l| l.suspended && l.over && l.enforcement.mode == Mode::Elastic)
            {
                let (fp, listed) = on(key, dev.index);
                let applies = match l.scope {
                    GpuScope::Gpu(i) => i == dev.index,
                    GpuScope::All => fp > 0,
                };
                if applies {
                    suspended.push((fp, fp.saturating_sub(listed), *key, l.scope));
                }
            }
        }
        suspended.sort();
        for (_, missing, key, scope) in suspended {
            if projected >= missing.saturating_add(reserve) {
                projected -= missing;
                continue;
            }
            if let Some(Plan::Enforce { liabilities, .. }) = plans.get_mut(key)
                && let Some(l) = liabilities.iter_mut().find(|l| l.scope == scope)
                && !l.liable
            {
                l.liable = true;
                l.pressure = Some((dev.index, dev.memory_free));
            }
        }
        if projected >= reserve {
            continue;
        }
        let mut candidates: Vec<(u64, &str, GpuScope)> = Vec::new();
        for (key, plan) in plans.iter() {
            let Plan::Enforce { liabilities, .. } = plan else {
                continue;
            };
            for l in liabilities {
                if l.enforcement.mode != Mode::Elastic || !l.over || l.suspended {
                    continue;
                }
                let borrowed = l.usage - l.limit;
                let on_dev = usage
                    .get(key)
                    .and_then(|u| u.get(&dev.index))
                    .map_or(0, |d| d.bytes);
                let share = match l.scope {
                    GpuScope::Gpu(i) if i == dev.index => borrowed,
                    GpuScope::All if on_dev > 0 => borrowed.min(on_dev),
                    _ => continue,
                };
                candidates.push((share, *key, l.scope));
            }
        }
        candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)).then(a.2.cmp(&b.2)));
        for (share, key, scope) in candidates {
            if projected >= reserve {
                break;
            }
            projected = projected.saturating_add(share);
            if let Some(Plan::Enforce { liabilities, .. }) = plans.get_mut(key)
                && let Some(l) = liabilities.iter_mut().find(|l| l.scope == scope)
                && !l.liable
            {
                l.liable = true;
                l.pressure = Some((dev.index, dev.memory_free));
            }
        }
    }
}
