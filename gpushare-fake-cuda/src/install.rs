//! Installing the built cdylib as `libcuda.so.1` (+ `libcuda.so` symlink).

use std::io;
use std::path::{Path, PathBuf};

/// The name CUDA clients dlopen.
pub const LIB_NAME: &str = "libcuda.so.1";
/// The link-time name (`-lcuda`).
pub const LINK_NAME: &str = "libcuda.so";
/// What cargo names the cdylib.
pub const BUILT_NAME: &str = "libgpushare_fake_cuda.so";

/// Copies `built` to `<dir>/libcuda.so.1` and points `<dir>/libcuda.so` at it, both atomically;
/// idempotent. Returns the path of the installed library.
pub fn install_into(built: &Path, dir: &Path) -> io::Result<PathBuf> {
    gpushare_fake_driver::install::install_lib(built, dir, LIB_NAME, LINK_NAME)
}
