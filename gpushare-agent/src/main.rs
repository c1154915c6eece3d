use std::process::ExitCode;

use clap::Parser;
use gpushare_agent::cli::{Cli, Command};

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            log::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let args = match cli.command {
        None => cli.run,
        Some(Command::Run(args)) => args,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(gpushare_agent::run::run(args))?;
    Ok(ExitCode::SUCCESS)
}
