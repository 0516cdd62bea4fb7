//! The `tiny-hybrid` profile end to end: it learns the dummy chain and the demo text, a resumed
//! run repeats a straight one bit for bit, and `trainyard sample` generates from its checkpoint
//! with the recurrent form.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use std::fs;
use std::path::Path;

use candle_core::Device;
use trainer::cli::{resolve_config, TrainArgs};
use trainer::config::Config;
use trainer::sample::{self, SamplingParams};
use trainer::train::{run, RunOptions, Trainer};
use trainer::wire::MetricsLine;

/// `profile` shrunk for the CPU test suite, on two threads.
fn profile(name: &str, overrides: &[&str]) -> Config {
    let mut cfg = Config::from_profile(name).unwrap();
    let mut all = vec![
        "training.device=cpu",
        "training.threads=2",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.max_seq_len=32",
        "model.mamba.head_dim=16",
        "model.mamba.chunk_size=16",
        "training.seq_len=32",
        "training.batch_size=8",
        "training.eval_iters=4",
        "logging.progress=never",
    ];
    if name == "tiny" {
        all.retain(|s| !s.starts_with("model.mamba"));
    }
    all.extend_from_slice(overrides);
    let all: Vec<String> = all.into_iter().map(String::from).collect();
    cfg.apply_overrides(&all).unwrap();
    cfg.validate().unwrap();
    cfg
}

fn losses(cfg: Config, steps: usize) -> Vec<f32> {
    let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
    (0..steps).map(|_| trainer.step().unwrap().loss).collect()
}

fn train_loss(dir: &Path) -> Vec<f64> {
    fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<MetricsLine>(l).unwrap())
        .filter_map(|l| l.metrics.get("train/loss").copied())
        .collect()
}

#[test]
fn tiny_hybrid_learns_the_dummy_chain_well_below_a_dense_models_first_loss() {
    let set = ["training.max_steps=200", "training.learning_rate=1e-2"];
    let dense_first = losses(profile("tiny", &set), 1)[0];
    let hybrid = losses(profile("tiny-hybrid", &set), 200);
    let last = hybrid[190..].iter().sum::<f32>() / 10.0;
    // The chain's entropy rate is ~1.21 nats; the untrained models start near ln 256 ≈ 5.55.
    assert!(
        (hybrid[0] - dense_first).abs() < 0.5,
        "{} vs {dense_first}",
        hybrid[0]
    );
    assert!(
        last < 0.5 * dense_first,
        "loss {last} after 200 steps vs {dense_first}"
    );
}

#[test]
fn tiny_hybrid_learns_the_demo_text_well_below_a_dense_models_first_loss() {
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = format!("data.cache_dir={}", cache.path().display());
    let set = [
        "data.dataset=demo",
        cache_dir.as_str(),
        "training.max_steps=150",
        "training.warmup_steps=10",
        "training.learning_rate=5e-3",
    ];
    let dense_first = losses(profile("tiny", &set), 1)[0];
    let hybrid = losses(profile("tiny-hybrid", &set), 150);
    let last = hybrid[140..].iter().sum::<f32>() / 10.0;
    // Byte-level English: a model that learned the letters' frequencies and common pairs is
    // far below ln 256.
    assert!(
        last < 0.6 * dense_first,
        "loss {last} after 150 steps vs {dense_first}"
    );
}

#[test]
fn a_resumed_tiny_hybrid_run_repeats_a_straight_one_bit_for_bit_and_samples_text() {
    let cfg = profile(
        "tiny-hybrid",
        &[
            "training.max_steps=16",
            "training.warmup_steps=2",
            "training.save_steps=8",
            "training.eval_steps=8",
            "training.grad_accum_steps=2",
        ],
    );
    let straight = tempfile::tempdir().unwrap();
    run(
        cfg.clone(),
        &RunOptions {
            out_dir: straight.path().to_path_buf(),
            ..RunOptions::default()
        },
    )
    .unwrap();

    let split = tempfile::tempdir().unwrap();
    let mut first_half = Vec::new();
    let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
    for _ in 0..8 {
        first_half.push(f64::from(trainer.step().unwrap().loss));
    }
    trainer.save_checkpoint(split.path()).unwrap();
    drop(trainer);
    let args = TrainArgs {
        resume: Some("latest".into()),
        out: Some(split.path().to_path_buf()),
        ..TrainArgs::default()
    };
    let (cfg, from) = resolve_config(&args, split.path()).unwrap();
    assert_eq!(
        cfg.model.layer_pattern.as_ref().map(ToString::to_string),
        Some("MFMEAFME".to_string())
    );
    let resumed = RunOptions {
        out_dir: split.path().to_path_buf(),
        resume_from: from,
        ..RunOptions::default()
    };
    assert_eq!(run(cfg, &resumed).unwrap().steps, 16);
    let straight_loss = train_loss(straight.path());
    let mut split_loss = first_half;
    split_loss.extend(train_loss(split.path()));
    assert_eq!(straight_loss.len(), 16);
    assert_eq!(straight_loss, split_loss, "identical loss sequences");

    // `trainyard sample` on the finished run: the carried-state path, seeded.
    let loaded = sample::load(straight.path(), Device::Cpu).unwrap();
    assert!(loaded.config.model.has_mamba());
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 20,
        top_p: 0.95,
    };
    // 40 new tokens after an 8-byte prompt pass the 32-token context, so the window restarts.
    let a = loaded.generate("the cat ", 40, params, 5).unwrap();
    let b = loaded.generate("the cat ", 40, params, 5).unwrap();
    assert_eq!(a, b, "the seed fixes the sample");
    assert!(!a.is_empty());
    // Greedy decoding with carried state picks what the full forward over the window picks.
    let greedy = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };
    let text = loaded.generate("ab", 6, greedy, 0).unwrap();
    let mut ids = loaded.tokenizer.encode("ab").unwrap();
    for _ in 0..6 {
        let x = candle_core::Tensor::new(ids.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = loaded.model.forward(&x, None).unwrap().logits;
        let last: Vec<f32> = logits
            .squeeze(0)
            .unwrap()
            .get(ids.len() - 1)
            .unwrap()
            .to_vec1()
            .unwrap();
        ids.push(sample::sample_next(&last, greedy, &mut rand::rng()).unwrap());
    }
    assert_eq!(text, sample::render(&loaded.tokenizer, &ids[2..]).unwrap());
}
