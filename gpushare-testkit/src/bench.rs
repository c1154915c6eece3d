//! What every benchmark of the workspace does alike: the quick mode, and the wall times (or their
//! median) of a few runs.

use std::time::Instant;

/// `GPUSHARE_BENCH_QUICK=1` (set by `cargo xtask test`): a smoke run, few iterations, figures not
/// to be judged.
pub fn quick() -> bool {
    std::env::var_os("GPUSHARE_BENCH_QUICK").is_some()
}

/// `full` iterations, or `few` in [`quick`] mode.
pub fn iters(full: usize, few: usize) -> usize {
    if quick() { few } else { full }
}

/// The wall times of `runs` calls of `f`, in microseconds, shortest first.
pub fn sorted_us<T>(runs: usize, mut f: impl FnMut() -> T) -> Vec<f64> {
    let mut v: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// The median wall time of `runs` calls of `f`, in microseconds.
pub fn median_us<T>(runs: usize, f: impl FnMut() -> T) -> f64 {
    let v = sorted_us(runs, f);
    v[v.len() / 2]
}
