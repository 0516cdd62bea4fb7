//! The `train`, `sample` and `tokenizer` commands (the `trainyard` binary dispatches here).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::checkpoint;
use crate::config::{Config, DeviceSpec};
use crate::report::{self, unix_ms, NewRun, ServerTarget};
use crate::sample::{self, SamplingParams};
use crate::train::{self, device, RunOptions};
use crate::wire::RunStatus;

/// `trainyard train`: train a GPT from a config file or profile.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TrainArgs {
    /// Config file (YAML) or built-in profile: tiny, small, medium, large, tiny-moe, small-moe,
    /// tiny-hybrid, small-hybrid.
    /// With --resume it defaults to the checkpoint's own config.
    #[arg(long, value_name = "FILE|PROFILE")]
    pub config: Option<String>,
    /// Override one key, e.g. `--set training.max_steps=500` (repeatable).
    #[arg(long = "set", visible_alias = "override", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Run directory (metrics.jsonl, config.yaml, checkpoints/). Default: `runs/run-<unix ms>`.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Continue from a checkpoint: `latest` (the newest in --out) or a checkpoint directory.
    #[arg(long, value_name = "PATH|latest")]
    pub resume: Option<String>,
    /// Tracking server to report to, e.g. http://127.0.0.1:8080. Without --run-id the run is
    /// created there first (its id and page are printed).
    #[arg(long, env = "TRAINYARD_SERVER_URL")]
    pub server: Option<String>,
    /// The server's id of this run (a run created beforehand, as the launcher does).
    #[arg(long, env = "TRAINYARD_RUN_ID", requires = "server")]
    pub run_id: Option<String>,
    /// Experiment (id or name) of the run --server creates; a new name creates it.
    #[arg(long, requires = "server", conflicts_with = "run_id")]
    pub experiment: Option<String>,
    /// Name of the run --server creates (default: the server picks one).
    #[arg(long, requires = "server", conflicts_with = "run_id")]
    pub name: Option<String>,
    /// Print the resolved, validated config as YAML and exit without training.
    #[arg(long)]
    pub print_config: bool,
}

/// `trainyard sample`: generate text from a checkpoint.
#[derive(clap::Args, Debug, Clone)]
pub struct SampleArgs {
    /// A checkpoint directory, or a run directory (its best, else latest, checkpoint).
    #[arg(long, value_name = "PATH")]
    pub checkpoint: PathBuf,
    #[arg(long, default_value = "")]
    pub prompt: String,
    #[arg(long, default_value_t = 200)]
    pub max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Sample among the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1.0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: DeviceSpec,
}

/// `trainyard export`: write a checkpoint in another framework's format.
#[derive(clap::Args, Debug, Clone)]
pub struct ExportArgs {
    /// Output format: `hf` (a Hugging Face `transformers` directory).
    #[arg(long, default_value = "hf")]
    pub format: String,
    /// Fold a LoRA checkpoint's adapters into the base weights (required for LoRA checkpoints).
    #[arg(long)]
    pub merge: bool,
    /// A checkpoint directory, or a run directory (its best, else latest, checkpoint).
    #[arg(value_name = "RUN_OR_CHECKPOINT")]
    pub source: PathBuf,
    /// The directory to write (created; an earlier export there is replaced).
    #[arg(value_name = "OUT_DIR")]
    pub out: PathBuf,
}

