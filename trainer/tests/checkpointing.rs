//! Activation checkpointing (`training.gradient_checkpointing`): the recomputing backward gives
//! the plain backward's gradients on the same batch — dense and MoE models, with dropout and
//! router jitter (the recompute replays the forward's random draws), a hybrid Mamba-2 stack,
//! under bf16 autocast and with LoRA adapters — and a checkpointed run takes the same steps as
//! a plain one.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

mod kit;

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use kit::model;
use trainer::config::{
    Config, LoraConfig, LoraTarget, MambaConfig, ModelConfig, MoeConfig, Objective, Precision,
};
use trainer::kernels::autocast::autocast;
use trainer::model::{cross_entropy, init_weights, lora, DropoutRng, Gpt};
use trainer::train::Trainer;

/// A fixed (B, T) batch of inputs and next-token targets below `vocab`.
fn batch(vocab: u32, b: usize, t: usize) -> (Tensor, Tensor) {
    let ids: Vec<u32> = (0..b * (t + 1))
        .map(|i| (i as u32 * 37 + (i as u32 / 5) * 11) % vocab)
        .collect();
    let all = Tensor::from_vec(ids, (b, t + 1), &Device::Cpu).unwrap();
    (all.narrow(1, 0, t).unwrap(), all.narrow(1, 1, t).unwrap())
}

/// Every variable's gradient (flattened) after one forward/backward of cross-entropy plus the
/// router losses, with the dropout generator seeded `seed`.
fn gradients(
    gpt: &Gpt,
    varmap: &VarMap,
    checkpoint: bool,
    seed: Option<u64>,
) -> (f32, BTreeMap<String, Vec<f32>>) {
    let (x, y) = batch(gpt.config().vocab_size as u32, 3, 12);
    let mut rng = seed.map(DropoutRng::new);
    let pass = gpt.forward_train(&x, rng.as_mut(), checkpoint).unwrap();
    let ce = cross_entropy(&pass.output.logits, &y).unwrap();
    let loss = match &pass.output.aux_loss {
        Some(aux) => (ce + aux).unwrap(),
        None => ce,
    };
    let value = loss.to_scalar::<f32>().unwrap();
    let grads = pass.backward(loss.affine(0.5, 0.0).unwrap()).unwrap();
    let vars = varmap.data().lock().unwrap();
    let by_name = vars
        .iter()
        .filter_map(|(name, var)| {
            let g = grads.get(var.as_tensor())?;
            Some((name.clone(), g.flatten_all().unwrap().to_vec1().unwrap()))
        })
        .collect();
    (value, by_name)
}

/// The largest |a - b| over all gradients, relative to the largest |a| of that gradient;
/// fails when the two sets name different variables.
fn max_relative_diff(a: &BTreeMap<String, Vec<f32>>, b: &BTreeMap<String, Vec<f32>>) -> f32 {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "the same variables get gradients"
    );
    let mut worst = 0f32;
    for (name, ga) in a {
        let gb = &b[name];
        let scale = ga.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
        let diff = ga
            .iter()
            .zip(gb)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        worst = worst.max(diff / scale);
    }
    worst
}

fn build(cfg: &ModelConfig) -> (VarMap, Gpt) {
    let varmap = VarMap::new();
    let gpt = Gpt::new(
        cfg,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )
    .unwrap();
    init_weights(&varmap, cfg, 7).unwrap();
    (varmap, gpt)
}

fn dense(dropout: f64) -> ModelConfig {
    ModelConfig {
        n_layers: 3,
        dropout,
        ..model("gpt2")
    }
}

/// Mixtral-shaped, every layer MoE with a shared expert, jitter and both router losses, and a
/// capacity that drops tokens (routing then decides which rows get no expert at all).
fn moe(dropout: f64) -> ModelConfig {
    ModelConfig {
        n_layers: 3,
        dropout,
        moe: Some(MoeConfig {
            num_experts: 4,
            top_k: 2,
            capacity_factor: 0.75,
            aux_loss_weight: 0.05,
            z_loss_weight: 0.01,
            router_jitter: 0.1,
            shared_expert: true,
            ..MoeConfig::default()
        }),
        ..model("llama")
    }
}

