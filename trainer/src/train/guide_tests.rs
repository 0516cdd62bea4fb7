//! The training options of the guides in the loop: the instability guard (skip, rollback, exact
//! resume), the sequence-length curriculum and the per-layer norms, on tiny models.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use candle_core::Device;

use super::guard::{FaultPlan, SkipReason, Verdict};
use super::*;
use crate::wire::{guard_keys, MetricsLine};

/// A tiny model on the CPU with two threads, plus `overrides`.
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
        "training.batch_size=4",
        "training.eval_iters=2",
        "training.eval_steps=0",
        "logging.progress=never",
    ];
    all.extend_from_slice(overrides);
    let all: Vec<String> = all.into_iter().map(String::from).collect();
    cfg.apply_overrides(&all).unwrap();
    cfg.validate().unwrap();
    cfg
}

/// Every weight, by name, as plain numbers.
fn weights(trainer: &Trainer) -> BTreeMap<String, Vec<f32>> {
    let data = trainer.varmap().data().lock().unwrap();
    data.iter()
        .map(|(name, var)| {
            let v = var
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            (name.clone(), v)
        })
        .collect()
}

fn faults(steps: &[(u64, f64)]) -> FaultPlan {
    FaultPlan {
        loss_factors: steps.iter().copied().collect(),
    }
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

const GUARD: &str = "training.instability_guard.rollback_after=2";

#[test]
fn an_injected_nan_step_is_skipped_and_leaves_the_weights_as_they_were() {
    let cfg = tiny(&[GUARD, "training.max_steps=20"]);
    let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
    trainer.inject_faults(faults(&[(4, f64::NAN)]));
    for _ in 0..3 {
        assert_eq!(trainer.step().unwrap().guard, Some(Verdict::Accept));
    }
    let before = weights(&trainer);
    let s = trainer.step().unwrap();
    assert_eq!(s.guard, Some(Verdict::Skip(SkipReason::NonFinite)));
    assert!(s.loss.is_nan());
    assert_eq!(weights(&trainer), before, "no update from the NaN step");
    assert_eq!(trainer.state().step, 4, "the skipped step still counts");
    let next = trainer.step().unwrap();
    assert_eq!(next.guard, Some(Verdict::Accept));
    assert!(next.loss.is_finite());
    assert_ne!(weights(&trainer), before, "the next step updates again");
    assert_eq!(trainer.state().guard.skipped_total, 1);
}

#[test]
fn without_the_guard_a_nan_loss_still_ends_the_run_naming_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let opts = RunOptions {
        out_dir: dir.path().to_path_buf(),
        faults: faults(&[(3, f64::NAN)]),
        ..RunOptions::default()
    };
    let err = run(tiny(&["training.max_steps=20"]), &opts).unwrap_err();
    assert!(err.to_string().contains("diverged at step 3"), "{err:#}");
}

#[test]
fn a_forced_spike_rolls_back_to_the_last_checkpoint_with_a_smaller_learning_rate() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(&[
        GUARD,
        "training.instability_guard.min_history=3",
        "training.instability_guard.lr_scale=0.25",
        "training.max_steps=20",
    ]);
    let mut trainer = Trainer::new(cfg.clone(), Device::Cpu).unwrap();
    // Steps 7 and 8 see their loss multiplied by 1000: finite, but far above the running mean.
    trainer.inject_faults(faults(&[(7, 1000.0), (8, 1000.0)]));
    for _ in 0..5 {
        trainer.step().unwrap();
    }
    trainer.save_checkpoint(dir.path()).unwrap();
    let at_checkpoint = weights(&trainer);
    trainer.step().unwrap();
    let s7 = trainer.step().unwrap();
    assert!(matches!(
        s7.guard,
        Some(Verdict::Skip(SkipReason::Spike { .. }))
    ));
    let s8 = trainer.step().unwrap();
    assert!(matches!(s8.guard, Some(Verdict::RollBack(_))));
    let mut logged = BTreeMap::new();
    trainer
        .follow_guard(s8.guard.unwrap(), s8.step, s8.loss, dir.path(), &mut logged)
        .unwrap();
    assert_eq!(weights(&trainer), at_checkpoint, "weights of step 5 again");
    assert_eq!(logged[guard_keys::ROLLBACK_TO], 5.0);
    assert_eq!(logged[guard_keys::LR_SCALE], 0.25);
    assert_eq!(logged[guard_keys::SKIPPED_STEPS], 2.0);
    assert_eq!(trainer.state().step, 8, "the step counter goes on");
    let s9 = trainer.step().unwrap();
    assert_eq!(s9.guard, Some(Verdict::Accept));
    assert_eq!(s9.lr, crate::optim::lr_at(&cfg.training, 8) * 0.25);
}

