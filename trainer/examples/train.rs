//! The trainer's commands without the server binary:
//! `cargo run --release -p trainyard-trainer --example train -- train --config tiny --out runs/t`.

use clap::Parser;

#[derive(clap::Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Train a GPT.
    Train(trainer::cli::TrainArgs),
    /// Generate text from a checkpoint.
    Sample(trainer::cli::SampleArgs),
    /// Tokenizer tools.
    Tokenizer(trainer::cli::TokenizerArgs),
    /// Export a checkpoint as a Hugging Face directory.
    Export(trainer::cli::ExportArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Train(a) => trainer::cli::run_train(a),
        Command::Sample(a) => trainer::cli::run_sample(a),
        Command::Tokenizer(a) => trainer::cli::run_tokenizer(a),
        Command::Export(a) => trainer::cli::run_export(a),
    }
}
