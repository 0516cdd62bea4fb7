//! Mamba-2 checked in f64: the chunked scan against a token-by-token oracle written with plain
//! loops, the chunked and recurrent forms of whole layers and whole hybrid models against each
//! other, the reference initialisation, FLOP accounting and the layer pattern's validation.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use trainer::config::{Config, MambaConfig, ModelConfig, MoeConfig, NormKind, PositionKind};
use trainer::model::mamba::{self, ssd, Mamba2, Scan};
use trainer::model::{init_weights, Gpt};

/// Deterministic values in [-1, 1] (no RNG, so failures reproduce).
fn wave(n: usize, seed: f64) -> Vec<f64> {
    (0..n)
        .map(|i| (i as f64 * 0.731 + seed).sin() * (i as f64 * 0.137 + 2.0 * seed).cos())
        .collect()
}

fn tensor(values: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

#[test]
fn the_chunked_scan_matches_a_token_by_token_recurrence_oracle() {
    let (bs, t, h, p, n) = (2, 11, 3, 2, 4);
    let x = wave(bs * t * h * p, 0.3);
    // dt in (0.05, 0.95), A in [-2.5, -0.5]: decays from ~0.1 to ~1.
    let dt: Vec<f64> = wave(bs * t * h, 1.1)
        .iter()
        .map(|v| 0.5 + 0.45 * v)
        .collect();
    let a: Vec<f64> = (0..h).map(|i| -0.5 - i as f64).collect();
    let b = wave(bs * t * n, 2.2);
    let c = wave(bs * t * n, 3.3);
    let h0 = wave(bs * h * p * n, 4.4);

    // The oracle: h ← exp(dt·A)·h + dt·x⊗B, y = h·C, one token at a time, in plain loops.
    let mut y_ref = vec![0.0; bs * t * h * p];
    let mut state = h0.clone();
    for bi in 0..bs {
        for ti in 0..t {
            for hi in 0..h {
                let dtv = dt[(bi * t + ti) * h + hi];
                let keep = (dtv * a[hi]).exp();
                for pi in 0..p {
                    let xv = x[((bi * t + ti) * h + hi) * p + pi];
                    let mut y = 0.0;
                    for ni in 0..n {
                        let s = &mut state[((bi * h + hi) * p + pi) * n + ni];
                        *s = keep * *s + dtv * xv * b[(bi * t + ti) * n + ni];
                        y += *s * c[(bi * t + ti) * n + ni];
                    }
                    y_ref[((bi * t + ti) * h + hi) * p + pi] = y;
                }
            }
        }
    }

    let xt = tensor(x, &[bs, t, h, p]);
    let dtt = tensor(dt, &[bs, t, h]);
    let at = tensor(a, &[h]);
    let bt = tensor(b, &[bs, t, n]);
    let ct = tensor(c, &[bs, t, n]);
    let h0t = tensor(h0, &[bs, h, p, n]);
    let y_ref = tensor(y_ref, &[bs, t, h, p]);
    let state_ref = tensor(state, &[bs, h, p, n]);
    // Chunks of 4 over 11 tokens: two full chunks and one padded; 16 is one padded chunk; 1
    // is a chunk per token.
    for chunk in [4, 16, 1, 11] {
        let masks = ssd::ChunkMasks::new(chunk, &Device::Cpu, DType::F64).unwrap();
        let (y, last) = ssd::chunked(&xt, &dtt, &at, &bt, &ct, &masks, Some(&h0t)).unwrap();
        assert!(max_abs_diff(&y, &y_ref) < 1e-12, "chunk {chunk}: outputs");
        assert!(
            max_abs_diff(&last, &state_ref) < 1e-12,
            "chunk {chunk}: final state"
        );
    }
}

fn hybrid(pattern: &str) -> ModelConfig {
    let n_layers = trainer::config::ModelConfig {
        layer_pattern: Some(pattern.parse().unwrap()),
        moe: Some(MoeConfig::default()),
        ..ModelConfig::default()
    }
    .blocks()
    .len();
    ModelConfig {
        vocab_size: 13,
        d_model: 8,
        n_layers,
        n_heads: 2,
        d_ff: 12,
        max_seq_len: 16,
        norm: NormKind::RmsNorm,
        position: PositionKind::Rope,
        layer_pattern: Some(pattern.parse().unwrap()),
        mamba: Some(MambaConfig {
            d_state: 4,
            d_conv: 3,
            expand: 2,
            head_dim: 4,
            chunk_size: 4,
        }),
        moe: Some(MoeConfig {
            num_experts: 3,
            top_k: 2,
            ..MoeConfig::default()
        }),
        ..ModelConfig::default()
    }
}

fn build(cfg: &ModelConfig, dtype: DType) -> (VarMap, Gpt) {
    let varmap = VarMap::new();
    let model = Gpt::new(cfg, VarBuilder::from_varmap(&varmap, dtype, &Device::Cpu)).unwrap();
    init_weights(&varmap, cfg, 11).unwrap();
    (varmap, model)
}

#[test]
fn a_mamba_layer_gives_the_same_output_by_chunks_by_recurrence_and_in_two_pieces() {
    let cfg = hybrid("MF");
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
    let layer = Mamba2::new(&cfg, vb.pp("h.0").pp("mamba")).unwrap();
    init_weights(&varmap, &cfg, 3).unwrap();
    let u = tensor(wave(2 * 10 * 8, 0.9), &[2, 10, 8]);
    let (chunked, s1) = layer.forward_with_state(&u, None, Scan::Chunked).unwrap();
    let (stepped, s2) = layer.forward_with_state(&u, None, Scan::Recurrent).unwrap();
    assert!(max_abs_diff(&chunked, &stepped) < 1e-9);
    assert!(max_abs_diff(&s1.ssm, &s2.ssm) < 1e-9);
    assert!(max_abs_diff(&s1.conv, &s2.conv) == 0.0);
    assert!(max_abs_diff(&chunked, &layer.forward(&u).unwrap()) == 0.0);
    // The first 7 tokens, then the last 3 from the carried conv and SSM state.
    let (a, state) = layer
        .forward_with_state(&u.narrow(1, 0, 7).unwrap(), None, Scan::Chunked)
        .unwrap();
    let (b, _) = layer
        .forward_with_state(&u.narrow(1, 7, 3).unwrap(), Some(&state), Scan::Chunked)
        .unwrap();
    let pieces = Tensor::cat(&[a, b], 1).unwrap();
    assert!(max_abs_diff(&chunked, &pieces) < 1e-9);
    // The output depends on the input: not a layer that returns its bias.
    assert!(
        chunked
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
            > 1e-3
    );
}

#[test]
fn a_hybrid_model_generating_step_by_step_matches_its_full_forward() {
    let cfg = hybrid("MFAEMMF");
    let (_, model) = build(&cfg, DType::F64);
    let ids: Vec<u32> = (0..2 * 12).map(|i| ((7 * i + 3) % 13) as u32).collect();
    let idx = Tensor::from_vec(ids, (2, 12), &Device::Cpu).unwrap();
    let full = model.forward(&idx, None).unwrap().logits; // (2, 12, V)
    let (first, mut state) = model.prefill(&idx.narrow(1, 0, 5).unwrap()).unwrap();
    assert!(max_abs_diff(&first, &full.narrow(1, 4, 1).unwrap().squeeze(1).unwrap()) < 1e-9);
    for pos in 5..12 {
        let token = idx.narrow(1, pos, 1).unwrap().squeeze(1).unwrap();
        let logits = model.decode_step(&token, &mut state).unwrap();
        let want = full.narrow(1, pos, 1).unwrap().squeeze(1).unwrap();
        assert!(max_abs_diff(&logits, &want) < 1e-9, "position {pos}");
    }
    assert_eq!(state.len(), 12);
}

#[test]
fn initialisation_follows_the_reference_ranges() {
    let mut cfg = hybrid("MFMF");
    cfg.d_model = 64;
    cfg.mamba = Some(MambaConfig {
        head_dim: 2, // 64 heads: enough draws to see the ranges filled
        ..cfg.mamba.clone().unwrap()
    });
    let (varmap, _) = build(&cfg, DType::F32);
    let data = varmap.data().lock().unwrap();
    let get = |name: &str| -> Vec<f64> {
        data[name]
            .as_tensor()
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let a: Vec<f64> = get("h.1.mamba.A_log").iter().map(|v| v.exp()).collect();
    assert_eq!(a.len(), 64);
    assert!(a.iter().all(|a| (1.0..=16.0).contains(a)), "{a:?}");
    assert!(
        a.iter().any(|a| *a < 4.0) && a.iter().any(|a| *a > 12.0),
        "{a:?}"
    );
    let dt: Vec<f64> = get("h.0.mamba.dt_bias")
        .iter()
        .map(|b| (1.0 + b.exp()).ln())
        .collect();
    assert!(dt.iter().all(|d| (0.000999..=0.1001).contains(d)), "{dt:?}");
    assert!(
        dt.iter().any(|d| *d < 0.003) && dt.iter().any(|d| *d > 0.03),
        "{dt:?}"
    );
    assert!(get("h.0.mamba.D").iter().all(|d| *d == 1.0));
    assert!(get("h.0.mamba.ln_out.weight").iter().all(|w| *w == 1.0));
    let conv = get("h.0.mamba.conv1d.weight");
    let bound = 1.0 / 3f64.sqrt();
    assert!(conv.iter().all(|w| w.abs() <= bound) && conv.iter().any(|w| w.abs() > 0.5 * bound));
}

#[test]
fn flops_count_a_mamba_layer_by_its_projections_and_its_chunked_scan() {
    let dense = hybrid("AF");
    let mixed = hybrid("MF");
    let t = 16;
    let (d, di, n, h, l, k) = (8.0, 16.0, 4.0, 4.0, 4.0, 3.0);
    let attention = 6.0 * 4.0 * d * d + 12.0 * d * t as f64;
    let mamba = 6.0 * (d * (2.0 * di + 2.0 * n + h) + di * d)
        + 3.0 * (2.0 * l * n + 2.0 * l * di + 4.0 * di * n + 2.0 * k * (di + 2.0 * n));
    let diff = Gpt::flops_per_token(&mixed, t) - Gpt::flops_per_token(&dense, t);
    assert!(
        (diff - (mamba - attention)).abs() < 1e-6,
        "{diff} vs {}",
        mamba - attention
    );
    // Without a pattern the count is the dense one, layer for layer.
    let plain = ModelConfig {
        layer_pattern: None,
        moe: None,
        ..dense.clone()
    };
    assert_eq!(
        Gpt::flops_per_token(&plain, t),
        Gpt::flops_per_token(&dense, t)
    );
    let (w, _) = mamba::flops_per_token(&mixed, t);
    assert_eq!(w, d * (2.0 * di + 2.0 * n + h) + di * d);
}

#[test]
fn a_pattern_that_does_not_fit_the_config_is_refused_naming_the_key() {
    let check = |sets: &[&str]| -> String {
        let mut cfg = Config::from_profile("tiny-hybrid").unwrap();
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        match cfg.apply_overrides(&sets) {
            Ok(()) => cfg.validate().unwrap_err().to_string(),
            Err(e) => e.to_string(),
        }
    };
    let err = check(&["model.layer_pattern=MFAF"]);
    assert!(
        err.starts_with("model.layer_pattern:")
            && err.contains("2 blocks")
            && err.contains("n_layers"),
        "{err}"
    );
    let err = check(&["model.layer_pattern=MFMZ"]);
    assert!(
        err.starts_with("model.layer_pattern: position 4") && err.contains("'Z'"),
        "{err}"
    );
    let err = check(&["model.mamba.head_dim=7"]);
    assert!(err.starts_with("model.mamba.head_dim:"), "{err}");
    let err = check(&["model.mamba.d_conv=1"]);
    assert!(err.starts_with("model.mamba.d_conv:"), "{err}");
    // Hugging Face export has no architecture for a hybrid, and says why.
    let why = trainer::hf::arch_for(&hybrid("MF")).unwrap_err();
    assert!(why.contains("model.layer_pattern"), "{why}");
    // A config without the keys is the dense model it always was.
    let tiny = Config::from_profile("tiny").unwrap();
    assert_eq!(tiny.model.layer_pattern, None);
    assert!(!tiny.model.has_mamba());
}
