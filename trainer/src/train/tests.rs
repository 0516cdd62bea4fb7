//! End-to-end tests of the loop on tiny models (each runs in seconds in a debug build).

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use candle_core::Device;

use super::*;
use crate::cli::{resolve_config, TrainArgs};
use crate::wire::{MetricsLine, RunStatus};

/// The `tiny` profile shrunk further, on the CPU with two threads.
fn tiny(overrides: &[&str]) -> Config {
    let mut cfg = Config::from_profile("tiny").unwrap();
    let mut all = vec![
        "training.device=cpu",
        "training.threads=2",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.max_seq_len=32",
        "training.seq_len=32",
        "training.batch_size=8",
        "training.eval_iters=4",
        "logging.progress=never",
    ];
    all.extend_from_slice(overrides);
    let all: Vec<String> = all.into_iter().map(String::from).collect();
    cfg.apply_overrides(&all).unwrap();
    cfg.validate().unwrap();
    cfg
}

fn metrics(dir: &Path) -> Vec<MetricsLine> {
    fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn series(lines: &[MetricsLine], key: &str) -> Vec<(i64, f64)> {
    lines
        .iter()
        .filter_map(|l| l.metrics.get(key).map(|v| (l.step, *v)))
        .collect()
}

fn opts(dir: &Path) -> RunOptions {
    RunOptions {
        out_dir: dir.to_path_buf(),
        ..RunOptions::default()
    }
}

#[test]
fn loss_on_the_dummy_dataset_falls_well_below_uniform() {
    let cfg = tiny(&["training.max_steps=300", "training.learning_rate=1e-2"]);
    let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
    let mut losses = Vec::new();
    for _ in 0..300 {
        losses.push(trainer.step().unwrap().loss);
    }
    let uniform = (256f32).ln();
    let first = losses[0];
    let last: f32 = losses[290..].iter().sum::<f32>() / 10.0;
    assert!(
        (first - uniform).abs() < 0.5,
        "starts near uniform: {first}"
    );
    // The chain's entropy rate is ~1.21 nats; ln 256 ≈ 5.55.
    assert!(last < 0.5 * uniform, "loss {last} after 300 steps");
    assert!(trainer.estimate_loss().unwrap() < 0.5 * f64::from(uniform));
}

#[test]
fn validation_loss_on_the_demo_text_falls_below_its_unigram_entropy() {
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = format!("data.cache_dir={}", cache.path().display());
    let cfg = tiny(&[
        "data.dataset=demo",
        &cache_dir,
        "model.d_model=64",
        "model.n_heads=4",
        "model.d_ff=256",
        "model.max_seq_len=64",
        "training.seq_len=64",
        "training.batch_size=8",
        "training.max_steps=300",
        "training.warmup_steps=20",
        "training.learning_rate=5e-3",
        "training.eval_steps=0",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let out = run(cfg, &opts(dir.path())).unwrap();
    let trainer_tokens = {
        let cfg = tiny(&["data.dataset=demo", &cache_dir]);
        crate::data::prepare(&cfg, None).unwrap().train.to_vec()
    };
    let unigram = crate::data::demo::unigram_entropy(&trainer_tokens);
    let val = out.last_val_loss.unwrap();
    assert!(val < unigram, "val/loss {val} vs unigram entropy {unigram}");
    let logged = series(&metrics(dir.path()), "val/loss");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0].0, 300);
    // serde_json's default float parser may land one ulp away from the printed value.
    assert!(
        (logged[0].1 - val).abs() <= 1e-12 * val.abs(),
        "logged {} vs returned {val}",
        logged[0].1
    );
}

#[test]
fn resuming_from_the_latest_checkpoint_reproduces_a_straight_run_bit_for_bit() {
    let cfg = tiny(&[
        "model.dropout=0.1",
        "training.max_steps=60",
        "training.save_steps=30",
        "training.eval_steps=20",
        "training.grad_accum_steps=2",
    ]);
    let straight = tempfile::tempdir().unwrap();
    run(cfg.clone(), &opts(straight.path())).unwrap();

    // First half through the Trainer API, saving a checkpoint at step 30 as the loop would...
    let split = tempfile::tempdir().unwrap();
    let mut first_half = Vec::new();
    let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
    for _ in 0..30 {
        first_half.push(f64::from(trainer.step().unwrap().loss));
    }
    trainer.save_checkpoint(split.path()).unwrap();
    drop(trainer);
    // ...then `train --out DIR --resume latest`, which takes the checkpoint's config.
    let args = TrainArgs {
        resume: Some("latest".into()),
        out: Some(split.path().to_path_buf()),
        ..TrainArgs::default()
    };
    let (cfg, from) = resolve_config(&args, split.path()).unwrap();
    let resumed = RunOptions {
        resume_from: from,
        ..opts(split.path())
    };
    let outcome = run(cfg, &resumed).unwrap();
    assert_eq!(outcome.steps, 60);

    let a = metrics(straight.path());
    let b = metrics(split.path());
    let straight_loss: Vec<f64> = series(&a, "train/loss").into_iter().map(|x| x.1).collect();
    let mut split_loss = first_half;
    split_loss.extend(series(&b, "train/loss").into_iter().map(|x| x.1));
    assert_eq!(straight_loss.len(), 60);
    assert_eq!(straight_loss, split_loss, "identical loss sequences");
    let val_a: Vec<_> = series(&a, "val/loss")
        .into_iter()
        .filter(|x| x.0 > 30)
        .collect();
    assert_eq!(val_a, series(&b, "val/loss"));
    assert_eq!(series(&a, "grad_norm")[30..], series(&b, "grad_norm")[..]);
}

#[test]
fn a_stop_request_finishes_the_step_saves_and_reports_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(&["training.max_steps=50", "training.save_steps=0"]);
    let stop = Arc::new(AtomicBool::new(true));
    let o = RunOptions {
        stop: stop.clone(),
        ..opts(dir.path())
    };
    let out = run(cfg, &o).unwrap();
    assert_eq!(out.status, RunStatus::Stopped);
    assert_eq!(out.steps, 1);
    assert!(out.checkpoint.ends_with("step-000001"));
    assert_eq!(
        crate::checkpoint::read_state(&out.checkpoint).unwrap().step,
        1
    );
    assert!(stop.load(Ordering::SeqCst));
    assert_eq!(metrics(dir.path()).len(), 1);
}

