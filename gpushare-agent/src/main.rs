use std::process::ExitCode;

use clap::Parser;
use gpushare_agent::{
    cli::{Cli, Command},
    client::{Endpoint, request},
    quota::file::load_dir_set,
    shown::log_message,
    snapshot::Snapshot,
    status::{self, render_quota_rows, render_status},
};

fn main() -> ExitCode {
    // env_logger's own layout, with names a tenant chooses (in any message) escaped.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format(|buf, record| {
            use std::io::Write;
            writeln!(
                buf,
                "[{} {:<5} {}] {}",
                buf.timestamp_millis(),
                record.level(),
                record.target(),
                log_message(&record.args().to_string())
            )
        })
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpushare-agent: error: {}", log_message(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(gpushare_agent::run::run(cli.run))?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Check { path, cuda_lib }) => {
            let dropins = vec![
                path.parent()
                    .unwrap_or(std::path::Path::new("/"))
                    .join("quotas.d"),
            ];
            match load_dir_set(&path, &dropins) {
                Ok(set) => {
                    if !path.exists() {
                        println!("note: {} does not exist (no file entries)", path.display());
                    }
                    print!("{}", render_quota_rows(&set.describe()));
                    for w in set.warnings() {
                        println!("warning: {w}");
                    }
                    if set.uses_suspend()
                        && let Err(e) =
                            gpushare_agent::cuda::Checkpointer::open(cuda_lib.as_deref())
                    {
                        println!(
                            "warning: a ladder uses `suspend`, but on this node {e}; the step falls \
                             through to the next one (counted in gpushare_suspend_fallthroughs_total)"
                        );
                    }
                    println!(
                        "OK: {} and {}/*.toml are valid",
                        path.display(),
                        dropins[0].display()
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(errors) => {
                    for e in &errors {
                        eprintln!("{e}");
                    }
                    eprintln!(
                        "INVALID: {} error(s); a running agent keeps its last good configuration",
                        errors.len()
                    );
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Some(Command::Status {
            json,
            verify,
            socket,
        }) => show_status(json, verify, &socket),
        Some(Command::Release { workload, socket }) => {
            let body = serde_json::json!({ "workload": workload }).to_string();
            let (code, answer) = request(
                &Endpoint::Unix(&socket),
                "POST",
                "/api/v1/release",
                Some(&body),
            )
            .map_err(|e| {
                anyhow::anyhow!(
                    "no gpushare agent on {} ({e:#}); release needs root and a running agent",
                    socket.display()
                )
            })?;
            if code == 200 {
                print!("{answer}");
                Ok(ExitCode::SUCCESS)
            } else {
                eprint!("{answer}");
                Ok(ExitCode::FAILURE)
            }
        }
        Some(Command::Thaw {
            all: _,
            state_dir,
            force,
            cuda_lib,
            nvml_lib,
            restore_without_room,
        }) => {
            use gpushare_agent::enforce::Room;
            let cuda = gpushare_agent::cuda::Checkpointer::open(cuda_lib.as_deref())
                .map(std::sync::Arc::new)
                .map_err(|e| e.to_string());
            let mut nvml = gpushare_agent::nvml::NvmlSampler::open(nvml_lib.as_deref());
            let sample = match nvml.status() {
                gpushare_agent::nvml::DriverStatus::Ready { .. } => Ok(nvml.sample()),
                gpushare_agent::nvml::DriverStatus::NoDriver { reason } => {
                    Err(format!("no NVML: {reason}"))
                }
            };
            let room = match (&sample, restore_without_room) {
                (_, true) => Room::Ignore,
                (Ok(s), false) => Room::Sample(s.clone()),
                (Err(why), false) => Room::Unknown(why.clone()),
            };
            let report = gpushare_agent::enforce::thaw_everything(&state_dir, force, cuda, &room)?;
            // The driver limits this boot's agents set (recorded in the state directory).
            if let Ok(s) = &sample {
                let v2_root = gpushare_agent::attribution::cgroupfs::find_cgroup2_mount()?;
                let mut limits = gpushare_agent::enforce::driver_limits::DriverLimiter::new(
                    nvml_lib.as_deref(),
                    v2_root,
                    Some(&state_dir),
                );
                let n = limits.clear_recorded(&nvml, &s.devices);
                if n > 0 {
                    println!("cleared {n} driver limit(s) set by the agent");
                }
            }
            for (w, dir) in &report.thawed {
                println!("thawed {w} ({})", dir.display());
            }
            for (w, dir) in &report.resumed {
                println!("resumed {w} ({})", dir.display());
            }
            for (w, dir) in &report.gone {
                println!("forgot {w}: {} no longer exists", dir.display());
            }
            for (w, dir, why) in &report.left_suspended {
                eprintln!("left suspended {w} ({}): {why}", dir.display());
            }
            for (w, dir, why) in &report.failed {
                eprintln!("NOT thawed {w} ({}): {why}", dir.display());
            }
            println!(
                "{} thawed, {} resumed, {} gone, {} left suspended, {} failed (state directory {})",
                report.thawed.len(),
                report.resumed.len(),
                report.gone.len(),
                report.left_suspended.len(),
                report.failed.len(),
                state_dir.display()
            );
            Ok(
                if report.failed.is_empty() && report.left_suspended.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                },
            )
        }
        Some(Command::Launch(args)) => Ok(gpushare_agent::launch::main(*args)),
    }
}

/// `status`: the table or the JSON; with `verify`, the exit status of [`status::verify_exit`]
/// ([`status::VERIFY_NO_AGENT`] when no agent answers).
fn show_status(json: bool, verify: bool, socket: &std::path::Path) -> anyhow::Result<ExitCode> {
    let answer = request(&Endpoint::Unix(socket), "GET", "/api/v1/state", None);
    let (code, body) = match answer {
        Ok(a) => a,
        Err(e) if verify => {
            eprintln!(
                "gpushare-agent: no gpushare agent answers on {} ({e:#})",
                socket.display()
            );
            return Ok(ExitCode::from(status::VERIFY_NO_AGENT));
        }
        Err(e) => anyhow::bail!(
            "no gpushare agent answers on {} ({e:#}); status needs root and a running agent (`cargo xtask run`, or `systemctl status gpushare-agent`)",
            socket.display()
        ),
    };
    if code != 200 && verify {
        eprintln!("gpushare-agent: the agent answered HTTP {code}: {body}");
        return Ok(ExitCode::from(status::VERIFY_NO_AGENT));
    }
    anyhow::ensure!(code == 200, "the agent answered HTTP {code}: {body}");
    if json {
        println!("{body}");
        if !verify {
            return Ok(ExitCode::SUCCESS);
        }
    }
    let snap: Snapshot = serde_json::from_str(&body)?;
    if !json {
        print!("{}", render_status(&snap));
    }
    Ok(if verify {
        ExitCode::from(status::verify_exit(&snap))
    } else {
        ExitCode::SUCCESS
    })
}
