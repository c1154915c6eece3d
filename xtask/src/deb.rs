//! `cargo xtask deb`: the Debian package of the agent for systemd hosts, built with Debian's own
//! `dpkg-deb`, and its test (`cargo xtask deb --test`, a step of `cargo xtask test`).
//!
//! The package: the release binary as /usr/bin/gpushare-agent, the hardened unit of
//! deploy/systemd/ (its ExecStart pointed at /usr/bin) in /lib/systemd/system, the example quota
//! file deploy/debian/quotas.toml as the conffile /etc/gpushare/quotas.toml, the state directory
//! /var/lib/gpushare, and the maintainer scripts of deploy/debian/ (postinst enables and starts
//! the unit; prerm stops the agent, whose SIGTERM thaws what it froze, then runs
//! `gpushare-agent thaw --all` as a backstop; postrm purge removes the state, runtime and
//! configuration directories).

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{check, step};

const PACKAGE: &str = "gpushare-agent";
const UNIT: &str = "gpushare-agent.service";
/// What the unit of deploy/systemd/ runs (a manual install), and what the package's runs.
const EXEC_FROM: &str = "/usr/local/bin/gpushare-agent";
const EXEC_TO: &str = "/usr/bin/gpushare-agent";
const CONFFILE: &str = "/etc/gpushare/quotas.toml";

/// Builds target/deb/gpushare-agent_<version>_<arch>.deb from the release binary; its path.
pub fn build(root: &Path) -> Result<PathBuf> {
    step("release build of gpushare-agent");
    // The one release build `run` and `image` make too: nothing is built again between them.
    super::build_release(root)?;
    let bin = root.join("target/release/gpushare-agent");
    let (version, commit) = version_of(&bin)?;
    let arch = stdout(Command::new("dpkg").arg("--print-architecture"))?;
    step(&format!(
        "Debian package {PACKAGE} {version} ({arch}, commit {commit})"
    ));

    let out_dir = root.join("target/deb");
    let tree = out_dir.join(format!("{PACKAGE}_{version}_{arch}"));
    if tree.exists() {
        fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    }
    let put = |rel: &str, bytes: &[u8], mode: u32| -> Result<()> {
        let path = tree.join(rel);
        fs::create_dir_all(path.parent().expect("a file in a directory"))?;
        fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        Ok(())
    };

    // The program, stripped as Debian ships programs (the eBPF object it embeds is data).
    let dest = tree.join("usr/bin/gpushare-agent");
    fs::create_dir_all(dest.parent().unwrap())?;
    check(
        Command::new("strip")
            .args(["--strip-unneeded", "-o"])
            .arg(&dest)
            .arg(&bin)
            .status()
            .context("running strip (binutils)")?,
        "strip",
    )?;
    fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;

    put(
        &format!("lib/systemd/system/{UNIT}"),
        unit(root)?.as_bytes(),
        0o644,
    )?;
    let read = |rel: &str| fs::read(root.join(rel)).with_context(|| format!("reading {rel}"));
    put(
        CONFFILE.trim_start_matches('/'),
        &read("deploy/debian/quotas.toml")?,
        0o644,
    )?;
    let doc = format!("usr/share/doc/{PACKAGE}");
    put(
        &format!("{doc}/quotas.toml.example"),
        &read("deploy/quotas.toml")?,
        0o644,
    )?;
    put(
        &format!("{doc}/CHANGELOG.md"),
        &read("CHANGELOG.md")?,
        0o644,
    )?;
    put(&format!("{doc}/copyright"), copyright().as_bytes(), 0o644)?;
    // File times in the archive and the changelog's date: the commit's (so one commit gives one
    // archive), where known.
    let epoch = stdout(
        Command::new("git")
            .current_dir(root)
            .args(["log", "-1", "--format=%ct"]),
    )
    .ok();
    put(
        &format!("{doc}/changelog.gz"),
        &gzip(debian_changelog(&version, &commit, epoch.as_deref())?.as_bytes())?,
        0o644,
    )?;
    // What lintian says of a choice made on purpose.
    put(
        &format!("usr/share/lintian/overrides/{PACKAGE}"),
        format!(
            "# StateDirectoryMode=0700 in the unit: the freeze ledger and the lock are root's.\n\
             {PACKAGE}: non-standard-dir-perm 0700 != 0755 [var/lib/gpushare/]\n\
             # prerm stops the agent even where policy-rc.d forbids actions: its SIGTERM thaws.\n\
             {PACKAGE}: maintainer-script-calls-systemctl [prerm:*]\n"
        )
        .as_bytes(),
        0o644,
    )?;
    let state = tree.join("var/lib/gpushare");
    fs::create_dir_all(&state)?;

    for script in ["postinst", "prerm", "postrm"] {
        put(
            &format!("DEBIAN/{script}"),
            &read(&format!("deploy/debian/{script}"))?,
            0o755,
        )?;
    }
    put(
        "DEBIAN/conffiles",
        format!("{CONFFILE}\n").as_bytes(),
        0o644,
    )?;
    // Every directory 0755 (whatever the umask), except the state directory.
    for dir in walk(&tree)?.into_iter().filter(|p| p.is_dir()) {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    }
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700))?;
    let control = control(&version, &arch, &depends(&dest)?, installed_size(&tree)?);
    put("DEBIAN/control", control.as_bytes(), 0o644)?;

    let deb = out_dir.join(format!("{PACKAGE}_{version}_{arch}.deb"));
    let mut cmd = Command::new("dpkg-deb");
    cmd.args(["--root-owner-group", "--build"])
        .arg(&tree)
        .arg(&deb);
    if let Some(t) = &epoch {
        cmd.env("SOURCE_DATE_EPOCH", t);
    }
    check(
        cmd.status().context("running dpkg-deb")?,
        "dpkg-deb --build",
    )?;
    eprintln!(
        "xtask: built {} ({} KiB)",
        deb.display(),
        fs::metadata(&deb)?.len() / 1024
    );
    Ok(deb)
}