/// `trainyard tokenizer ...`
#[derive(clap::Args, Debug, Clone)]
pub struct TokenizerArgs {
    #[command(subcommand)]
    pub command: TokenizerCommand,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum TokenizerCommand {
    /// Train a byte-level BPE tokenizer.
    Train(TokenizerTrainArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub struct TokenizerTrainArgs {
    /// Text files, directories, globs or JSONL files (a `text` field per line).
    #[arg(long, required = true, num_args = 1..)]
    pub input: Vec<PathBuf>,
    #[arg(long)]
    pub vocab_size: usize,
    #[arg(long, default_value = "tokenizer.json")]
    pub out: PathBuf,
}

/// Loads and validates the config for `args` (before any work starts) and finds the checkpoint
/// to resume from. Errors name the offending key.
pub fn resolve_config(args: &TrainArgs, out: &Path) -> Result<(Config, Option<PathBuf>)> {
    let resume = match &args.resume {
        Some(spec) => Some(checkpoint::resolve(out, spec)?),
        None => None,
    };
    let mut cfg = match (&args.config, &resume) {
        (Some(spec), _) => Config::load(spec)?,
        (None, Some(dir)) => checkpoint::read_config(dir)?,
        (None, None) => bail!("--config FILE|PROFILE is required (or --resume)"),
    };
    cfg.apply_overrides(&args.set)?;
    // `hf:PATH` fixes the model's shape: the resolved config shows (and checks) that shape.
    if cfg
        .training
        .init_from
        .as_deref()
        .is_some_and(|s| s.starts_with(crate::hf::PREFIX))
    {
        crate::train::finetune::resolve_init_from(&mut cfg)?;
    }
    cfg.validate()?;
    Ok((cfg, resume))
}

/// `trainyard train`. A stop signal (SIGTERM, SIGINT) finishes the current step, saves a
/// checkpoint and returns Ok with the run marked `stopped`.
pub fn run_train(args: TrainArgs) -> Result<()> {
    let out = match (&args.out, &args.resume) {
        (Some(out), _) => out.clone(),
        (None, Some(spec)) if spec == "latest" => {
            bail!("--resume latest needs --out DIR (the run directory to resume)")
        }
        (None, Some(spec)) => run_dir_of_checkpoint(Path::new(spec)),
        (None, None) => PathBuf::from("runs").join(format!("run-{}", unix_ms())),
    };
    let (cfg, resume_from) = resolve_config(&args, &out)?;
    if args.print_config {
        print!("{}", cfg.to_yaml()?);
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // A second signal while the first is being honoured exits at once (130, as a shell).
        signal_hook::flag::register_conditional_shutdown(sig, 130, stop.clone())
            .context("installing signal handlers")?;
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let token = std::env::var("TRAINYARD_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    let server = match args.server {
        Some(url) => {
            let run_id = match args.run_id {
                Some(id) => id,
                None => {
                    let new = NewRun {
                        experiment: args.experiment.as_deref(),
                        name: args.name.as_deref(),
                        config: &cfg,
                    };
                    let id = report::create_run(&url, token.as_deref(), &new)?;
                    println!("run {id}: {}", report::run_page(&url, &id));
                    id
                }
            };
            Some(ServerTarget {
                url,
                run_id,
                token,
                flush_interval: Duration::from_millis(cfg.logging.flush_interval_ms.max(1)),
                final_flush_timeout: Duration::from_secs(30),
                heartbeat_interval: Duration::from_secs(cfg.logging.heartbeat_interval_secs.max(1)),
            })
        }
        None => None,
    };
    let opts = RunOptions {
        out_dir: out.clone(),
        resume_from,
        server,
        stop,
        faults: Default::default(),
    };
    let outcome = train::run(cfg, &opts)?;
    let best = outcome
        .best_val_loss
        .map(|b| format!(", best val/loss {b:.4}"))
        .unwrap_or_default();
    eprintln!(
        "{} after {} steps ({}){best}; checkpoint {}",
        outcome.status,
        outcome.steps,
        outcome.reason,
        outcome.checkpoint.display()
    );
    if outcome.status == RunStatus::Failed {
        bail!("{}", outcome.reason);
    }
    Ok(())
}

/// `DIR/checkpoints/step-N` → `DIR`.
fn run_dir_of_checkpoint(ckpt: &Path) -> PathBuf {
    ckpt.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `trainyard sample`: prints the prompt's continuation to stdout.
pub fn run_sample(args: SampleArgs) -> Result<()> {
    if !(0.0..=1.0).contains(&args.top_p) || args.top_p == 0.0 {
        bail!("--top-p: must be in (0, 1], got {}", args.top_p);
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        bail!("--temperature: must be >= 0, got {}", args.temperature);
    }
    let dev = device::resolve_device(args.device)?;
    let loaded = sample::load(&args.checkpoint, dev)?;
    // On stderr, so stdout holds only the text.
    eprintln!("{}", loaded.describe());
    let text = loaded.generate(
        &args.prompt,
        args.max_new_tokens,
        SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
        },
        args.seed,
    )?;
    println!("{}{text}", args.prompt);
    Ok(())
}

/// `trainyard export --format hf [--merge] RUN_OR_CHECKPOINT OUT_DIR`.
pub fn run_export(args: ExportArgs) -> Result<()> {
    if args.format != "hf" {
        bail!("--format: the only format is hf, got \"{}\"", args.format);
    }
    let dir = crate::hf::export::export(&args.source, &args.out, args.merge)?;
    eprintln!("wrote a Hugging Face model directory to {}", dir.display());
    Ok(())
}

/// `trainyard tokenizer train`.
pub fn run_tokenizer(args: TokenizerArgs) -> Result<()> {
    match args.command {
        TokenizerCommand::Train(t) => {
            let tok = crate::data::train_bpe(&t.input, t.vocab_size, &t.out)?;
            eprintln!(
                "trained a byte-level BPE with {} ids; wrote {}",
                tok.vocab_size(),
                t.out.display()
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Command {
        Train(TrainArgs),
        Sample(SampleArgs),
        Tokenizer(TokenizerArgs),
        Export(ExportArgs),
    }

    fn parse(argv: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("trainyard").chain(argv.iter().copied()))
            .map(|c| c.command)
    }

    #[test]
    fn the_argument_definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn override_is_an_alias_of_set_and_both_repeat() {
        let Ok(Command::Train(t)) = parse(&[
            "train",
            "--config",
            "tiny",
            "--set",
            "training.max_steps=5",
            "--override",
            "model.dropout=0.1",
            "--out",
            "runs/x",
            "--resume",
            "latest",
        ]) else {
            panic!("train should parse");
        };
        assert_eq!(t.set, vec!["training.max_steps=5", "model.dropout=0.1"]);
        assert_eq!(t.resume.as_deref(), Some("latest"));
    }

    #[test]
    fn a_server_without_a_run_id_parses_and_names_go_only_with_a_created_run() {
        let Ok(Command::Train(t)) = parse(&[
            "train",
            "--config",
            "tiny",
            "--server",
            "http://x",
            "--experiment",
            "sweeps",
            "--name",
            "first",
        ]) else {
            panic!("train --server without --run-id should parse");
        };
        assert_eq!(t.server.as_deref(), Some("http://x"));
        assert_eq!(
            (t.experiment.as_deref(), t.name.as_deref()),
            (Some("sweeps"), Some("first"))
        );
        let refused: &[&[&str]] = &[
            &["train", "--config", "tiny", "--run-id", "r1"],
            &["train", "--config", "tiny", "--name", "n"],
            &[
                "train", "--config", "tiny", "--server", "http://x", "--run-id", "r", "--name", "n",
            ],
        ];
        for argv in refused {
            assert!(parse(argv).is_err(), "{argv:?} should be refused");
        }
    }

    #[test]
    fn sample_and_tokenizer_commands_parse() {
        let Ok(Command::Sample(s)) = parse(&[
            "sample",
            "--checkpoint",
            "runs/x",
            "--prompt",
            "Hi",
            "--top-k",
            "5",
            "--top-p",
            "0.9",
        ]) else {
            panic!("sample should parse");
        };
        assert_eq!((s.top_k, s.top_p, s.prompt.as_str()), (5, 0.9, "Hi"));
        let Ok(Command::Tokenizer(t)) = parse(&[
            "tokenizer",
            "train",
            "--input",
            "a.txt",
            "docs/",
            "--vocab-size",
            "512",
        ]) else {
            panic!("tokenizer should parse");
        };
        let TokenizerCommand::Train(t) = t.command;
        assert_eq!(t.input.len(), 2);
        assert_eq!(t.vocab_size, 512);
    }

    #[test]
    fn export_takes_a_source_and_an_out_dir_and_refuses_unknown_formats() {
        let Ok(Command::Export(e)) =
            parse(&["export", "--format", "hf", "--merge", "runs/x", "out"])
        else {
            panic!("export should parse");
        };
        assert!(e.merge);
        assert_eq!(
            (e.source.as_path(), e.out.as_path()),
            (Path::new("runs/x"), Path::new("out"))
        );
        let err = run_export(ExportArgs {
            format: "onnx".into(),
            ..e
        })
        .unwrap_err();
        assert!(err.to_string().starts_with("--format:"), "{err}");
        assert!(parse(&["export", "runs/x"]).is_err(), "OUT_DIR is required");
    }

    #[test]
    fn resume_latest_without_an_out_dir_is_refused() {
        let err = run_train(TrainArgs {
            resume: Some("latest".into()),
            ..TrainArgs::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("--out"), "{err}");
    }
}
