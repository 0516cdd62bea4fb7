//! `trainyard train`: the loop around [`Trainer::step`] — evaluation, early stopping,
//! checkpoints, metrics, progress and stop requests.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use super::{device, mfu, StepStats, Trainer};
use crate::checkpoint;
use crate::config::{Config, Precision};
use crate::report::{unix_ms, Reporter, ServerTarget};
use crate::wire::{MetricsLine, RunPatch, RunStatus};

/// How to run beyond the config itself.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The run directory (`metrics.jsonl`, `config.yaml`, `checkpoints/`, `spool/`).
    pub out_dir: PathBuf,
    /// Continue from this checkpoint directory.
    pub resume_from: Option<PathBuf>,
    /// Report to this server as well as to `metrics.jsonl`.
    pub server: Option<ServerTarget>,
    /// Set (by a signal handler or a caller) to stop after the current step with a checkpoint.
    pub stop: Arc<AtomicBool>,
    /// Test hook: steps whose loss is multiplied by a factor (NaN or a spike), to exercise the
    /// instability guard.
    pub faults: super::guard::FaultPlan,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// `finished` (max_steps or early stopping) or `stopped` (stop request).
    pub status: RunStatus,
    pub reason: String,
    /// Optimizer steps completed.
    pub steps: u64,
    pub last_val_loss: Option<f64>,
    pub best_val_loss: Option<f64>,
    /// The checkpoint written at the end.
    pub checkpoint: PathBuf,
}

/// Trains `cfg` (already validated) in `opts.out_dir` until `training.max_steps`, early
/// stopping, or a stop request. The server, when given, hears `running` at the start and the
/// final status at the end (`failed` with the error when training fails).
pub fn run(cfg: Config, opts: &RunOptions) -> Result<RunOutcome> {
    // Before any other thread exists (the reporter's) and before any tensor work.
    let threads = device::configure_threads(cfg.training.threads);
    std::fs::create_dir_all(&opts.out_dir)
        .with_context(|| format!("creating {}", opts.out_dir.display()))?;
    let resume_step = match &opts.resume_from {
        Some(dir) => Some(checkpoint::read_state(dir)?.step as i64),
        None => None,
    };
    let mut reporter = Reporter::open(&opts.out_dir, resume_step, opts.server.clone())?;
    reporter.patch(RunPatch {
        status: Some(RunStatus::Running),
        config: serde_json::to_value(&cfg).ok(),
        ..RunPatch::default()
    });
    match train(cfg, opts, threads, &mut reporter) {
        Ok(outcome) => {
            reporter.finish(outcome.status, Some(outcome.reason.clone()));
            Ok(outcome)
        }
        Err(e) => {
            reporter.finish(RunStatus::Failed, Some(format!("{e:#}")));
            Err(e)
        }
    }
}