#[test]
fn the_best_checkpoint_holds_the_lowest_validation_loss_and_old_checkpoints_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(&[
        "training.max_steps=40",
        "training.eval_steps=5",
        "training.save_steps=10",
        "training.save_total_limit=2",
        "training.learning_rate=2e-2",
        "training.warmup_steps=0",
    ]);
    let out = run(cfg, &opts(dir.path())).unwrap();
    let vals = series(&metrics(dir.path()), "val/loss");
    assert_eq!(vals.len(), 8);
    let (best_step, best) = vals
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    let best_dir = crate::checkpoint::checkpoints_dir(dir.path()).join("best");
    let st = crate::checkpoint::read_state(&best_dir).unwrap();
    assert_eq!(st.step as i64, best_step);
    assert_eq!(st.best_val_loss, Some(best));
    assert_eq!(out.best_val_loss, Some(best));
    let kept: Vec<u64> =
        crate::checkpoint::list_steps(&crate::checkpoint::checkpoints_dir(dir.path()))
            .unwrap()
            .into_iter()
            .map(|x| x.0)
            .collect();
    assert_eq!(kept, vec![30, 40]);
    let first = &metrics(dir.path())[0];
    assert!(first.metrics.contains_key("model/params"));
    for key in ["train/loss", "lr", "grad_norm", "perf/tokens_per_s"] {
        assert!(first.metrics.contains_key(key), "{key} missing");
    }
    assert!(dir.path().join("config.yaml").is_file());
}

#[test]
fn init_from_starts_a_fresh_run_from_a_checkpoints_weights() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(&["training.max_steps=30"]);
    let mut trainer = Trainer::new(cfg.clone(), Device::Cpu).unwrap();
    for _ in 0..30 {
        trainer.step().unwrap();
    }
    let trained_loss = trainer.estimate_loss().unwrap();
    let ckpt = trainer.save_checkpoint(dir.path()).unwrap();

    let mut cfg2 = cfg;
    cfg2.training.init_from = Some(ckpt.display().to_string());
    let fresh = Trainer::new(cfg2, Device::Cpu).unwrap();
    assert_eq!(fresh.state().step, 0, "a new run, not a resume");
    assert_eq!(fresh.estimate_loss().unwrap(), trained_loss);
}