/// Checkpointed against plain gradients, bit for bit: the recompute runs the same ops on the
/// same input, and the surrogate Σ(y · g) hands each block exactly the upstream gradient g.
fn assert_same_gradients(gpt: &Gpt, varmap: &VarMap, seed: Option<u64>, what: &str) {
    let (plain_loss, plain) = gradients(gpt, varmap, false, seed);
    let (ckpt_loss, ckpt) = gradients(gpt, varmap, true, seed);
    assert_eq!(plain_loss, ckpt_loss, "{what}: the same loss");
    let diff = max_relative_diff(&plain, &ckpt);
    assert!(
        plain == ckpt,
        "{what}: gradients differ by {diff} (relative)"
    );
}

#[test]
fn checkpointed_gradients_equal_the_plain_backward_for_a_dense_model() {
    let (varmap, gpt) = build(&dense(0.0));
    assert_same_gradients(&gpt, &varmap, None, "dense");
}

#[test]
fn checkpointed_gradients_equal_the_plain_backward_for_an_moe_model_with_router_losses() {
    let (varmap, gpt) = build(&moe(0.0));
    // Training mode (an rng) turns router jitter on; the recompute must route the same way.
    assert_same_gradients(&gpt, &varmap, Some(11), "moe");
}

/// A Jamba-like stack: Mamba-2 with dense and MoE MLPs, then attention with a dense MLP.
fn hybrid(dropout: f64) -> ModelConfig {
    ModelConfig {
        n_layers: 4,
        layer_pattern: Some("MFMEAFME".parse().unwrap()),
        mamba: Some(MambaConfig {
            head_dim: 16,
            chunk_size: 8,
            ..MambaConfig::default()
        }),
        ..moe(dropout)
    }
}

#[test]
fn checkpointed_gradients_equal_the_plain_backward_for_a_hybrid_mamba_stack() {
    let (varmap, gpt) = build(&hybrid(0.1));
    assert_same_gradients(&gpt, &varmap, Some(13), "hybrid");
}

#[test]
fn the_recompute_replays_the_forwards_dropout_masks() {
    for (kind, cfg) in [("dense", dense(0.2)), ("moe", moe(0.2))] {
        let (varmap, gpt) = build(&cfg);
        assert_same_gradients(&gpt, &varmap, Some(5), kind);
        // The masks matter: another seed gives other gradients, so fresh draws in the
        // recompute could not have passed the check above.
        let (_, a) = gradients(&gpt, &varmap, false, Some(5));
        let (_, b) = gradients(&gpt, &varmap, false, Some(6));
        assert!(max_relative_diff(&a, &b) > 1e-2, "{kind}: dropout is on");
    }
}

#[test]
fn checkpointed_gradients_equal_the_plain_backward_under_bf16_autocast() {
    let (varmap, gpt) = build(&moe(0.1));
    let _bf16 = autocast(Precision::Bf16);
    assert_same_gradients(&gpt, &varmap, Some(3), "bf16");
}

#[test]
fn checkpointed_gradients_reach_lora_adapters_and_skip_frozen_weights() {
    let cfg = dense(0.0);
    let lora_cfg = LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.1,
        targets: vec![LoraTarget::Q, LoraTarget::V, LoraTarget::MlpIn],
    };
    let varmap = VarMap::new();
    let gpt = Gpt::with_adapters(
        &cfg,
        &lora_cfg,
        lora::var_builder(&varmap, DType::F32, &Device::Cpu),
    )
    .unwrap();
    init_weights(&varmap, &cfg, 7).unwrap();
    lora::init_adapters(&varmap, 7).unwrap();
    let (_, plain) = gradients(&gpt, &varmap, false, Some(9));
    let (_, ckpt) = gradients(&gpt, &varmap, true, Some(9));
    assert!(!plain.is_empty() && plain.keys().all(|n| lora::is_adapter(n)));
    assert!(plain == ckpt, "{}", max_relative_diff(&plain, &ckpt));
}