fn train(
    cfg: Config,
    opts: &RunOptions,
    threads: usize,
    reporter: &mut Reporter,
) -> Result<RunOutcome> {
    let out = &opts.out_dir;
    let dev = device::resolve_device(cfg.training.device)?;
    match (cfg.training.precision, dev.is_cuda()) {
        // TF32 is a mode of cuBLAS's f32 GEMMs, not a dtype: switch it on for the process.
        (Precision::Tf32, true) => candle_core::cuda::set_gemm_reduced_precision_f32(true),
        (Precision::Tf32, false) => {
            tracing::info!("training.precision: tf32 only changes CUDA matmuls; f32 on the CPU")
        }
        (Precision::Bf16, false) => tracing::info!(
            "training.precision: bf16 matmuls on the CPU check numerics but are slower than f32"
        ),
        _ => {}
    }
    let cuda_ordinal = match cfg.training.device.cuda_ordinal() {
        Some(n) => Some(n),
        None if dev.is_cuda() => Some(0),
        None => None,
    };
    let peak_flops = mfu::device_peak(cuda_ordinal);
    std::fs::write(out.join("config.yaml"), cfg.to_yaml()?)
        .with_context(|| format!("writing {}", out.join("config.yaml").display()))?;
    tracing::info!(
        device = %device::describe(&dev),
        threads,
        out = %out.display(),
        "starting"
    );

    let mut trainer = match &opts.resume_from {
        Some(dir) => Trainer::resume(cfg.clone(), dev, dir)?,
        None => Trainer::new(cfg.clone(), dev)?,
    };
    trainer.inject_faults(opts.faults.clone());
    let t = &cfg.training;
    let max_steps = t.max_steps as u64;
    let flops_per_token = crate::model::Gpt::flops_per_token(&cfg.model, t.seq_len);
    let stats = &trainer.data().stats;
    tracing::info!(
        params = trainer.num_params(),
        trainable = trainer.trainable_params(),
        train_tokens = stats.train_tokens,
        val_tokens = stats.val_tokens,
        vocab = stats.vocab_size,
        "model and data ready"
    );
    // The data's counts (documents, filters) go to the run page once, before step 1.
    let data_metrics = stats.metrics(&cfg.data);
    if opts.resume_from.is_none() && !data_metrics.is_empty() {
        tracing::info!(
            "data: {} documents; filters: {}",
            stats.documents,
            stats.filtered
        );
        reporter.log(&MetricsLine {
            step: 0,
            time: unix_ms(),
            metrics: data_metrics,
        })?;
    }
    let progress = Progress::new(&cfg, trainer.state().step, max_steps);
    let mut first_line = opts.resume_from.is_none();
    let mut last_saved = None;
    let mut reason = "reached training.max_steps".to_string();
    let mut status = RunStatus::Finished;

    while trainer.state().step < max_steps && !trainer.state().early_stopped {
        let mut s = trainer.step()?;
        if !s.loss.is_finite() && s.guard.is_none() {
            anyhow::bail!("training diverged at step {}: loss is {}", s.step, s.loss);
        }
        let mut metrics = step_metrics(&mut s);
        if let Some(verdict) = s.guard {
            trainer.follow_guard(verdict, s.step, s.loss, out, &mut metrics)?;
        }
        if let Some(peak) = peak_flops {
            let tokens_per_s = s.tokens as f64 / s.seconds.max(1e-9);
            metrics.insert(
                "perf/mfu".into(),
                mfu::mfu(tokens_per_s, flops_per_token, peak),
            );
        }
        #[cfg(feature = "cuda")]
        if let Ok(Some(bytes)) = crate::kernels::cuda::peak_pool_bytes(trainer.device()) {
            metrics.insert(
                "perf/gpu_mem_peak_gib".into(),
                bytes as f64 / (1u64 << 30) as f64,
            );
        }
        if first_line {
            metrics.insert("model/params".into(), trainer.num_params() as f64);
            metrics.insert(
                "model/trainable_params".into(),
                trainer.trainable_params() as f64,
            );
            first_line = false;
        }
        let last = s.step == max_steps;
        let eval_now = (t.eval_steps > 0 && s.step % t.eval_steps as u64 == 0) || last;
        let mut improved = false;
        if eval_now {
            let (val, val_metrics) = trainer.evaluate()?;
            metrics.extend(val_metrics);
            let patience = t.early_stopping_patience;
            improved = trainer.state_mut().record_eval(val, patience);
        }
        reporter.log(&MetricsLine {
            step: s.step as i64,
            time: unix_ms(),
            metrics,
        })?;
        progress.update(&s, trainer.state().val_loss, cfg.logging.log_every);

        if improved {
            trainer.save_best(out)?;
        }
        let stop_requested = opts.stop.load(Ordering::SeqCst);
        let periodic = t.save_steps > 0 && s.step % t.save_steps as u64 == 0;
        if periodic || last || stop_requested || trainer.state().early_stopped {
            last_saved = Some(trainer.save_checkpoint(out)?);
        }
        if trainer.state().early_stopped {
            reason = early_stopping_reason(trainer.state(), t.early_stopping_patience);
        }
        if stop_requested && !last && !trainer.state().early_stopped {
            status = RunStatus::Stopped;
            reason = format!("stop requested; checkpoint saved at step {}", s.step);
            break;
        }
    }
    progress.finish();
    let checkpoint = match last_saved {
        Some(p) => p,
        // Nothing to do (already at max_steps): the checkpoint we resumed from is the last one.
        None => match &opts.resume_from {
            Some(dir) => dir.clone(),
            None => trainer.save_checkpoint(out)?,
        },
    };
    let st = trainer.state();
    let best = st
        .best_val_loss
        .map(|b| format!("{b:.4}"))
        .unwrap_or_else(|| "none".to_string());
    tracing::info!(steps = st.step, best_val_loss = %best, %reason, "done");
    Ok(RunOutcome {
        status,
        reason,
        steps: st.step,
        last_val_loss: st.val_loss,
        best_val_loss: st.best_val_loss,
        checkpoint,
    })
}