#[test]
fn sampling_from_a_trained_checkpoint_produces_text() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(&["training.max_steps=5", "training.warmup_steps=1"]);
    run(cfg, &opts(dir.path())).unwrap();
    let loaded = crate::sample::load(dir.path(), Device::Cpu).unwrap();
    assert!(
        loaded.dir.ends_with("checkpoints/best"),
        "the run's best checkpoint"
    );
    assert_eq!(loaded.step, 5);
    assert_eq!(
        loaded.describe(),
        format!("loaded checkpoint {} (step 5)", loaded.dir.display())
    );
    let params = crate::sample::SamplingParams {
        temperature: 1.0,
        top_k: 10,
        top_p: 0.95,
    };
    let a = loaded.generate("ab", 12, params, 7).unwrap();
    let b = loaded.generate("ab", 12, params, 7).unwrap();
    assert_eq!(a, b, "the seed fixes the sample");
    assert!(!a.is_empty());
}

#[test]
fn a_config_error_names_the_key_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let args = TrainArgs {
        config: Some("tiny".into()),
        set: vec!["training.seq_len=4096".into()],
        out: Some(dir.path().to_path_buf()),
        ..TrainArgs::default()
    };
    let err = format!("{:#}", resolve_config(&args, dir.path()).unwrap_err());
    assert!(err.contains("training.seq_len"), "{err}");
    assert!(!dir.path().join("metrics.jsonl").exists());
}

#[test]
fn an_moe_run_reports_routing_telemetry_and_its_checkpoint_samples() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::from_profile("tiny-moe").unwrap();
    let set: Vec<String> = [
        "training.device=cpu",
        "training.threads=2",
        "training.max_steps=4",
        "training.warmup_steps=1",
        "training.eval_steps=0",
        "logging.moe_every=2",
        "logging.progress=never",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    cfg.apply_overrides(&set).unwrap();
    cfg.validate().unwrap();
    let experts = cfg.model.moe.as_ref().unwrap().num_experts;
    run(cfg, &opts(dir.path())).unwrap();
    let lines = metrics(dir.path());
    assert_eq!(lines.len(), 4);
    assert!(
        !lines[0].metrics.contains_key("moe/aux_loss"),
        "only every 2 steps"
    );
    let m = &lines[1].metrics;
    for key in [
        "moe/aux_loss",
        "moe/z_loss",
        "moe/layer0/dropped",
        "moe/layer0/entropy",
    ] {
        assert!(m.contains_key(key), "{key} missing: {:?}", m.keys());
    }
    let share: f64 = (0..experts)
        .map(|e| m[&format!("moe/layer0/expert{e}")])
        .sum();
    assert!(
        (share - 1.0).abs() < 1e-4,
        "expert shares sum to 1: {share}"
    );
    let loaded = crate::sample::load(dir.path(), Device::Cpu).unwrap();
    let params = crate::sample::SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };
    loaded.generate("x", 4, params, 1).unwrap();
}

#[test]
fn a_bf16_run_tracks_the_f32_loss_curve_and_keeps_f32_master_weights() {
    // Same seed, data and init: only the matmul precision differs.
    let run = |precision: &str| {
        let cfg = tiny(&[
            "training.max_steps=60",
            "training.learning_rate=1e-2",
            &format!("training.precision={precision}"),
        ]);
        let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
        let losses: Vec<f32> = (0..60).map(|_| trainer.step().unwrap().loss).collect();
        let dtypes: Vec<DType> = trainer
            .optimizer
            .params()
            .iter()
            .map(|p| p.var.as_tensor().dtype())
            .collect();
        (losses, dtypes, trainer.estimate_loss().unwrap())
    };
    let (f32_losses, _, f32_val) = run("f32");
    let (bf16_losses, bf16_dtypes, bf16_val) = run("bf16");
    assert!(bf16_dtypes.iter().all(|d| *d == DType::F32));
    assert_ne!(
        f32_losses, bf16_losses,
        "bf16 really changed the arithmetic"
    );
    // bf16 keeps 8 mantissa bits: per-step losses differ by rounding noise, never by a drift.
    for (step, (a, b)) in f32_losses.iter().zip(&bf16_losses).enumerate() {
        assert!(
            (a - b).abs() <= 0.03 * a.max(1.0),
            "step {step}: f32 {a} vs bf16 {b}"
        );
    }
    assert!(bf16_losses[59] < 0.7 * bf16_losses[0], "bf16 run learns");
    assert!(
        (f32_val - bf16_val).abs() < 0.03 * f32_val,
        "{f32_val} vs {bf16_val}"
    );
}