#[test]
fn a_rollback_without_any_checkpoint_fails_naming_training_save_steps() {
    let dir = tempfile::tempdir().unwrap();
    let opts = RunOptions {
        out_dir: dir.path().to_path_buf(),
        faults: faults(&[(2, f64::NAN), (3, f64::NAN)]),
        ..RunOptions::default()
    };
    let err = run(tiny(&[GUARD, "training.max_steps=20"]), &opts).unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("no step checkpoint"), "{text}");
    assert!(text.contains("training.save_steps"), "{text}");
}

/// The guide options together: SGDR (independent of max_steps, so the first half can stop at
/// step 10), a curriculum, label smoothing, dropout, per-layer norms, and a rollback at step 8.
fn guided(max_steps: usize) -> Config {
    let cfg = tiny(&[
        GUARD,
        "model.dropout=0.1",
        "training.lr_schedule=sgdr",
        "training.lr_restart_period=4",
        "training.lr_restart_mult=2",
        "training.warmup_steps=2",
        "training.label_smoothing=0.1",
        "training.save_steps=5",
        "logging.layer_norms_every=3",
        &format!("training.max_steps={max_steps}"),
    ]);
    with_curriculum(cfg, &[(8, 3), (16, 3)])
}

/// `cfg` with curriculum stages of (sequence length, steps).
fn with_curriculum(mut cfg: Config, stages: &[(usize, usize)]) -> Config {
    cfg.training.curriculum = stages
        .iter()
        .map(|&(seq_len, steps)| crate::config::CurriculumStage { seq_len, steps })
        .collect();
    cfg.validate().unwrap();
    cfg
}

#[test]
fn a_run_resumed_after_a_rollback_reproduces_the_straight_run_bit_for_bit() {
    let plan = faults(&[(7, f64::NAN), (8, f64::NAN)]);
    let straight = tempfile::tempdir().unwrap();
    let o = RunOptions {
        out_dir: straight.path().to_path_buf(),
        faults: plan.clone(),
        ..RunOptions::default()
    };
    run(guided(16), &o).unwrap();
    let a = metrics(straight.path());
    assert_eq!(series(&a, guard_keys::ROLLBACK_TO), [(8, 5.0)]);
    assert_eq!(series(&a, guard_keys::LR_SCALE), [(8, 0.5)]);
    assert_eq!(series(&a, guard_keys::SKIPPED_STEPS), [(7, 1.0), (8, 2.0)]);
    assert_eq!(a.len(), 16, "one line per step, skipped ones included");
    assert!(series(&a, "grad_norm/layer0")
        .iter()
        .all(|(s, _)| s % 3 == 0));
    assert_eq!(series(&a, "param_norm/wte").len(), 5);

    let split = tempfile::tempdir().unwrap();
    let first = RunOptions {
        out_dir: split.path().to_path_buf(),
        faults: plan,
        ..RunOptions::default()
    };
    let half = run(guided(10), &first).unwrap();
    let state = crate::checkpoint::read_state(&half.checkpoint).unwrap();
    assert_eq!(
        state.guard.lr_scale, 0.5,
        "the guard's state is in the checkpoint"
    );
    let resumed = RunOptions {
        resume_from: Some(half.checkpoint),
        ..first
    };
    run(guided(16), &resumed).unwrap();
    let b = metrics(split.path());
    for key in ["train/loss", "lr", "grad_norm", "grad_norm/layer1"] {
        assert_eq!(series(&a, key), series(&b, key), "{key}");
    }
}

#[test]
fn the_curriculum_trains_the_first_steps_on_shorter_sequences() {
    let cfg = with_curriculum(tiny(&["training.max_steps=20"]), &[(8, 2), (16, 1)]);
    let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
    let tokens: Vec<usize> = (0..4).map(|_| trainer.step().unwrap().tokens).collect();
    // batch_size 4: 4·8, 4·8, 4·16, then 4·32.
    assert_eq!(tokens, [32, 32, 64, 128]);
    assert_eq!(trainer.state().tokens_seen, 256);
}

#[test]
fn per_layer_norms_are_recorded_every_n_steps_for_every_block() {
    let cfg = tiny(&["training.max_steps=20", "logging.layer_norms_every=2"]);
    let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
    let first = trainer.step().unwrap();
    assert!(!first.extra.keys().any(|k| k.starts_with("grad_norm/")));
    let second = trainer.step().unwrap();
    for layer in ["layer0", "layer1", "wte", "wpe", "ln_f"] {
        let g = second.extra[&format!("grad_norm/{layer}")];
        let p = second.extra[&format!("param_norm/{layer}")];
        assert!(g > 0.0 && g.is_finite(), "{layer}: {g}");
        assert!(p > 0.0 && p.is_finite(), "{layer}: {p}");
    }
    // The layers' squared gradient norms add up to the global one (before clipping).
    let total: f64 = second
        .extra
        .iter()
        .filter(|(k, _)| k.starts_with("grad_norm/"))
        .map(|(_, v)| v * v)
        .sum();
    let global = f64::from(second.grad_norm);
    assert!(
        (total.sqrt() - global).abs() < 1e-4 * global,
        "{total} vs {global}"
    );
}
