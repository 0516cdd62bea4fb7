//! Behavioural checks of the model: it learns, initialization is deterministic, the
//! weight-decay rule, parameter counts and FLOPs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap, SGD};
use trainer::config::{Config, ModelConfig, PositionKind};
use trainer::model::{cross_entropy, init_weights, is_decayed, num_params, DropoutRng, Gpt};

fn build(cfg: &ModelConfig, seed: u64) -> (VarMap, Gpt) {
    let varmap = VarMap::new();
    let model = Gpt::new(
        cfg,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )
    .unwrap();
    init_weights(&varmap, cfg, seed).unwrap();
    (varmap, model)
}

fn pattern_batch(cfg: &ModelConfig) -> (Tensor, Tensor) {
    // A repeating 5-token pattern: perfectly predictable after one period.
    let seq: Vec<u32> = (0..4 * 17).map(|i| [7u32, 1, 4, 9, 2][i % 5]).collect();
    let mut x = Vec::new();
    let mut y = Vec::new();
    for b in 0..4 {
        x.extend_from_slice(&seq[b..b + 16]);
        y.extend_from_slice(&seq[b + 1..b + 17]);
    }
    let _ = cfg;
    (
        Tensor::from_vec(x, (4, 16), &Device::Cpu).unwrap(),
        Tensor::from_vec(y, (4, 16), &Device::Cpu).unwrap(),
    )
}

fn train_loss_curve<O: Optimizer>(
    cfg: &ModelConfig,
    steps: usize,
    make_opt: impl Fn(Vec<candle_core::Var>) -> O,
) -> Vec<f32> {
    let (varmap, model) = build(cfg, 1);
    let mut opt = make_opt(varmap.all_vars());
    let (x, y) = pattern_batch(cfg);
    let mut rng = DropoutRng::new(9);
    let mut losses = Vec::new();
    for _ in 0..steps {
        let out = model.forward(&x, Some(&mut rng)).unwrap();
        let mut loss = cross_entropy(&out.logits, &y).unwrap();
        if let Some(aux) = out.aux_loss {
            loss = (loss + aux).unwrap();
        }
        losses.push(loss.to_scalar::<f32>().unwrap());
        opt.backward_step(&loss).unwrap();
    }
    losses
}

#[test]
fn loss_falls_on_a_repeated_pattern_with_plain_sgd() {
    let mut cfg = ModelConfig {
        vocab_size: 16,
        d_model: 32,
        max_seq_len: 16,
        d_ff: 64,
        ..ModelConfig::default()
    };
    let uniform = (16f32).ln();
    for position in [PositionKind::Learned, PositionKind::Rope] {
        cfg.position = position;
        let losses = train_loss_curve(&cfg, 60, |vars| SGD::new(vars, 0.3).unwrap());
        assert!(
            (losses[0] - uniform).abs() < 0.3,
            "{position:?}: starts near ln V: {losses:?}"
        );
        let last = losses[losses.len() - 1];
        assert!(last < 0.5 * uniform, "{position:?}: {losses:?}");
    }
}

#[test]
fn an_moe_model_learns_and_reports_per_layer_stats() {
    let mut cfg = Config::from_profile("tiny-moe").unwrap().model;
    cfg.vocab_size = 16;
    cfg.max_seq_len = 16;
    let adamw = |vars| {
        let params = ParamsAdamW {
            lr: 1e-2,
            ..ParamsAdamW::default()
        };
        AdamW::new(vars, params).unwrap()
    };
    let losses = train_loss_curve(&cfg, 60, adamw);
    assert!(losses[59] < 0.3 * losses[0], "{losses:?}");
    let (_, model) = build(&cfg, 1);
    let (x, _) = pattern_batch(&cfg);
    let out = model.forward(&x, None).unwrap();
    assert_eq!(out.moe.len(), cfg.n_layers);
    for (i, s) in out.moe.iter().enumerate() {
        assert_eq!(s.layer, i);
        assert_eq!(s.tokens_per_expert.len(), 8);
        let total: f32 = s.tokens_per_expert.iter().sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert!(s.router_entropy > 0.0 && s.router_entropy <= (8f32).ln() + 1e-5);
    }
    assert!(out.aux_loss.is_some());
}

