//! Tells the programs which architecture's syscall numbers and register layout to use
//! (`cfg(bpf_target_arch)`; the agent's aya-build passes it, a direct clippy run takes the host's).
fn main() -> anyhow::Result<()> {
    aya_build::emit_bpf_target_arch_cfg()
}