/// The reason a run ended by early stopping gives with its final status.
fn early_stopping_reason(st: &checkpoint::TrainState, patience: usize) -> String {
    let best = st
        .best_val_loss
        .map(|b| format!("; best val/loss {b:.4}"))
        .unwrap_or_default();
    format!(
        "early stopping at step {}: val/loss did not improve for {patience} evaluations \
         (training.early_stopping_patience){best}",
        st.step
    )
}

/// The step's metric line: the basics joined to the step's own extra metrics (moved, not
/// copied).
fn step_metrics(s: &mut StepStats) -> BTreeMap<String, f64> {
    let mut m = std::mem::take(&mut s.extra);
    m.insert("train/loss".into(), f64::from(s.loss));
    m.insert("lr".into(), s.lr);
    m.insert("grad_norm".into(), f64::from(s.grad_norm));
    m.insert(
        "perf/tokens_per_s".into(),
        s.tokens as f64 / s.seconds.max(1e-9),
    );
    m
}

/// Whether step `step` gets a line in the output: every `log_every` steps and at every
/// evaluation, with or without the progress bar.
fn prints_line(step: u64, log_every: usize, evaluated: bool) -> bool {
    evaluated || (log_every > 0 && step.is_multiple_of(log_every as u64))
}

/// Plain step lines every `log_every` steps, and on a terminal a progress bar below them.
struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    fn new(cfg: &Config, start: u64, max_steps: u64) -> Self {
        let show = cfg.logging.progress.shows(std::io::stderr().is_terminal());
        let bar = show.then(|| {
            let bar = ProgressBar::new(max_steps);
            if let Ok(style) = ProgressStyle::with_template(
                "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
            ) {
                bar.set_style(style);
            }
            bar.set_position(start);
            bar
        });
        Progress { bar }
    }

    fn update(&self, s: &StepStats, val: Option<f64>, log_every: usize) {
        let print = prints_line(s.step, log_every, val.is_some());
        // Most steps neither print nor draw: then the line is not even formatted.
        if !print && self.bar.is_none() {
            return;
        }
        let val = val.map(|v| format!(" val {v:.4}")).unwrap_or_default();
        let line = format!(
            "step {} loss {:.4}{val} lr {:.2e} grad_norm {:.3} {:.0} tok/s",
            s.step,
            s.loss,
            s.lr,
            s.grad_norm,
            s.tokens as f64 / s.seconds.max(1e-9)
        );
        match &self.bar {
            Some(bar) => {
                // Above the bar, so the scrollback keeps the loss history (a bar that cannot
                // draw, off a terminal, would swallow the line: print it plainly then).
                if print && bar.is_hidden() {
                    eprintln!("{line}");
                } else if print {
                    bar.println(&line);
                }
                bar.set_position(s.step);
                bar.set_message(line);
            }
            None if print => eprintln!("{line}"),
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_line_is_printed_every_log_every_steps_and_at_each_evaluation() {
        let printed: Vec<u64> = (1..=25).filter(|&s| prints_line(s, 10, false)).collect();
        assert_eq!(printed, [10, 20]);
        assert!(
            prints_line(7, 10, true),
            "an evaluation always gets its line"
        );
        assert!(!prints_line(7, 0, false));
    }

    #[test]
    fn the_early_stopping_reason_says_why_in_words() {
        let mut st = crate::checkpoint::TrainState {
            step: 120,
            tokens_seen: 0,
            sampler: crate::data::SamplerState {
                seed: 0,
                batches: 0,
            },
            dropout_seed: 0,
            best_val_loss: Some(1.4567),
            evals_without_improvement: 3,
            early_stopped: true,
            val_loss: None,
            guard: Default::default(),
        };
        assert_eq!(
            early_stopping_reason(&st, 3),
            "early stopping at step 120: val/loss did not improve for 3 evaluations \
             (training.early_stopping_patience); best val/loss 1.4567"
        );
        st.best_val_loss = None;
        assert!(!early_stopping_reason(&st, 3).contains("None"));
    }
}
