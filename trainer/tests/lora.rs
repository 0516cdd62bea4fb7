//! LoRA: adapter gradients against finite differences, frozen base weights, adapter-only
//! checkpoints and optimizer state, and the merged export against adapter inference.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

mod kit;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use kit::{config, logits, max_diff, model, train, IDS};
use trainer::config::{Config, LoraConfig};
use trainer::hf::export::export;
use trainer::model::{cross_entropy, init_weights, lora, Gpt};
use trainer::train::Trainer;

fn lora_cfg(targets: &[&str]) -> LoraConfig {
    LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: targets.iter().map(|t| t.parse().unwrap()).collect(),
    }
}

fn tensors(varmap: &VarMap) -> HashMap<String, Vec<f32>> {
    varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(n, v)| {
            (
                n.clone(),
                v.as_tensor().flatten_all().unwrap().to_vec1().unwrap(),
            )
        })
        .collect()
}

#[test]
fn adapter_gradients_match_finite_differences_and_base_weights_get_none() {
    for kind in ["gpt2", "mixtral"] {
        let dev = Device::Cpu;
        let mut m = model(kind);
        m.d_model = 8;
        m.n_heads = 2;
        m.d_ff = 12;
        m.vocab_size = 13;
        let targets: &[&str] = if kind == "mixtral" {
            &["q", "k", "v", "o", "expert_in", "expert_out"]
        } else {
            &["q", "v", "o", "mlp_in", "mlp_out"]
        };
        let l = lora_cfg(targets);
        let varmap = VarMap::new();
        let gpt = Gpt::with_adapters(&m, &l, lora::var_builder(&varmap, DType::F64, &dev)).unwrap();
        init_weights(&varmap, &m, 3).unwrap();
        lora::init_adapters(&varmap, 3).unwrap();
        // B starts at zero; move it off so A's gradient is not trivially zero too.
        let vars: Vec<(String, Var)> = {
            let mut v: Vec<_> = varmap.data().lock().unwrap().clone().into_iter().collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        for (i, (name, var)) in vars.iter().enumerate() {
            if name.contains(".lora_b.") {
                let vals: Vec<f64> = (0..var.elem_count())
                    .map(|j| 0.3 * ((j + i) as f64 * 0.7).sin())
                    .collect();
                var.set(&Tensor::from_vec(vals, var.shape(), &dev).unwrap())
                    .unwrap();
            }
        }
        let idx = Tensor::new(&[[1u32, 5, 2, 7, 3], [4, 0, 9, 11, 6]], &dev).unwrap();
        let tgt = Tensor::new(&[[5u32, 2, 7, 3, 8], [0, 9, 11, 6, 12]], &dev).unwrap();
        let loss = |g: &Gpt| -> Tensor {
            let out = g.forward(&idx, None).unwrap();
            let ce = cross_entropy(&out.logits, &tgt).unwrap();
            match out.aux_loss {
                Some(a) => (ce + a).unwrap(),
                None => ce,
            }
        };
        let grads = loss(&gpt).backward().unwrap();
        let mut checked = 0;
        for (name, var) in &vars {
            let g = grads.get(var.as_tensor());
            if !lora::is_adapter(name) {
                assert!(g.is_none(), "{kind}: base weight {name} got a gradient");
                continue;
            }
            let g: Vec<f64> = g.unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            for j in (0..base.len()).step_by(base.len().div_ceil(3)) {
                let eps = 1e-5;
                let at = |v: f64| {
                    let mut w = base.clone();
                    w[j] = v;
                    var.set(&Tensor::from_vec(w, var.shape(), &dev).unwrap())
                        .unwrap();
                    loss(&gpt).to_scalar::<f64>().unwrap()
                };
                let numeric = (at(base[j] + eps) - at(base[j] - eps)) / (2.0 * eps);
                var.set(&Tensor::from_vec(base.clone(), var.shape(), &dev).unwrap())
                    .unwrap();
                // Relative, with an absolute floor below which central differences are noise.
                let tol = 1e-5 * numeric.abs().max(g[j].abs()) + 1e-9;
                let ok = (numeric - g[j]).abs() < tol;
                assert!(
                    ok,
                    "{kind}: {name}[{j}] analytic {} numeric {numeric}",
                    g[j]
                );
                checked += 1;
            }
        }
        assert!(checked >= 8, "{kind}: only {checked} entries checked");
    }
}

/// A base run (3 steps) and a LoRA run from its checkpoint.
fn lora_run(
    kind: &str,
    targets: &[&str],
    steps: usize,
    dir: &std::path::Path,
) -> (Config, Trainer) {
    let (_, base) = train(config(model(kind), dir), 3, &dir.join("base"));
    let mut cfg = config(model(kind), dir);
    cfg.training.init_from = Some(base.display().to_string());
    cfg.training.lora = Some(lora_cfg(targets));
    cfg.validate().unwrap();
    let mut trainer = Trainer::new(cfg.clone(), Device::Cpu).unwrap();
    for _ in 0..steps {
        trainer.step().unwrap();
    }
    (cfg, trainer)
}

#[test]
fn lora_training_leaves_the_base_weights_bit_identical_and_checkpoints_only_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let (_, trainer) = lora_run(
        "gpt2",
        &["q", "k", "v", "o", "mlp_in", "mlp_out"],
        8,
        dir.path(),
    );
    let base_dir = trainer::checkpoint::resolve(&dir.path().join("base"), "latest").unwrap();
    let base =
        candle_core::safetensors::load(base_dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let now = tensors(trainer.varmap());
    let mut adapters = 0;
    for (name, values) in &now {
        if lora::is_adapter(name) {
            adapters += 1;
            continue;
        }
        let saved: Vec<f32> = base[name].flatten_all().unwrap().to_vec1().unwrap();
        let same = saved
            .iter()
            .zip(values)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "base weight {name} changed");
    }
    assert_eq!(adapters, 2 * 6 * 2, "A and B for 6 targets in 2 blocks");
    let moved = now
        .iter()
        .filter(|(n, _)| n.contains(".lora_b."))
        .any(|(_, v)| v.iter().any(|x| *x != 0.0));
    assert!(moved, "the adapters trained");

    let ckpt = trainer.save_checkpoint(&dir.path().join("lora")).unwrap();
    let saved =
        candle_core::safetensors::load(ckpt.join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(
        saved.keys().all(|n| lora::is_adapter(n)),
        "{:?}",
        saved.keys()
    );
    assert_eq!(saved.len(), adapters);
    let base_ref = trainer::checkpoint::read_base(&ckpt).unwrap().unwrap();
    assert_eq!(
        base_ref.init_from.as_deref(),
        Some(std::path::absolute(&base_dir).unwrap().to_str().unwrap())
    );
    // Sampling (and anything else that loads a checkpoint) puts the base back under the adapters.
    let loaded = trainer::sample::load(&ckpt, Device::Cpu).unwrap();
    assert!(max_diff(&logits(&loaded.model, &IDS), &logits(trainer.model(), &IDS)) < 1e-6);
}

#[test]
fn the_optimizer_keeps_state_only_for_the_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let full = Trainer::new(config(model("gpt2"), dir.path()), Device::Cpu).unwrap();
    let (_, lora) = lora_run("gpt2", &["q", "v"], 0, dir.path());
    let (full_state, lora_state) = (
        full.optimizer_state_scalars().unwrap(),
        lora.optimizer_state_scalars().unwrap(),
    );
    // AdamW: two moments per trainable scalar, plus the step counter.
    assert_eq!(full_state, 2 * full.trainable_params() + 1);
    assert_eq!(lora_state, 2 * lora.trainable_params() + 1);
    // q and v of 2 blocks: A (4, 32) and B (32, 4) each.
    assert_eq!(lora.trainable_params(), 2 * 2 * (4 * 32 + 32 * 4));
    assert_eq!(
        lora.num_params(),
        full.num_params() + lora.trainable_params()
    );
    eprintln!(
        "optimizer state: full fine-tuning {} bytes, LoRA r=4 on q,v {} bytes",
        4 * full_state,
        4 * lora_state
    );
    assert!(lora_state * 10 < full_state, "{lora_state} vs {full_state}");
}

