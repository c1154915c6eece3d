//! `gpushare-fake-cuda-install [--from <libgpushare_fake_cuda.so>] --to <dir>`: installs the
//! mock as `<dir>/libcuda.so.1` plus a `libcuda.so` symlink (atomic, idempotent). `--from`
//! defaults to the cdylib next to this binary (target/<profile>/).

fn main() -> std::process::ExitCode {
    gpushare_fake_driver::install::installer_main(
        "gpushare-fake-cuda-install",
        gpushare_fake_cuda::install::BUILT_NAME,
        gpushare_fake_cuda::install_into,
    )
}