#[test]
fn the_evaluation_forward_gives_the_plain_logits_and_keeps_no_graph() {
    for (kind, cfg) in [("dense", dense(0.1)), ("moe", moe(0.1))] {
        let (varmap, gpt) = build(&cfg);
        let (x, _) = batch(cfg.vocab_size as u32, 2, 10);
        let plain = gpt.forward(&x, None).unwrap();
        let eval = gpt.forward_no_grad(&x).unwrap();
        let values = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(values(&plain.logits), values(&eval.logits), "{kind}");
        let aux = |o: &trainer::model::ModelOutput| o.aux_loss.as_ref().map(&values);
        assert_eq!(aux(&plain), aux(&eval), "{kind}");
        let reached = |logits: &Tensor| {
            let grads = logits.sum_all().unwrap().backward().unwrap();
            let vars = varmap.all_vars();
            vars.iter()
                .filter(|v| grads.get(v.as_tensor()).is_some())
                .count()
        };
        assert!(
            reached(&plain.logits) > 0,
            "{kind}: the plain forward records its graph"
        );
        assert_eq!(
            reached(&eval.logits),
            0,
            "{kind}: the evaluation forward keeps none"
        );
    }
}

/// A tiny MoE run with dropout, accumulation and clipping on the synthetic data.
fn run_config(checkpointing: bool, dir: &std::path::Path) -> Config {
    let mut cfg = kit::config(moe(0.1), dir);
    cfg.training.grad_accum_steps = 2;
    cfg.training.grad_clip = 0.5;
    cfg.training.threads = 2;
    cfg.training.gradient_checkpointing = checkpointing;
    cfg.logging.moe_every = 1; // the router telemetry of every step
    cfg.validate().unwrap();
    cfg
}

#[test]
fn a_checkpointed_run_takes_the_same_steps_as_a_plain_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut plain = Trainer::new(run_config(false, dir.path()), Device::Cpu).unwrap();
    let mut ckpt = Trainer::new(run_config(true, dir.path()), Device::Cpu).unwrap();
    for _ in 0..4 {
        let (a, b) = (plain.step().unwrap(), ckpt.step().unwrap());
        assert_eq!(a.loss, b.loss, "step {}", a.step);
        assert_eq!(a.grad_norm, b.grad_norm, "step {}", a.step);
        assert!(a.extra.keys().any(|k| k.starts_with("moe/")));
        assert_eq!(
            a.extra.keys().collect::<Vec<_>>(),
            b.extra.keys().collect::<Vec<_>>()
        );
    }
    let weights = |t: &Trainer| -> BTreeMap<String, Vec<f32>> {
        let vars = t.varmap().data().lock().unwrap();
        vars.iter()
            .map(|(n, v)| (n.clone(), v.flatten_all().unwrap().to_vec1().unwrap()))
            .collect()
    };
    let (a, b) = (weights(&plain), weights(&ckpt));
    assert!(
        a == b,
        "the same weights after 4 steps: {}",
        max_relative_diff(&a, &b)
    );
}

#[test]
fn gradient_checkpointing_that_is_not_a_boolean_is_refused_naming_the_key() {
    let mut cfg = Config::default();
    let err = cfg
        .apply_overrides(&["training.gradient_checkpointing=often".to_string()])
        .map(|_| ())
        .and_then(|_| cfg.validate())
        .unwrap_err()
        .to_string();
    assert!(err.contains("training.gradient_checkpointing"), "{err}");
}

#[test]
fn a_checkpointed_dpo_run_takes_the_same_steps_as_a_plain_one() {
    let dir = tempfile::tempdir().unwrap();
    let pairs = dir.path().join("prefs.jsonl");
    let lines: Vec<String> = (0..40)
        .map(|i| {
            serde_json::json!({"prompt": format!("{i} is"), "chosen": " yes", "rejected": " no"})
                .to_string()
        })
        .collect();
    std::fs::write(&pairs, lines.join("\n")).unwrap();
    let cfg = |checkpointing: bool| {
        let mut cfg = run_config(checkpointing, dir.path());
        cfg.data.dataset = pairs.display().to_string();
        cfg.training.objective = Objective::Dpo;
        cfg.validate().unwrap();
        cfg
    };
    let mut plain = Trainer::new(cfg(false), Device::Cpu).unwrap();
    let mut ckpt = Trainer::new(cfg(true), Device::Cpu).unwrap();
    for _ in 0..3 {
        let (a, b) = (plain.step().unwrap(), ckpt.step().unwrap());
        assert_eq!(
            (a.loss, a.grad_norm),
            (b.loss, b.grad_norm),
            "step {}",
            a.step
        );
        assert!(a.grad_norm > 0.0);
    }
}