/// `gpushare-agent --version` of `bin`: (version, commit).
fn version_of(bin: &Path) -> Result<(String, String)> {
    let text = stdout(Command::new(bin).arg("--version"))?;
    let parse = || {
        let rest = text.strip_prefix("gpushare-agent ")?;
        let (version, rest) = rest.split_once(" (commit ")?;
        Some((version.to_string(), rest.strip_suffix(')')?.to_string()))
    };
    parse().with_context(|| format!("{} --version printed {text:?}", bin.display()))
}

/// The unit of deploy/systemd/, running the packaged program.
fn unit(root: &Path) -> Result<String> {
    let text = fs::read_to_string(root.join("deploy/systemd").join(UNIT))?;
    let exec = format!("\nExecStart={EXEC_FROM}\n");
    ensure!(
        text.matches(&exec).count() == 1,
        "deploy/systemd/{UNIT} has no line `ExecStart={EXEC_FROM}` (the package rewrites it to \
         {EXEC_TO}): update xtask/src/deb.rs with it"
    );
    let text = text.replace(EXEC_FROM, EXEC_TO);
    Ok(format!(
        "# Installed by the {PACKAGE} Debian package (from deploy/systemd/{UNIT}).\n{text}"
    ))
}

fn copyright() -> String {
    format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: gpushare\n\
         Source: {}\n\n\
         Files: *\n\
         Copyright: 2026 the gpushare contributors\n\
         License: {}\n",
        env!("CARGO_PKG_REPOSITORY"),
        env!("CARGO_PKG_LICENSE"),
    )
}

