//! Training throughput on CPU for the benchmark shape, compared with `bench/torch_gpt.py`.
//!
//! vocab 256, d_model 128, 4 layers, 4 heads, d_ff 512, context 128, batch 16, f32, GELU,
//! LayerNorm, learned positions, tied embeddings, AdamW, clipping 1.0, on the `dummy` dataset.
//! Runs the trainer's real optimizer step (`Trainer::step`) and prints one JSON line.
//!
//! ```text
//! cargo bench -p trainyard-trainer --bench train_speed -- [--threads 2] [--steps 30] [--warmup 5] [--moe] [--phases]
//! ```
//!
//! `--phases` also times forward, backward, clipping and the optimizer separately, on a copy of
//! the step built from the same public pieces `Trainer::step` uses (for profiling only).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use trainer::config::{Config, DeviceSpec, MoeConfig};
use trainer::data::{self, BatchSampler};
use trainer::model::{self, Gpt};
use trainer::optim::{self, clip_grad_norm};
use trainer::train::device::configure_threads;
use trainer::train::Trainer;

struct Args {
    threads: usize,
    steps: usize,
    warmup: usize,
    moe: bool,
    phases: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        threads: 2,
        steps: 30,
        warmup: 5,
        moe: false,
        phases: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<usize> {
            it.next()
                .with_context(|| format!("{name} needs a value"))?
                .parse()
                .with_context(|| format!("{name} takes a whole number"))
        };
        match flag.as_str() {
            "--threads" => args.threads = value("--threads")?,
            "--steps" => args.steps = value("--steps")?,
            "--warmup" => args.warmup = value("--warmup")?,
            "--moe" => args.moe = true,
            "--phases" => args.phases = true,
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            other => bail!("unknown argument {other:?}"),
        }
    }
    Ok(args)
}

fn bench_config(args: &Args) -> Config {
    let mut cfg = Config::default();
    let m = &mut cfg.model;
    m.vocab_size = 256;
    m.d_model = 128;
    m.n_layers = 4;
    m.n_heads = 4;
    m.d_ff = 512;
    m.max_seq_len = 128;
    m.dropout = 0.0;
    m.moe = args.moe.then(|| MoeConfig {
        num_experts: 8,
        top_k: 2,
        every_n_layers: 1,
        ..MoeConfig::default()
    });
    let t = &mut cfg.training;
    t.batch_size = 16;
    t.seq_len = 128;
    t.max_steps = args.warmup + args.steps + 1;
    t.warmup_steps = 0;
    t.grad_clip = 1.0;
    t.device = DeviceSpec::Cpu;
    t.threads = args.threads;
    t.eval_steps = 0;
    t.save_steps = 0;
    cfg.data.dataset = "dummy".to_string();
    cfg
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let threads = configure_threads(args.threads);
    let mut trainer = Trainer::new(bench_config(&args), Device::Cpu)?;
    for _ in 0..args.warmup {
        trainer.step()?;
    }
    let start = Instant::now();
    let mut tokens = 0;
    let mut loss = 0.0;
    for _ in 0..args.steps {
        let stats = trainer.step()?;
        tokens += stats.tokens;
        loss = stats.loss;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let report = serde_json::json!({
        "impl": "trainyard",
        "shape": if args.moe { "moe" } else { "dense" },
        "threads": threads,
        "params": trainer.num_params(),
        "steps": args.steps,
        "step_ms": (1000.0 * elapsed / args.steps as f64 * 100.0).round() / 100.0,
        "tokens_per_s": (tokens as f64 / elapsed * 10.0).round() / 10.0,
        "final_loss": (loss as f64 * 1e4).round() / 1e4,
    });
    println!("{report}");
    if args.phases {
        phases(&bench_config(&args), &args)?;
    }
    Ok(())
}

/// Milliseconds per step spent in each phase of the optimizer step.
fn phases(cfg: &Config, args: &Args) -> Result<()> {
    let t = &cfg.training;
    let device = Device::Cpu;
    let prepared = data::prepare(cfg, None)?;
    let varmap = VarMap::new();
    let model = Gpt::new(
        &cfg.model,
        VarBuilder::from_varmap(&varmap, DType::F32, &device),
    )?;
    model::init_weights(&varmap, &cfg.model, t.seed)?;
    let mut optimizer = optim::build(t, optim::params_from_varmap(&varmap, model::is_decayed))?;
    let params: Vec<Tensor> = optimizer
        .params()
        .iter()
        .map(|p| p.var.as_tensor().clone())
        .collect();
    let mut sampler = BatchSampler::new(t.batch_size, t.seq_len, t.seed);
    let mut totals = [0.0f64; 5];
    for step in 0..args.warmup + args.steps {
        let mut lap = Instant::now();
        let mut times = [0.0f64; 5];
        let mut mark = |i: usize| {
            times[i] = lap.elapsed().as_secs_f64();
            lap = Instant::now();
        };
        let (x, y) = sampler.next_batch(&prepared.train)?.to_tensors(&device)?; // (B, T)
        let out = model.forward(&x, None)?;
        let mut loss = model::cross_entropy(&out.logits, &y)?; // scalar
        if let Some(aux) = &out.aux_loss {
            loss = (loss + aux)?;
        }
        mark(0);
        let grads = loss.backward()?;
        mark(1);
        let mut grads: Vec<Option<Tensor>> = params.iter().map(|p| grads.get(p).cloned()).collect();
        mark(2);
        clip_grad_norm(&mut grads, t.grad_clip)?;
        mark(3);
        optimizer.step(&grads, t.learning_rate)?;
        mark(4);
        if step >= args.warmup {
            totals.iter_mut().zip(times).for_each(|(a, b)| *a += b);
        }
    }
    let ms = |i: usize| (totals[i] * 1000.0 / args.steps as f64 * 100.0).round() / 100.0;
    let report = serde_json::json!({
        "phases_ms": {
            "forward_and_loss": ms(0),
            "backward": ms(1),
            "collect_grads": ms(2),
            "clip": ms(3),
            "optimizer": ms(4),
        }
    });
    println!("{report}");
    Ok(())
}
