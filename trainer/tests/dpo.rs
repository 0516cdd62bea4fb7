//! DPO end to end: a synthetic preference set whose chosen completion follows a learnable rule;
//! held-out reward accuracy must rise well above chance. (The loss itself is checked against a
//! hand-computed value in `train::dpo`'s unit tests.)

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

mod kit;

use std::fmt::Write as _;
use std::path::Path;

use candle_core::Device;
use kit::{config, model};
use trainer::config::{Config, LoraConfig, LoraTarget, Objective};
use trainer::train::Trainer;

/// Prompts `n=<number> is`; the chosen completion names the number's parity, the rejected one
/// the other parity. The rule depends on the prompt's last digit, so it must be read, and
/// held-out pairs have numbers never seen in training.
fn write_pairs(path: &Path, n: usize) {
    let mut text = String::new();
    for i in 0..n {
        let number = 1000 + i * 37 % 9000;
        let (chosen, rejected) = if number % 2 == 0 {
            (" even", " odd")
        } else {
            (" odd", " even")
        };
        let record = serde_json::json!({
            "prompt": format!("n={number} is"),
            "chosen": chosen,
            "rejected": rejected,
        });
        writeln!(text, "{record}").unwrap();
    }
    std::fs::write(path, text).unwrap();
}

fn dpo_config(dir: &Path) -> Config {
    let path = dir.join("prefs.jsonl");
    write_pairs(&path, 400);
    let mut cfg = config(model("gpt2"), dir);
    cfg.data.dataset = path.display().to_string();
    cfg.data.val_fraction = 0.2;
    cfg.training.objective = Objective::Dpo;
    cfg.training.dpo.beta = 0.5;
    cfg.training.batch_size = 16;
    cfg.training.learning_rate = 3e-3;
    cfg.training.grad_clip = 1.0;
    cfg.validate().unwrap();
    cfg
}

fn accuracy(trainer: &Trainer) -> f64 {
    let (_, metrics) = trainer.evaluate().unwrap();
    metrics["val/dpo/reward_accuracy"]
}

#[test]
fn held_out_reward_accuracy_rises_well_above_chance_on_a_learnable_rule() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dpo_config(dir.path());
    let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
    let (val_loss, start) = trainer.evaluate().unwrap();
    // The policy starts as its reference: every reward is 0 and the loss is ln 2.
    assert!((val_loss - 2f64.ln()).abs() < 1e-5, "{val_loss}");
    assert_eq!(start["val/dpo/reward_accuracy"], 0.0);
    let mut last = None;
    for _ in 0..80 {
        last = Some(trainer.step().unwrap());
    }
    let last = last.unwrap();
    for key in [
        "dpo/loss",
        "dpo/reward_accuracy",
        "dpo/chosen_reward",
        "dpo/rejected_reward",
        "dpo/margin",
    ] {
        assert!(
            last.extra.contains_key(key),
            "{key} missing from the step metrics"
        );
    }
    let acc = accuracy(&trainer);
    assert!(acc > 0.85, "held-out reward accuracy {acc}");
    let (val_loss, end) = trainer.evaluate().unwrap();
    assert!(val_loss < 0.5 * 2f64.ln(), "{val_loss}");
    assert!(end["val/dpo/margin"] > 0.0);
}

#[test]
fn dpo_with_lora_uses_the_base_as_its_reference_and_learns() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = dpo_config(dir.path());
    cfg.training.lora = Some(LoraConfig {
        r: 8,
        alpha: 16.0,
        dropout: 0.0,
        targets: vec![
            LoraTarget::Q,
            LoraTarget::K,
            LoraTarget::V,
            LoraTarget::O,
            LoraTarget::MlpIn,
            LoraTarget::MlpOut,
        ],
    });
    cfg.training.learning_rate = 1e-2;
    let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
    for _ in 0..80 {
        trainer.step().unwrap();
    }
    let acc = accuracy(&trainer);
    assert!(acc > 0.75, "held-out reward accuracy with LoRA {acc}");
}

#[test]
fn dpo_needs_a_jsonl_preference_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(model("gpt2"), dir.path());
    cfg.training.objective = Objective::Dpo;
    let err = cfg.validate().unwrap_err().to_string();
    assert!(
        err.starts_with("data.dataset: training.objective dpo reads preference pairs"),
        "{err}"
    );
    let mut cfg = dpo_config(dir.path());
    cfg.training.dpo.beta = 0.0;
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.starts_with("training.dpo.beta: must be > 0"), "{err}");
}