/// `DEBFULLNAME <DEBEMAIL>` where both are set (Debian's convention), a placeholder otherwise.
fn maintainer() -> String {
    match (std::env::var("DEBFULLNAME"), std::env::var("DEBEMAIL")) {
        (Ok(name), Ok(mail)) => format!("{name} <{mail}>"),
        _ => "gpushare maintainers <gpushare@example.invalid>".to_string(),
    }
}

/// The Debian changelog of a native package: one entry, pointing at CHANGELOG.md.
fn debian_changelog(version: &str, commit: &str, epoch: Option<&str>) -> Result<String> {
    let mut date = Command::new("date");
    date.env("LC_ALL", "C").args(["-u", "-R"]);
    if let Some(t) = epoch {
        date.arg("-d").arg(format!("@{t}"));
    }
    Ok(format!(
        "{PACKAGE} ({version}) unstable; urgency=medium\n\n  \
         * Built from commit {commit}. What changed, for an operator:\n    \
         /usr/share/doc/{PACKAGE}/CHANGELOG.md\n\n \
         -- {}  {}\n",
        maintainer(),
        stdout(&mut date)?
    ))
}

/// `bytes` compressed as Debian wants it (`gzip -9n`: no name, no time).
fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write;
    let mut child = Command::new("gzip")
        .arg("-9n")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running gzip")?;
    child.stdin.take().expect("piped").write_all(bytes)?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "gzip failed ({})", out.status);
    Ok(out.stdout)
}

fn control(version: &str, arch: &str, depends: &str, installed_kib: u64) -> String {
    let maintainer = maintainer();
    format!(
        "Package: {PACKAGE}\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: {maintainer}\n\
         Installed-Size: {installed_kib}\n\
         Depends: {depends}\n\
         Section: admin\n\
         Priority: optional\n\
         Homepage: {}\n\
         Description: per-container GPU memory quotas for NVIDIA GPUs (node agent)\n \
         gpushare watches every GPU process on the node, attributes it to its container,\n \
         pod or systemd unit (eBPF), compares its GPU memory (NVML) with that workload's\n \
         quota, and isolates an offender (signal, freeze, suspend) before it starves its\n \
         neighbours. Prometheus metrics, a status command, a local API.\n \
         .\n \
         This package runs the agent as a hardened systemd service; quotas go in\n \
         /etc/gpushare/quotas.toml. Removing it thaws whatever the agent froze.\n",
        env!("CARGO_PKG_REPOSITORY"),
    )
}

/// `Depends:` from the libraries `bin` needs: each one's Debian package, at least the version of
/// the newest symbol version it uses (`GLIBC_2.34` -> `libc6 (>= 2.34)`), as dpkg-shlibdeps would
/// say for libc6 and libgcc-s1.
fn depends(bin: &Path) -> Result<String> {
    let dump = stdout(Command::new("objdump").arg("-p").arg(bin))
        .context("objdump (binutils) reading the program's dynamic section")?;
    let mut needed: Vec<String> = Vec::new();
    let mut newest: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    let mut lib = None;
    for line in dump.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["NEEDED", name] => needed.push(name.to_string()),
            ["required", "from", name] => lib = Some(name.trim_end_matches(':').to_string()),
            [_, _, _, v] if lib.is_some() => {
                let Some(num) = v.strip_prefix("GLIBC_").or_else(|| v.strip_prefix("GCC_")) else {
                    continue;
                };
                let parts: Vec<u32> = num.split('.').filter_map(|p| p.parse().ok()).collect();
                let e = newest.entry(lib.clone().unwrap()).or_default();
                if parts > *e {
                    *e = parts;
                }
            }
            _ => {}
        }
    }
    ensure!(!needed.is_empty(), "no NEEDED entry in {}", bin.display());
    let ldconfig = stdout(Command::new("/sbin/ldconfig").arg("-p"))?;
    let mut deps: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    for name in &needed {
        let path = ldconfig
            .lines()
            .filter(|l| l.trim_start().starts_with(&format!("{name} ")))
            .filter_map(|l| l.split(" => ").nth(1))
            .next()
            .with_context(|| format!("{name} is not known to ldconfig"))?;
        let owner = stdout(Command::new("dpkg").arg("-S").arg(path))
            .with_context(|| format!("which package holds {path}"))?;
        let package = owner
            .split(':')
            .next()
            .context("dpkg -S output")?
            .to_string();
        let version = newest.get(name).cloned().unwrap_or_default();
        let e = deps.entry(package).or_default();
        if version > *e {
            *e = version;
        }
    }
    Ok(deps
        .into_iter()
        .map(|(p, v)| {
            // GCC_4.2.0 -> 4.2 (what Debian's symbols files say for libgcc-s1).
            let v: Vec<String> = v.iter().take(2).map(u32::to_string).collect();
            if v.is_empty() {
                p
            } else {
                format!("{p} (>= {})", v.join("."))
            }
        })
        .collect::<Vec<_>>()
        .join(", "))
}

