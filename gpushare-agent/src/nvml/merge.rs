//! Pure handling of NVML's process records: merging the compute and graphics lists and
//! distrusting records that cannot be right. No I/O; `/proc` is asked through a closure.

/// One raw record from a compute or graphics process list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawProcess {
    /// pid as NVML reported it.
    pub pid: u32,
    /// Used bytes; `None` for NVML_VALUE_NOT_AVAILABLE.
    pub used_bytes: Option<u64>,
}

/// Why a record was not trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Distrust {
    /// pid 0 or a pid with no `/proc` entry (e.g. the R535 record-stride bug, or a pid from another
    /// PID namespace).
    NoSuchPid,
    /// More memory than the GPU has.
    ImplausibleMemory,
}

impl Distrust {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSuchPid => "no_such_pid",
            Self::ImplausibleMemory => "implausible_memory",
        }
    }
}

/// Merges the compute and graphics lists of one device into one record per pid, and drops
/// records that cannot be right.
///
/// A process with both contexts appears in both lists with its whole usage on the device, so the
/// two are not added: the larger known value wins, and a known value beats "not available".
pub fn merge_device_processes(
    compute: &[RawProcess],
    graphics: &[RawProcess],
    memory_total: u64,
    pid_exists: &dyn Fn(u32) -> bool,
    distrusted: &mut Vec<(u32, Distrust)>,
) -> Vec<RawProcess> {
    let mut merged: Vec<RawProcess> = Vec::with_capacity(compute.len() + graphics.len());
    for rec in compute.iter().chain(graphics) {
        if rec.pid == 0 || !pid_exists(rec.pid) {
            distrusted.push((rec.pid, Distrust::NoSuchPid));
            continue;
        }
        if rec.used_bytes.is_some_and(|b| b > memory_total) {
            distrusted.push((rec.pid, Distrust::ImplausibleMemory));
            continue;
        }
        merged.push(*rec);
    }
    // By pid (one sorted vector, not a map: this runs for every process at every sample), the
    // records of one pid folded into the first.
    merged.sort_by_key(|p| p.pid);
    merged.dedup_by(|later, kept| {
        if later.pid != kept.pid {
            return false;
        }
        kept.used_bytes = match (kept.used_bytes, later.used_bytes) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        true
    });
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: u32, used: Option<u64>) -> RawProcess {
        RawProcess {
            pid,
            used_bytes: used,
        }
    }

    #[test]
    fn compute_and_graphics_records_of_one_pid_merge_without_double_counting() {
        let mut bad = Vec::new();
        let merged = merge_device_processes(
            &[p(10, Some(100)), p(11, None), p(12, Some(5))],
            &[p(10, Some(100)), p(11, Some(40)), p(13, None)],
            1000,
            &|_| true,
            &mut bad,
        );
        assert_eq!(
            merged,
            vec![
                p(10, Some(100)),
                p(11, Some(40)),
                p(12, Some(5)),
                p(13, None)
            ]
        );
        assert!(bad.is_empty());
    }

    /// The larger of the two records wins whichever list has it: "first wins" or "last wins"
    /// would each get one of the two pids wrong.
    #[test]
    fn compute_and_graphics_records_of_one_pid_merge_by_max_both_ways_round() {
        let mut bad = Vec::new();
        let merged = merge_device_processes(
            &[p(10, Some(100)), p(11, Some(300)), p(12, None)],
            &[p(10, Some(300)), p(11, Some(100)), p(12, Some(7))],
            1000,
            &|_| true,
            &mut bad,
        );
        assert_eq!(
            merged,
            vec![p(10, Some(300)), p(11, Some(300)), p(12, Some(7))]
        );
        // And within one list (a pid listed twice).
        let merged = merge_device_processes(
            &[p(13, Some(5)), p(13, Some(9))],
            &[],
            1000,
            &|_| true,
            &mut bad,
        );
        assert_eq!(merged, vec![p(13, Some(9))]);
        assert!(bad.is_empty());
    }

    #[test]
    fn garbage_records_are_distrusted_and_counted() {
        let mut bad = Vec::new();
        let merged = merge_device_processes(
            &[
                p(0, Some(1)),
                p(999_999, Some(1)),
                p(10, Some(u64::MAX - 1)),
                p(11, Some(1000)),
            ],
            &[],
            1000,
            &|pid| pid < 100,
            &mut bad,
        );
        assert_eq!(
            merged,
            vec![p(11, Some(1000))],
            "usage equal to the total is plausible"
        );
        assert_eq!(
            bad,
            vec![
                (0, Distrust::NoSuchPid),
                (999_999, Distrust::NoSuchPid),
                (10, Distrust::ImplausibleMemory)
            ]
        );
    }
}
