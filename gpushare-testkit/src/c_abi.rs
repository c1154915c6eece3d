//! The mocks' C ABI checks: a C program compiled against NVIDIA's own header, linked against the
//! mock installed in a scratch directory, and run on a scenario. What each check prints and
//! expects stays with the mock it checks.

use std::{
    fmt::Debug,
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// NVIDIA's headers (`headers`, the first one named when missing) in `$GPUSHARE_PYENV/<dir>`,
/// and a scratch directory with the mock installed (by `install`, given the directory) in its
/// `lib/`; `None`, after [`crate::skip::skip_or_fail`], where a header is missing.
pub fn prepared<T, E: Debug>(
    dir: &str,
    headers: &[&str],
    install: impl FnOnce(&Path) -> Result<T, E>,
) -> Option<(PathBuf, tempfile::TempDir, PathBuf)> {
    let header = crate::skip::pyenv().join(dir);
    if !headers.iter().all(|h| header.join(h).is_file()) {
        crate::skip::skip_or_fail(&format!(
            "NVIDIA's {} not found in {}",
            headers[0],
            header.display()
        ));
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let libdir = tmp.path().join("lib");
    install(&libdir).unwrap();
    Some((header, tmp, libdir))
}

/// Compiles `source` (warnings are errors) against the header in `header`, with `args` (the `-D`
/// macros and any extra flags), linked with `-l<lib>` against the mock in `libdir`, to `out`:
/// what the compiler said. `$CC`, else `cc`.
pub fn compile(
    source: &Path,
    header: &Path,
    args: &[String],
    libdir: &Path,
    lib: &str,
    out: &Path,
) -> Output {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    Command::new(&cc)
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(header)
        .args(args)
        .arg(source)
        .arg("-L")
        .arg(libdir)
        .arg(format!("-l{lib}"))
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e} (gcc is installed by scripts/setup.sh)"))
}

/// Runs the built check `exe` with `args`, the mock found in `libdir`, and the scenario variable
/// `env_var` naming `state` (removed where there is none).
pub fn run(
    exe: &Path,
    args: &[&str],
    libdir: &Path,
    env_var: &str,
    state: Option<&Path>,
) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", libdir)
        .env_remove(env_var);
    if let Some(state) = state {
        cmd.env(env_var, state);
    }
    cmd.output().expect("run the check")
}

/// The check built twice in `dir` by `compile(out, extra flags)`: as `name`, and as
/// `<name>_broken` with `-DGPUSHARE_ABI_SELFTEST_BREAK`, the deliberate layout error each check
/// carries so that its comparison is shown to notice one. Their paths.
pub fn good_and_broken(
    dir: &Path,
    name: &str,
    mut compile: impl FnMut(&Path, &[&str]),
) -> (PathBuf, PathBuf) {
    let good = dir.join(name);
    let broken = dir.join(format!("{name}_broken"));
    compile(&good, &[]);
    compile(&broken, &["-DGPUSHARE_ABI_SELFTEST_BREAK"]);
    (good, broken)
}

/// What a run of a check printed, which must have succeeded: panics with its status and both
/// outputs where it did not.
pub fn stdout_ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the check failed ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.into_owned()
}