/// Installed-Size in KiB, as dpkg-gencontrol counts it: each file rounded up, one per directory.
fn installed_size(tree: &Path) -> Result<u64> {
    let mut kib = 0;
    for p in walk(tree)? {
        if p.starts_with(tree.join("DEBIAN")) {
            continue;
        }
        let m = fs::symlink_metadata(&p)?;
        kib += if m.is_file() {
            m.len().div_ceil(1024)
        } else {
            1
        };
    }
    Ok(kib)
}

/// Every path under `dir` (not `dir` itself), depth first; symlinks are not followed.
fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let e = e?;
            let p = e.path();
            if e.file_type()?.is_dir() {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    Ok(out)
}

fn stdout(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    ensure!(out.status.success(), "{cmd:?} failed ({})", out.status);
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Where installing, removing and purging the package may leave something: every path here that
/// [`is_ours`] is compared before the installation and after the purge.
const SCANNED: [&str; 11] = [
    "/etc",
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib/systemd",
    "/lib/systemd",
    "/usr/share/doc",
    "/usr/share/lintian",
    "/var/lib/gpushare",
    "/var/lib/systemd",
    "/var/lib/dpkg/info",
    "/run",
];

/// The package's test, as root, on this machine: installs `deb` without starting the service
/// (a `policy-rc.d` answering 101; no unit starts where systemd does not run), checks what it
/// installed and runs `gpushare-agent check` on the shipped quota file; then runs the installed
/// agent over the mock NVML (`nvml_lib`) until it freezes a test workload and kills it with
/// SIGKILL (no SIGTERM thaw), twice: with the workload's parent frozen too (the thaw cannot take)
/// `dpkg -r` must be refused, saying what stays frozen; then prerm's `thaw --all` must thaw the
/// workload and the package go. Then purges it and finds no unit, program, lock or file left.
/// Refuses to run where the package is installed or an agent runs; sets the agent's directories
/// of this host aside meanwhile.
pub fn test(root: &Path, deb: &Path, nvml_lib: &Path) -> Result<()> {
    for tool in ["dpkg", "deb-systemd-helper", "systemd-analyze"] {
        ensure!(
            Command::new("sh")
                .args(["-c", &format!("command -v {tool} >/dev/null")])
                .status()?
                .success(),
            "{tool} is missing (Debian's dpkg, init-system-helpers, systemd)"
        );
    }
    if let Some(s) = dpkg_status()? {
        bail!(
            "{PACKAGE} is installed on this machine ({s}); the test installs, removes and purges \
             it: remove it first (dpkg --purge {PACKAGE})"
        );
    }
    // The agent's directories of an earlier `cargo xtask run` (or an operator's): set aside while
    // the test installs and purges, put back afterwards. Never while an agent holds them.
    let _aside = SetAside::take(&["/etc/gpushare", "/var/lib/gpushare", "/run/gpushare"])?;
    let before = traces()?;
    let _policy = PolicyRcD::ensure()?;
    let cleanup = Cleanup;

    step(&format!("dpkg -i {}", deb.display()));
    dpkg(&["-i"], deb)?;
    ensure!(
        dpkg_status()?.as_deref() == Some("install ok installed"),
        "after dpkg -i: {:?}",
        dpkg_status()?
    );
    installed_as_expected(root)?;
    // Every path of the package's own (not /etc, /usr/bin...), to be gone after the purge.
    let listed: Vec<PathBuf> = stdout(Command::new("dpkg-query").args(["-L", PACKAGE]))?
        .lines()
        .map(PathBuf::from)
        .filter(|p| is_ours(p))
        .collect();
    ensure!(
        listed.iter().any(|p| p == Path::new(EXEC_TO)),
        "dpkg -L does not list {EXEC_TO}: {listed:?}"
    );

    step("a removal that would leave a workload frozen is refused");
    let stuck = frozen_by_a_killed_agent(root, nvml_lib)?;
    // Someone else freezes its parent too: the thaw cannot take (the kernel keeps reporting the
    // workload frozen), so the program must stay installed to undo the freeze later.
    fs::write(stuck.parent.dir().join("cgroup.freeze"), "1")?;
    let (removed, refusal) = dpkg_result(&["-r", PACKAGE], deb)?;
    ensure!(
        !removed,
        "dpkg -r removed the package although a workload stayed frozen:\n{refusal}"
    );
    ensure!(
        refusal.contains(&format!("NOT thawed cgroup://{}", stuck.cgroup.rel_path()))
            && refusal.contains("NOT removed"),
        "prerm did not say what stays frozen and why:\n{refusal}"
    );
    ensure!(
        // `deinstall ok installed`: selected for removal, still installed.
        dpkg_status()?.is_some_and(|s| s.ends_with(" ok installed")) && Path::new(EXEC_TO).exists(),
        "a refused removal must leave the package installed: {:?}",
        dpkg_status()?
    );
    fs::write(stuck.parent.dir().join("cgroup.freeze"), "0")?;
    drop(stuck);

    step("a freeze left by a killed agent is thawed by the removal");
    let workload = frozen_by_a_killed_agent(root, nvml_lib)?;
    ensure!(
        workload.cgroup.is_frozen(),
        "the test workload should still be frozen after the agent was killed"
    );
    let removal = dpkg(&["-r", PACKAGE], deb)?;
    ensure!(
        workload.cgroup.wait_frozen(false),
        "{} is still frozen after `dpkg -r`: prerm did not thaw it\n{removal}",
        workload.cgroup.dir().display()
    );
    ensure!(
        removal.contains(&format!("thawed cgroup://{}", workload.cgroup.rel_path())),
        "prerm did not say what it thawed:\n{removal}"
    );
    drop(workload);

    ensure!(
        dpkg_status()?.as_deref() == Some("deinstall ok config-files"),
        "after dpkg -r: {:?}",
        dpkg_status()?
    );
    for gone in [EXEC_TO, &format!("/lib/systemd/system/{UNIT}")] {
        ensure!(!Path::new(gone).exists(), "{gone} is left after dpkg -r");
    }
    ensure!(
        Path::new(CONFFILE).exists(),
        "{CONFFILE} is a conffile: a removal (not a purge) keeps it"
    );

    step(&format!("dpkg -P {PACKAGE}"));
    dpkg(&["-P", PACKAGE], deb)?;
    ensure!(
        dpkg_status()?.is_none(),
        "after dpkg -P: {:?}",
        dpkg_status()?
    );
    let kept: Vec<&PathBuf> = listed.iter().filter(|p| p.exists()).collect();
    ensure!(
        kept.is_empty(),
        "the package's own paths left after the purge: {kept:?}"
    );
    let after = traces()?;
    let left: Vec<&PathBuf> = after.difference(&before).collect();
    ensure!(
        left.is_empty(),
        "left behind by install, removal and purge: {left:?}"
    );
    std::mem::forget(cleanup);
    eprintln!("xtask: the package installs, checks, thaws on removal and purges cleanly");
    Ok(())
}

/// What the installation must have put in place.
fn installed_as_expected(root: &Path) -> Result<()> {
    let unit = format!("/lib/systemd/system/{UNIT}");
    let text = fs::read_to_string(&unit).with_context(|| format!("reading {unit}"))?;
    ensure!(
        text.contains(&format!("\nExecStart={EXEC_TO}\n")),
        "{unit} does not run {EXEC_TO}"
    );
    // The hardened unit as shipped must still be one systemd accepts (with its program there).
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no", &unit])
        .output()?;
    ensure!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "systemd-analyze verify {unit}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let wants = format!("/etc/systemd/system/multi-user.target.wants/{UNIT}");
    ensure!(
        fs::read_link(&wants).ok().as_deref() == Some(Path::new(&unit)),
        "postinst did not enable the unit ({wants} -> {unit})"
    );
    let built = version_of(&root.join("target/release/gpushare-agent"))?;
    ensure!(
        version_of(Path::new(EXEC_TO))? == built,
        "{EXEC_TO} --version differs from the release build's {built:?}"
    );
    let conffiles = stdout(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", PACKAGE]))?;
    ensure!(
        conffiles
            .lines()
            .any(|l| l.split_whitespace().next() == Some(CONFFILE)),
        "{CONFFILE} is not a conffile: {conffiles:?}"
    );
    let state = fs::metadata("/var/lib/gpushare").context("/var/lib/gpushare")?;
    ensure!(
        state.is_dir() && state.mode() & 0o7777 == 0o700 && state.uid() == 0,
        "/var/lib/gpushare: mode {:o}, uid {}",
        state.mode(),
        state.uid()
    );
    let out = Command::new(EXEC_TO).args(["check", CONFFILE]).output()?;
    ensure!(
        out.status.success(),
        "gpushare-agent check {CONFFILE} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A workload frozen by the installed agent, which was then killed (SIGKILL: no thaw): the
/// group `cgroup`, a child of `parent`.
struct FrozenWorkload {
    cgroup: gpushare_testkit::TestCgroup,
    parent: gpushare_testkit::TestCgroup,
    process: Child,
    _scenario: gpushare_testkit::nvml::Scenario,
}

impl Drop for FrozenWorkload {
    fn drop(&mut self) {
        let _ = fs::write(self.parent.dir().join("cgroup.freeze"), "0");
        let _ = fs::write(self.cgroup.dir().join("cgroup.freeze"), "0");
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Runs the installed agent with its defaults (the shipped quota file, a drop-in beside it,
/// /var/lib/gpushare, /run/gpushare) over the mock NVML, until it has frozen a test workload
/// over its quota; then kills it.
fn frozen_by_a_killed_agent(root: &Path, nvml_lib: &Path) -> Result<FrozenWorkload> {
    const GIB: u64 = 1 << 30;
    let parent = gpushare_testkit::TestCgroup::create(&gpushare_testkit::unique("deb"))?;
    let cgroup = gpushare_testkit::TestCgroup::create_at(
        &gpushare_testkit::cgroup::v2_root()?,
        &format!("{}/workload", parent.rel_path().trim_start_matches('/')),
    )?;
    let process = cgroup.spawn(Command::new("sleep").arg("600"))?;
    let scenario = gpushare_testkit::nvml::Scenario::create(&serde_json::json!({
        "devices": [{
            "uuid": "GPU-deb-0",
            "name": "NVIDIA Fake H100",
            "memory_total": 80 * GIB,
            "compute_processes": [{ "pid": process.id(), "used_memory": 3 * GIB }],
        }],
    }))?;
    let workload = FrozenWorkload {
        cgroup,
        parent,
        process,
        _scenario: scenario,
    };
    let dropin = "/etc/gpushare/quotas.d/deb-test.toml";
    fs::create_dir_all("/etc/gpushare/quotas.d")?;
    fs::write(
        dropin,
        format!(
            "[[quota]]\nname = \"deb-test\"\ncgroup = \"{}\"\ngpu_memory = \"1GiB\"\n\
             grace = \"0s\"\nladder = [ {{ action = \"alert\" }}, {{ action = \"freeze\" }} ]\n",
            workload.cgroup.rel_path()
        ),
    )?;
    let log_path = root.join("target/deb/test-agent.log");
    let log = fs::File::create(&log_path)?;
    let mut agent = Command::new(EXEC_TO)
        .arg("--nvml-lib")
        .arg(nvml_lib)
        .args(["--interval", "200ms", "--listen"])
        .arg(format!("127.0.0.1:{}", gpushare_testkit::free_port()))
        .env(
            gpushare_testkit::nvml::SCENARIO_ENV,
            workload._scenario.path(),
        )
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {EXEC_TO}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let frozen = loop {
        if workload.cgroup.is_frozen() {
            break true;
        }
        if Instant::now() > deadline || agent.try_wait()?.is_some() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = agent.kill();
    let _ = agent.wait();
    if !frozen {
        bail!(
            "the installed agent did not freeze the test workload within 30 s; its log:\n{}",
            fs::read_to_string(&log_path).unwrap_or_default()
        );
    }
    ensure!(
        fs::read_to_string("/var/lib/gpushare/freezes.json")
            .is_ok_and(|l| l.contains(workload.cgroup.rel_path())),
        "the agent froze the workload without a record in /var/lib/gpushare/freezes.json"
    );
    Ok(workload)
}

/// `dpkg <args>` (`deb`'s name for `-i`): its output, printed too; an error when it fails.
fn dpkg(args: &[&str], deb: &Path) -> Result<String> {
    let (ok, text) = dpkg_result(args, deb)?;
    ensure!(ok, "dpkg {} failed", args.join(" "));
    Ok(text)
}

/// `dpkg <args>`: whether it succeeded, and its output (printed too). While another dpkg or apt
/// holds dpkg's lock, waits for it (up to 5 minutes).
fn dpkg_result(args: &[&str], deb: &Path) -> Result<(bool, String)> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let mut cmd = Command::new("dpkg");
        cmd.args(args);
        if args == ["-i"] {
            cmd.arg(deb);
        }
        let Output {
            status,
            stdout,
            stderr,
        } = cmd.output().context("running dpkg")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        );
        let locked =
            !status.success() && text.contains("lock") && text.contains("by another process");
        if locked && Instant::now() < deadline {
            eprintln!("xtask: dpkg's lock is held by another process; waiting");
            std::thread::sleep(Duration::from_secs(2));
            continue;
        }
        eprint!("{text}");
        return Ok((status.success(), text));
    }
}

/// dpkg's status of the package (`install ok installed`, `deinstall ok config-files`), or None
/// when dpkg knows nothing of it.
fn dpkg_status() -> Result<Option<String>> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", PACKAGE])
        .stderr(Stdio::null())
        .output()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((out.status.success() && !s.is_empty() && s != "unknown ok not-installed").then_some(s))
}

/// Whether a path is one the package may make: a component named `gpushare` (its directories)
/// or starting with `gpushare-agent` (program, unit, documentation, dpkg's and
/// deb-systemd-helper's records). Not the `gpushare-test*` objects of the agent's tests.
fn is_ours(path: &Path) -> bool {
    path.components().any(|c| {
        let c = c.as_os_str().to_string_lossy();
        c == "gpushare" || c.starts_with("gpushare-agent")
    })
}

/// Every path under [`SCANNED`] that [`is_ours`].
fn traces() -> Result<BTreeSet<PathBuf>> {
    let mut found = BTreeSet::new();
    for dir in SCANNED {
        let dir = Path::new(dir);
        if is_ours(dir) && dir.exists() {
            found.insert(dir.to_path_buf());
        }
        found.extend(walk(dir)?.into_iter().filter(|p| is_ours(p)));
    }
    Ok(found)
}

/// A `policy-rc.d` that answers 101 (no service starts) while the test runs: the host's own when
/// it already answers so, or one of the test's, removed afterwards.
struct PolicyRcD {
    ours: bool,
}

const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

impl PolicyRcD {
    fn ensure() -> Result<Self> {
        if Path::new(POLICY_RC_D).exists() {
            let status = Command::new(POLICY_RC_D).args([UNIT, "start"]).status()?;
            ensure!(
                status.code() == Some(101),
                "{POLICY_RC_D} exists and allows starting {UNIT} ({status}): the test must not \
                 start the service"
            );
            return Ok(Self { ours: false });
        }
        fs::write(
            POLICY_RC_D,
            "#!/bin/sh\n# gpushare's package test: start no service.\nexit 101\n",
        )?;
        fs::set_permissions(POLICY_RC_D, fs::Permissions::from_mode(0o755))?;
        Ok(Self { ours: true })
    }
}

impl Drop for PolicyRcD {
    fn drop(&mut self) {
        if self.ours {
            let _ = fs::remove_file(POLICY_RC_D);
        }
    }
}

/// Directories of this host's own moved to `<dir>.xtask-deb-test` for the test, and moved back.
struct SetAside {
    moved: Vec<(PathBuf, PathBuf)>,
}

impl SetAside {
    fn take(dirs: &[&str]) -> Result<Self> {
        let lock = Path::new("/var/lib/gpushare/agent.lock");
        if lock.exists() {
            // The agent's lock is a flock(2): `flock -n` fails while an agent holds it.
            let free = Command::new("flock")
                .arg("-n")
                .arg(lock)
                .arg("true")
                .status()
                .context("running flock (util-linux)")?;
            ensure!(
                free.success(),
                "an agent is running with /var/lib/gpushare (it holds {}): the test would \
                 install and purge the package under it; stop it first",
                lock.display()
            );
        }
        let mut aside = Self { moved: Vec::new() };
        for dir in dirs {
            let dir = PathBuf::from(dir);
            if !dir.exists() {
                continue;
            }
            let backup = PathBuf::from(format!("{}.xtask-deb-test", dir.display()));
            ensure!(
                !backup.exists(),
                "{} exists: an earlier package test was interrupted; put it back as {} (or \
                 remove it) and rerun",
                backup.display(),
                dir.display()
            );
            fs::rename(&dir, &backup)
                .with_context(|| format!("setting {} aside", dir.display()))?;
            eprintln!(
                "xtask: {} set aside as {} for the test",
                dir.display(),
                backup.display()
            );
            aside.moved.push((dir, backup));
        }
        Ok(aside)
    }
}

impl Drop for SetAside {
    fn drop(&mut self) {
        for (dir, backup) in self.moved.drain(..).rev() {
            if dir.exists() {
                eprintln!(
                    "xtask: NOT putting {} back: {} exists again",
                    backup.display(),
                    dir.display()
                );
            } else if let Err(e) = fs::rename(&backup, &dir) {
                eprintln!(
                    "xtask: putting {} back as {}: {e}",
                    backup.display(),
                    dir.display()
                );
            }
        }
    }
}

/// On a failed test: purge the package, so the next run starts clean.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        if dpkg_status().ok().flatten().is_some() {
            eprintln!("xtask: the package test failed: purging {PACKAGE}");
            let _ = Command::new("dpkg")
                .args(["-P", PACKAGE])
                .env("GPUSHARE_REMOVE_ANYWAY", "1")
                .status();
        }
        let _ = fs::remove_dir_all("/etc/gpushare");
        let _ = fs::remove_dir_all("/var/lib/gpushare");
        let _ = fs::remove_dir_all("/run/gpushare");
    }
}
