use std::process::ExitCode;

use clap::Parser;
use trainyard::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any thread starts: the settings are read, so the secrets among them leave the
    // process's environment and argument blocks (see `environ`).
    trainyard::environ::erase_secrets();
    trainyard::telemetry::init();
    let outcome = match cli.command {
        // Replaces this process with the confined command: no runtime, no threads.
        Command::Confine(args) => trainyard::launcher::confine::run_confined(args),
        command => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|runtime| runtime.block_on(cli::run(Cli { command }))),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
