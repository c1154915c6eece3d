//! Builds the eBPF programs (nightly, bpfel-unknown-none) and leaves the object in OUT_DIR for
//! `include_bytes_aligned!`. `cargo xtask setup` installs what this needs (rust-src, bpf-linker).
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
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