#[test]
fn a_merged_export_gives_the_logits_of_adapter_inference() {
    for kind in ["llama", "gpt2"] {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, trainer) = lora_run(
            kind,
            &["q", "k", "v", "o", "mlp_in", "mlp_out"],
            6,
            dir.path(),
        );
        let ckpt = trainer.save_checkpoint(&dir.path().join("lora")).unwrap();
        let err = export(&ckpt, &dir.path().join("unmerged"), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--merge"), "{err}");
        let out = dir.path().join("merged");
        export(&ckpt, &out, true).unwrap();

        let mut plain = cfg.clone();
        plain.training.lora = None;
        plain.training.init_from = Some(format!("hf:{}", out.display()));
        let merged = Trainer::new(plain, Device::Cpu).unwrap();
        let diff = max_diff(
            &logits(merged.model(), &IDS),
            &logits(trainer.model(), &IDS),
        );
        assert!(diff < 1e-5, "{kind}: merged logits differ by {diff}");
        let base_only = max_diff(
            &logits(&trainer.model().without_adapters(), &IDS),
            &logits(trainer.model(), &IDS),
        );
        assert!(
            base_only > 1e-3,
            "{kind}: the adapters changed nothing ({base_only})"
        );
    }
}

#[test]
fn lora_settings_that_cannot_work_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, LoraConfig, &str); 4] = [
        (
            "gpt2",
            lora_cfg(&["q", "v", "q"]),
            "training.lora.targets[2]: \"q\" is listed twice",
        ),
        (
            "gpt2",
            lora_cfg(&["expert_in"]),
            "training.lora.targets[0]: \"expert_in\" adapts MoE experts",
        ),
        (
            "mixtral",
            lora_cfg(&["mlp_in"]),
            "training.lora.targets[0]: \"mlp_in\" adapts dense MLPs",
        ),
        (
            "gpt2",
            LoraConfig {
                r: 0,
                ..lora_cfg(&["q"])
            },
            "training.lora.r: must be at least 1",
        ),
    ];
    for (kind, l, want) in cases {
        let mut cfg = config(model(kind), dir.path());
        cfg.training.lora = Some(l);
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.starts_with(want), "{err}");
    }
    let mut cfg = config(model("gpt2"), dir.path());
    let err = cfg
        .apply_overrides(&["training.lora.alpha=many".to_string()])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("training.lora.alpha"), "{err}");
    // A projection that does not exist is refused as the config is read, naming its place.
    let err = cfg
        .apply_overrides(&["training.lora.targets=[q, qq]".to_string()])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("training.lora.targets[1]: unknown projection \"qq\""),
        "{err}"
    );
}