#[test]
fn initialization_depends_only_on_the_seed() {
    let cfg = ModelConfig::default();
    let weights = |seed| {
        let (varmap, _) = build(&cfg, seed);
        let data = varmap.data().lock().unwrap();
        let mut names: Vec<_> = data.keys().cloned().collect();
        names.sort();
        names
            .iter()
            .map(|n| {
                data[n]
                    .as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(weights(5), weights(5));
    assert_ne!(weights(5), weights(6));
}

#[test]
fn initialization_follows_gpt2_statistics() {
    let cfg = ModelConfig {
        d_model: 128,
        d_ff: 512,
        n_layers: 8,
        ..ModelConfig::default()
    };
    let (varmap, _) = build(&cfg, 3);
    let data = varmap.data().lock().unwrap();
    let std = |name: &str| {
        let v = data[name]
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / v.len() as f32).sqrt()
    };
    assert!((std("h.0.attn.c_attn.weight") - 0.02).abs() < 0.001);
    assert!((std("wte.weight") - 0.02).abs() < 0.001);
    let resid = 0.02 / (16f32).sqrt();
    assert!((std("h.3.mlp.c_proj.weight") - resid).abs() < 0.0005);
    let ones = data["h.0.ln_1.weight"]
        .as_tensor()
        .to_vec1::<f32>()
        .unwrap();
    assert!(ones.iter().all(|&x| x == 1.0));
    let zeros = data["h.0.attn.c_attn.bias"]
        .as_tensor()
        .to_vec1::<f32>()
        .unwrap();
    assert!(zeros.iter().all(|&x| x == 0.0));
}

#[test]
fn weight_decay_applies_only_to_matmul_weights() {
    for name in [
        "h.0.attn.c_attn.weight",
        "h.3.mlp.c_proj.weight",
        "lm_head.weight",
        "h.1.mlp.router.weight",
        "h.1.mlp.experts.2.c_fc.weight",
    ] {
        assert!(is_decayed(name), "{name}");
    }
    for name in [
        "wte.weight",
        "wpe.weight",
        "h.0.ln_1.weight",
        "ln_f.weight",
        "h.0.attn.c_attn.bias",
        "ln_f.bias",
    ] {
        assert!(!is_decayed(name), "{name}");
    }
}

#[test]
fn parameter_count_and_flops_match_the_gpt2_124m_shape() {
    let cfg = Config::from_profile("medium").unwrap().model;
    let (d, l, v, t) = (768usize, 12usize, 50304usize, 1024usize);
    let per_layer = 4 * d * d + 4 * d + 2 * d * 4 * d + 4 * d + d + 4 * d; // matmuls, biases, two LayerNorms
    let expected = v * d + t * d + l * per_layer + 2 * d;
    let varmap = VarMap::new();
    // Shape-only build on the CPU: 124M zeros is fine.
    let _ = Gpt::new(
        &cfg,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )
    .unwrap();
    assert_eq!(num_params(&varmap), expected);
    assert!((123_000_000..125_000_000).contains(&expected));
    let flops = Gpt::flops_per_token(&cfg, t);
    let n = (l * 12 * d * d + v * d) as f64;
    assert!(
        (flops - (6.0 * n + 12.0 * (l * d * t) as f64)).abs() < 1.0,
        "{flops} vs 6N + attention"
    );
}

#[test]
fn a_sequence_longer_than_the_context_is_an_error_not_a_panic() {
    let cfg = ModelConfig::default();
    let (_, model) = build(&cfg, 1);
    let idx = Tensor::zeros((1, cfg.max_seq_len + 1), DType::U32, &Device::Cpu).unwrap();
    let err = model.forward(&idx, None).unwrap_err();
    assert!(err.to_string().contains("max_seq_len"), "{err}");
}
