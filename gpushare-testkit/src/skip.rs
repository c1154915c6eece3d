//! When a test cannot run here: the one rule for every test of the workspace.
//!
//! A test that lacks something (root, a cgroup v2 hierarchy, Docker, the python venv with NVIDIA's
//! headers and clients) prints a loud `SKIPPED` line straight to stderr and passes; with
//! `GPUSHARE_REQUIRE=1` (set by `cargo xtask test` where it runs as root, as CI does) it panics
//! instead, so nothing is skipped silently where everything is expected to run.

use std::path::{Path, PathBuf};

/// Set to `1`: a test that cannot run here fails instead of skipping.
pub const REQUIRE_ENV: &str = "GPUSHARE_REQUIRE";

/// Whether skipping is a failure here (`GPUSHARE_REQUIRE=1`).
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).as_deref() == Ok("1")
}

/// For a test this machine cannot run (`why`): a loud SKIPPED line, or a panic where
/// [`required`].
pub fn cannot_run(test: &str, why: &str) {
    skip_or_fail(&format!("{test}: {why}"));
}

/// Skips loudly (`what` is missing: say what and how to get it), or panics where [`required`].
pub fn skip_or_fail(what: &str) {
    if required() {
        panic!("{what}, and {REQUIRE_ENV}=1 is set (nothing may be skipped)");
    }
    loud_skip(what);
}

/// Whether the test runs as root; when not, [`cannot_run`] says so.
pub fn require_root(test: &str) -> bool {
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    cannot_run(
        test,
        "needs root (eBPF, cgroups, mknod); run the tests as root",
    );
    false
}

/// Prints a SKIPPED banner straight to the process's stderr (libtest would hide `eprintln!` of a
/// passing test).
pub fn loud_skip(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n!!! SKIPPED {msg} !!!\n");
}

/// The python venv of the cross-checks (NVIDIA's headers, pynvml, nvitop): `$GPUSHARE_PYENV`,
/// default `<workspace>/target/pyenv` (where `scripts/setup.sh` creates it).
pub fn pyenv() -> PathBuf {
    match std::env::var_os("GPUSHARE_PYENV") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/pyenv"),
    }
}
