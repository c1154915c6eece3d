//! Installing the built cdylib as `libnvidia-ml.so.1` (+ `libnvidia-ml.so` symlink).

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::symlink;
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
    check_elf(built)?;
    fs::create_dir_all(dir)?;
    let pid = std::process::id();

    let target = dir.join(LIB_NAME);
    let tmp = dir.join(format!(".{LIB_NAME}.tmp.{pid}"));
    let _ = fs::remove_file(&tmp);
    let copied = fs::copy(built, &tmp).and_then(|_| fs::rename(&tmp, &target));
    if let Err(e) = copied {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }

    let link = dir.join(LINK_NAME);
    if fs::read_link(&link).ok().as_deref() != Some(Path::new(LIB_NAME)) {
        let tmp_link = dir.join(format!(".{LINK_NAME}.tmp.{pid}"));
        let _ = fs::remove_file(&tmp_link);
        let linked = symlink(LIB_NAME, &tmp_link).and_then(|_| fs::rename(&tmp_link, &link));
        if let Err(e) = linked {
            let _ = fs::remove_file(&tmp_link);
            return Err(e);
        }
    }
    Ok(target)
}

fn check_elf(path: &Path) -> io::Result<()> {
    let mut magic = [0u8; 4];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if &magic != b"\x7fELF" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not an ELF shared library", path.display()),
        ));
    }
    Ok(())
}

/// `<dir of the running executable>/libgpushare_fake_nvml.so`: where cargo puts the cdylib
/// next to this crate's binaries (target/<profile>/).
pub fn built_next_to_current_exe() -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| io::Error::other("current executable has no parent directory"))?;
    Ok(dir.join(BUILT_NAME))
}