#[test]
fn resuming_from_the_best_checkpoint_continues_with_fresh_optimizer_state() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(&[
        "training.max_steps=20",
        "training.eval_steps=5",
        "training.warmup_steps=0",
    ]);
    run(cfg.clone(), &opts(dir.path())).unwrap();
    let best = crate::checkpoint::checkpoints_dir(dir.path()).join("best");
    assert!(
        !crate::checkpoint::has_optimizer(&best),
        "best/ keeps weights only"
    );
    let best_step = crate::checkpoint::read_state(&best).unwrap().step;
    let mut more = cfg;
    more.training.max_steps = 25;
    let resumed = RunOptions {
        resume_from: Some(best),
        ..opts(dir.path())
    };
    let out = run(more, &resumed).unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(out.steps, 25);
    let steps: Vec<i64> = metrics(dir.path()).iter().map(|l| l.step).collect();
    let want: Vec<i64> = (1..=25).collect();
    assert_eq!(
        steps, want,
        "lines after step {best_step} were replaced, none doubled"
    );
}

type Patches = Arc<std::sync::Mutex<Vec<crate::wire::RunPatch>>>;

/// A tracking server stand-in on loopback that records run updates and accepts the rest.
fn recording_server() -> (String, Patches, tokio::runtime::Runtime) {
    use axum::extract::State;
    use axum::routing::{patch, post};
    use axum::{Json, Router};
    async fn take(
        State(p): State<Patches>,
        Json(body): Json<crate::wire::RunPatch>,
    ) -> Json<serde_json::Value> {
        p.lock().unwrap().push(body);
        Json(serde_json::json!({}))
    }
    async fn ok() -> Json<serde_json::Value> {
        Json(serde_json::json!({}))
    }
    let patches: Patches = Arc::default();
    let app = Router::new()
        .route("/api/v1/runs/{id}", patch(take))
        .route("/api/v1/runs/{id}/metrics", post(ok))
        .route("/api/v1/runs/{id}/heartbeat", post(ok))
        .with_state(patches.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    (url, patches, rt)
}

#[test]
fn an_early_stopped_run_reports_finished_with_its_reason_to_the_server() {
    let (url, patches, _rt) = recording_server();
    let dir = tempfile::tempdir().unwrap();
    // Steps of 1e-30 leave every weight as it was, so the validation loss never improves.
    let cfg = tiny(&[
        "training.max_steps=50",
        "training.eval_steps=1",
        "training.early_stopping_patience=2",
        "training.optimizer=sgd",
        "training.momentum=0",
        "training.weight_decay=0",
        "training.learning_rate=1e-30",
        "training.min_lr=0",
        "training.warmup_steps=0",
    ]);
    let o = RunOptions {
        server: Some(crate::report::ServerTarget {
            url,
            run_id: "r1".into(),
            token: None,
            flush_interval: std::time::Duration::from_millis(20),
            final_flush_timeout: std::time::Duration::from_secs(20),
            heartbeat_interval: std::time::Duration::from_secs(3600),
        }),
        ..opts(dir.path())
    };
    let out = run(cfg, &o).unwrap();
    assert_eq!((out.status, out.steps), (RunStatus::Finished, 3));
    let patches = patches.lock().unwrap();
    let last = patches.last().unwrap();
    assert_eq!(last.status, Some(RunStatus::Finished));
    let reason = last.reason.as_deref().unwrap();
    assert_eq!(reason, out.reason);
    assert!(
        reason.starts_with("early stopping at step 3: val/loss did not improve for 2 evaluations"),
        "{reason}"
    );
}
