//! Builds the eBPF programs (nightly, bpfel-unknown-none) and leaves the object in OUT_DIR for
//! `include_bytes_aligned!`. `cargo xtask setup` installs what this needs (rust-src, bpf-linker).
//!
//! Also sets `GPUSHARE_COMMIT` for `--version` and `gpushare_build_info`: the commit the agent is
//! built from (`git rev-parse --short=12 HEAD`, `-dirty` when tracked files differ from it),
//! `unknown` outside a git checkout. `GPUSHARE_BUILD_COMMIT` in the build's environment overrides
//! it (a build from a source archive that knows its commit).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    println!("cargo:rustc-env=GPUSHARE_COMMIT={}", commit(&manifest_dir));
    pod_resources(&manifest_dir)?;
    let ebpf_dir = manifest_dir.join("../gpushare-ebpf").canonicalize()?;
    let root_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("non-UTF-8 path {ebpf_dir:?}"))?;
    println!("cargo:rerun-if-changed={root_dir}/src");
    println!("cargo:rerun-if-changed={}/../gpushare-common/src", root_dir);
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "gpushare-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}

/// The kubelet's pod-resources `v1` API (vendored in `proto/podresources/`), compiled by protox
/// (pure Rust, no `protoc`) into prost messages, the tonic client and the server trait the tests'
/// fake kubelet implements.
fn pod_resources(dir: &Path) -> anyhow::Result<()> {
    let root = dir.join("proto/podresources");
    let file = root.join("v1/api.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}

const OVERRIDE: &str = "GPUSHARE_BUILD_COMMIT";

/// The commit, and the `rerun-if-changed` lines that make cargo ask again when it can change:
/// HEAD (a checkout), the branch's ref (a commit; loose or packed) and the agent's own sources
/// (the dirty mark). Only paths that exist are named: cargo reruns a script every time for a
/// missing one.
fn commit(dir: &Path) -> String {
    println!("cargo:rerun-if-env-changed={OVERRIDE}");
    if let Ok(c) = std::env::var(OVERRIDE)
        && !c.trim().is_empty()
    {
        return c.trim().to_string();
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            // `status` must not rewrite the index (it would move under a concurrent git command).
            .arg("--no-optional-locks")
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".to_string();
    };
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-changed={}", dir.join("src").display());
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if s.is_empty() => head,
        Some(_) => format!("{head}-dirty"),
        // A tree git cannot read: the commit is known, its state not.
        None => format!("{head}-dirty"),
    }
}
