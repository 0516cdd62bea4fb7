//! Shared setup of the fine-tuning and interchange tests: tiny trained checkpoints, logits, and
//! the reference Python.

#![allow(dead_code)] // each test crate uses part of the kit

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use trainer::config::{
    Activation, Config, DeviceSpec, ModelConfig, MoeConfig, NormKind, PositionKind,
};
use trainer::model::Gpt;
use trainer::train::Trainer;

/// The model shapes the Hugging Face layouts cover.
pub fn model(kind: &str) -> ModelConfig {
    let base = ModelConfig {
        vocab_size: 256,
        d_model: 32,
        n_layers: 2,
        n_heads: 4,
        d_ff: 48,
        max_seq_len: 32,
        ..ModelConfig::default()
    };
    let llama = ModelConfig {
        position: PositionKind::Rope,
        norm: NormKind::RmsNorm,
        activation: Activation::Swiglu,
        bias: false,
        tie_embeddings: false,
        norm_eps: 1e-6,
        ..base.clone()
    };
    match kind {
        "gpt2" => base,
        "gpt2-nobias-untied" => ModelConfig {
            bias: false,
            tie_embeddings: false,
            ..base
        },
        "llama" => llama,
        "llama-bias-tied" => ModelConfig {
            bias: true,
            tie_embeddings: true,
            ..llama
        },
        "mixtral" => ModelConfig {
            moe: Some(MoeConfig {
                num_experts: 4,
                top_k: 2,
                ..MoeConfig::default()
            }),
            ..llama
        },
        other => panic!("no model kind {other}"),
    }
}

/// A small run config on the synthetic data, in `dir`.
pub fn config(model: ModelConfig, dir: &Path) -> Config {
    let mut cfg = Config {
        model,
        ..Config::default()
    };
    cfg.training.batch_size = 4;
    cfg.training.seq_len = 16;
    cfg.training.max_steps = 100;
    cfg.training.warmup_steps = 0;
    cfg.training.learning_rate = 1e-2;
    cfg.training.device = DeviceSpec::Cpu;
    cfg.training.eval_iters = 2;
    cfg.data.cache_dir = dir.join("cache").display().to_string();
    cfg.validate().unwrap();
    cfg
}

/// Trains `cfg` for `steps` steps and saves a checkpoint under `dir`; returns the trainer.
pub fn train(cfg: Config, steps: usize, dir: &Path) -> (Trainer, PathBuf) {
    let mut trainer = Trainer::new(cfg, Device::Cpu).unwrap();
    for _ in 0..steps {
        trainer.step().unwrap();
    }
    let ckpt = trainer.save_checkpoint(dir).unwrap();
    (trainer, ckpt)
}

/// Token ids every logits comparison uses.
pub const IDS: [u32; 9] = [72, 101, 108, 108, 111, 32, 119, 33, 10];

/// (T, V) logits of `ids` under `model`, as f64.
pub fn logits(model: &Gpt, ids: &[u32]) -> Vec<Vec<f64>> {
    let x = Tensor::new(ids, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let out = model.forward(&x, None).unwrap();
    out.logits
        .squeeze(0)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec2()
        .unwrap()
}

/// The largest absolute difference between two logit tables of the same shape.
pub fn max_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len(), "rows");
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len(), "columns");
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f64::max)
}

/// The Python with NumPy and `safetensors`: `TRAINYARD_REFERENCE_PYTHON`, else the environment
/// `scripts/reference-venv.sh` makes in `target/` (`scripts/test.sh` runs it). Never skipped:
/// without it the test fails and says how to get it.
pub fn reference_python() -> PathBuf {
    if let Ok(p) = std::env::var("TRAINYARD_REFERENCE_PYTHON") {
        return PathBuf::from(p);
    }
    let python =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/reference-venv/bin/python");
    assert!(
        python.exists(),
        "the NumPy reference is not installed: run scripts/reference-venv.sh (scripts/test.sh \
         does), or point TRAINYARD_REFERENCE_PYTHON at a Python with numpy and safetensors"
    );
    python
}

/// Logits of `ids` from the independent NumPy forward pass of an exported directory.
pub fn reference_logits(dir: &Path, ids: &[u32]) -> (String, Vec<Vec<f64>>) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/hf_forward.py");
    let out = std::process::Command::new(reference_python())
        .arg(script)
        .arg(dir)
        .args(ids.iter().map(u32::to_string))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hf_forward.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let logits = serde_json::from_value(v["logits"].clone()).unwrap();
    (v["architecture"].as_str().unwrap().to_string(), logits)
}
