//! Installing a built mock cdylib under NVIDIA's library name (`libnvidia-ml.so.1`,
//! `libcuda.so.1`) plus the link-time name (`libnvidia-ml.so`, `libcuda.so`), and the command
//! line of the two installer binaries.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Copies `built` to `<dir>/<lib_name>` and points `<dir>/<link_name>` at it. Both are replaced
/// atomically (temporary name + rename), so a process that has the old library mapped keeps
/// working; running it again is harmless. Returns the path of the installed library.
pub fn install_lib(
    built: &Path,
    dir: &Path,
    lib_name: &str,
    link_name: &str,
) -> io::Result<PathBuf> {
    check_elf(built)?;
    fs::create_dir_all(dir)?;
    let pid = std::process::id();

    let target = dir.join(lib_name);
    let tmp = dir.join(format!(".{lib_name}.tmp.{pid}"));
    let _ = fs::remove_file(&tmp);
    let copied = fs::copy(built, &tmp).and_then(|_| fs::rename(&tmp, &target));
    if let Err(e) = copied {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }

    let link = dir.join(link_name);
    if fs::read_link(&link).ok().as_deref() != Some(Path::new(lib_name)) {
        let tmp_link = dir.join(format!(".{link_name}.tmp.{pid}"));
        let _ = fs::remove_file(&tmp_link);
        let linked = symlink(lib_name, &tmp_link).and_then(|_| fs::rename(&tmp_link, &link));
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

/// `<dir of the running executable>/<built_name>`: where cargo puts a cdylib next to the
/// binaries of the same build (target/<profile>/).
pub fn built_next_to_current_exe(built_name: &str) -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| io::Error::other("current executable has no parent directory"))?;
    Ok(dir.join(built_name))
}

/// `<tool> [--from <built>] --to <dir>`: the installer binaries' whole command line.
pub fn installer_main(
    tool: &str,
    built_name: &str,
    install: fn(&Path, &Path) -> io::Result<PathBuf>,
) -> ExitCode {
    let usage = format!("usage: {tool} [--from <{built_name}>] --to <dir>");
    let mut from: Option<PathBuf> = None;
    let mut to: Option<PathBuf> = None;
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        let arg = arg.to_string_lossy().into_owned();
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(PathBuf::from(v))),
            None => (arg.clone(), None),
        };
        let slot = match flag.as_str() {
            "--from" => &mut from,
            "--to" => &mut to,
            "-h" | "--help" => {
                println!("{usage}");
                return ExitCode::SUCCESS;
            }
            _ => {
                eprintln!("{tool}: unknown argument {arg:?}\n{usage}");
                return ExitCode::from(2);
            }
        };
        match inline.or_else(|| args.next().map(PathBuf::from)) {
            Some(v) => *slot = Some(v),
            None => {
                eprintln!("{tool}: {flag} needs a value\n{usage}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(to) = to else {
        eprintln!("{tool}: --to is required\n{usage}");
        return ExitCode::from(2);
    };
    let from = match from.map_or_else(|| built_next_to_current_exe(built_name), Ok) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{tool}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match install(&from, &to) {
        Ok(installed) => {
            println!("{}", installed.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "{tool}: installing {} into {}: {e}",
                from.display(),
                to.display()
            );
            ExitCode::FAILURE
        }
    }
}
