//! `gpushare-fake-nvml-install [--from <libgpushare_fake_nvml.so>] --to <dir>`: installs the
//! mock as `<dir>/libnvidia-ml.so.1` plus a `libnvidia-ml.so` symlink (atomic, idempotent).
//! `--from` defaults to the cdylib next to this binary (target/<profile>/).

fn main() -> std::process::ExitCode {
    gpushare_fake_driver::install::installer_main(
        "gpushare-fake-nvml-install",
        gpushare_fake_nvml::install::BUILT_NAME,
        gpushare_fake_nvml::install_into,
    )
}
