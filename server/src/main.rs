use std::process::ExitCode;

use clap::Parser;
use trainyard::cli::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    trainyard::telemetry::init();
    match cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "trainyard failed");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
