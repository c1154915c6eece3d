//! `gpushare-fake-nvml-install [--from <libgpushare_fake_nvml.so>] --to <dir>`: installs the
//! mock as `<dir>/libnvidia-ml.so.1` plus a `libnvidia-ml.so` symlink (atomic, idempotent).
//! `--from` defaults to the cdylib next to this binary (target/<profile>/).

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str =
    "usage: gpushare-fake-nvml-install [--from <libgpushare_fake_nvml.so>] --to <dir>";

fn main() -> ExitCode {
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
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ => {
                eprintln!("gpushare-fake-nvml-install: unknown argument {arg:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        };
        match inline.or_else(|| args.next().map(PathBuf::from)) {
            Some(v) => *slot = Some(v),
            None => {
                eprintln!("gpushare-fake-nvml-install: {flag} needs a value\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(to) = to else {
        eprintln!("gpushare-fake-nvml-install: --to is required\n{USAGE}");
        return ExitCode::from(2);
    };
    let from = match from.map_or_else(gpushare_fake_nvml::install::built_next_to_current_exe, Ok) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("gpushare-fake-nvml-install: {e}");
            return ExitCode::FAILURE;
        }
    };
    match gpushare_fake_nvml::install_into(&from, &to) {
        Ok(installed) => {
            println!("{}", installed.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "gpushare-fake-nvml-install: installing {} into {}: {e}",
                from.display(),
                to.display()
            );
            ExitCode::FAILURE
        }
    }
}
