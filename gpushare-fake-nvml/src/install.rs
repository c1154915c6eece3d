//! Installing the built cdylib as `libnvidia-ml.so.1` (+ `libnvidia-ml.so` symlink).

use std::io;
use std::path::{Path, PathBuf};

/// The name NVML clients dlopen.
pub const LIB_NAME: &str = "libnvidia-ml.so.1";
/// The link-time name (`-lnvidia-ml`).
pub const LINK_NAME: &str = "libnvidia-ml.so";
/// What cargo names the cdylib.
pub const BUILT_NAME: &str = "libgpushare_fake_nvml.so";

/// Copies `built` (the cdylib cargo produced) to `<dir>/libnvidia-ml.so.1` and points
/// `<dir>/libnvidia-ml.so` at it. Both are replaced atomically (temporary name + rename), so a
/// process that has the old library mapped keeps working; running it again is harmless.
/// Returns the path of the installed library.
pub fn install_into(built: &Path, dir: &Path) -> io::Result<PathBuf> {
    gpushare_fake_driver::install::install_lib(built, dir, LIB_NAME, LINK_NAME)
}

/// `<dir of the running executable>/libgpushare_fake_nvml.so`: where cargo puts the cdylib
/// next to this crate's binaries (target/<profile>/).
pub fn built_next_to_current_exe() -> io::Result<PathBuf> {
    gpushare_fake_driver::install::built_next_to_current_exe(BUILT_NAME)
}
