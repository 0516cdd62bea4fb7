//! Training throughput on CPU of the `tiny-hybrid` profile as it is (Mamba-2, attention, dense
//! and MoE blocks, `MFMEAFME`), compared with `bench/torch_hybrid.py`, a PyTorch model of the
//! same layers and shapes. Runs the trainer's real optimizer step and prints one JSON line.
//!
//! ```text
//! cargo bench -p trainyard-trainer --bench hybrid_speed -- [--threads 2] [--steps 20] [--warmup 3]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)] // bench code: a failed setup step ends it

use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use trainer::config::{Config, DeviceSpec, Progress};
use trainer::train::device::configure_threads;
use trainer::train::Trainer;

fn main() -> Result<()> {
    let (mut threads, mut steps, mut warmup) = (2usize, 20usize, 3usize);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<usize> {
            it.next()
                .with_context(|| format!("{name} needs a value"))?
                .parse()
                .with_context(|| format!("{name} takes a whole number"))
        };
        match flag.as_str() {
            "--threads" => threads = value("--threads")?,
            "--steps" => steps = value("--steps")?,
            "--warmup" => warmup = value("--warmup")?,
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            other => bail!("unknown argument {other:?}"),
        }
    }
    let mut cfg = Config::from_profile("tiny-hybrid")?;
    let t = &mut cfg.training;
    t.max_steps = warmup + steps + 1;
    t.warmup_steps = 0;
    t.device = DeviceSpec::Cpu;
    t.threads = threads;
    t.eval_steps = 0;
    t.save_steps = 0;
    cfg.logging.progress = Progress::Never;
    let threads = configure_threads(threads);
    let mut trainer = Trainer::new(cfg, Device::Cpu)?;
    for _ in 0..warmup {
        trainer.step()?;
    }
    let start = Instant::now();
    let (mut tokens, mut loss) = (0, 0.0);
    for _ in 0..steps {
        let stats = trainer.step()?;
        tokens += stats.tokens;
        loss = stats.loss;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let report = serde_json::json!({
        "impl": "trainyard",
        "shape": "tiny-hybrid",
        "threads": threads,
        "params": trainer.num_params(),
        "steps": steps,
        "step_ms": (1000.0 * elapsed / steps as f64 * 100.0).round() / 100.0,
        "tokens_per_s": (tokens as f64 / elapsed * 10.0).round() / 10.0,
        "final_loss": (loss as f64 * 1e4).round() / 1e4,
    });
    println!("{report}");
    Ok(())
}
