//! Finite-difference gradient checks in f64 over every parameter kind: embeddings (learned and
//! rotary positions), attention qkv/proj, GELU and SwiGLU MLPs, LayerNorm and RMSNorm, the
//! untied head, dropout, an MoE block with its router, shared expert and aux/z losses, and
//! Mamba-2 blocks of a hybrid stack (projections, convolution, decays, step sizes, skip and
//! gated norm). On the CPU the ops take their fused kernels; two tests repeat the checks on the
//! primitive-op paths that CUDA and other dtypes take.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use trainer::config::{Activation, MambaConfig, ModelConfig, MoeConfig, NormKind, PositionKind};
use trainer::kernels;
use trainer::model::{cross_entropy, init_weights, DropoutRng, Gpt};

fn tiny(position: PositionKind, norm: NormKind, activation: Activation, bias: bool) -> ModelConfig {
    ModelConfig {
        vocab_size: 13,
        d_model: 8,
        n_layers: 2,
        n_heads: 2,
        d_ff: 12,
        max_seq_len: 8,
        position,
        norm,
        activation,
        bias,
        tie_embeddings: bias,
        ..ModelConfig::default()
    }
}

/// Loss (cross-entropy plus any MoE aux loss) with a fresh copy of the same dropout stream, so
/// every evaluation draws identical masks.
fn loss(model: &Gpt, idx: &Tensor, tgt: &Tensor, rng: &Option<DropoutRng>) -> Result<Tensor> {
    let mut rng = rng.clone();
    let out = model.forward(idx, rng.as_mut())?;
    let ce = cross_entropy(&out.logits, tgt)?;
    match out.aux_loss {
        Some(aux) => ce + aux,
        None => Ok(ce),
    }
}

fn set_entry(var: &Var, j: usize, value: f64) -> Result<()> {
    let mut v: Vec<f64> = var.as_tensor().flatten_all()?.to_vec1()?;
    v[j] = value;
    var.set(&Tensor::from_vec(v, var.shape(), var.device())?)
}

/// Checks sampled entries of every parameter; returns the names checked.
fn gradcheck(cfg: &ModelConfig, rng: Option<DropoutRng>) -> Result<Vec<String>> {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let model = Gpt::new(cfg, VarBuilder::from_varmap(&varmap, DType::F64, &dev))?;
    init_weights(&varmap, &cfg.clone(), 7)?;
    // Move biases and norm gains off their trivial init so their gradients are generic.
    let mut names: Vec<(String, Var)> = varmap.data().lock().unwrap().clone().into_iter().collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    for (i, (_, var)) in names.iter().enumerate() {
        let n = var.elem_count();
        let j = Tensor::arange(0u32, n as u32, &dev)?.to_dtype(DType::F64)?;
        let noise = ((j * 0.77)? + i as f64)?.sin()?.reshape(var.shape())?; // fixed, no RNG
        let bumped = (var.as_tensor() + (noise * 0.1)?)?;
        var.set(&bumped)?;
    }
    let (b, t) = (2, 7);
    let ids: Vec<u32> = (0..b * t)
        .map(|i| ((5 * i + 2) % cfg.vocab_size) as u32)
        .collect();
    let tgt: Vec<u32> = (0..b * t)
        .map(|i| ((3 * i + 1) % cfg.vocab_size) as u32)
        .collect();
    let idx = Tensor::from_vec(ids, (b, t), &dev)?;
    let tgt = Tensor::from_vec(tgt, (b, t), &dev)?;

    let grads = loss(&model, &idx, &tgt, &rng)?.backward()?;
    let h = 1e-5;
    for (name, var) in &names {
        // No gradient at all is legitimate only for an expert that received no tokens; the
        // finite differences must then agree that it is zero.
        let analytic: Vec<f64> = match grads.get(var.as_tensor()) {
            Some(g) => g.flatten_all()?.to_vec1()?,
            None => vec![0.0; var.elem_count()],
        };
        let base: Vec<f64> = var.as_tensor().flatten_all()?.to_vec1()?;
        let n = base.len();
        let mut entries: Vec<usize> = (0..6).map(|k| (k * 7919 + 3 * k) % n).collect();
        entries.dedup();
        for j in entries {
            set_entry(var, j, base[j] + h)?;
            let up = loss(&model, &idx, &tgt, &rng)?.to_scalar::<f64>()?;
            set_entry(var, j, base[j] - h)?;
            let down = loss(&model, &idx, &tgt, &rng)?.to_scalar::<f64>()?;
            set_entry(var, j, base[j])?;
            let numeric = (up - down) / (2.0 * h);
            let a = analytic[j];
            // Central differences in f64 are good to ~1e-9 absolute here (rounding of the
            // loss over 2h plus the h² term), so: 1e-5 relative, 1e-8 absolute.
            assert!(
                (a - numeric).abs() <= 1e-8 + 1e-5 * numeric.abs(),
                "{name}[{j}]: backward {a:e} vs finite difference {numeric:e}"
            );
        }
    }
    Ok(names.into_iter().map(|(n, _)| n).collect())
}

fn assert_covers(names: &[String], kinds: &[&str]) {
    for kind in kinds {
        assert!(
            names.iter().any(|n| n.contains(kind)),
            "no parameter named like {kind} in {names:?}"
        );
    }
}

#[test]
fn gradients_match_finite_differences_for_learned_positions_layernorm_gelu_and_dropout() {
    let mut cfg = tiny(
        PositionKind::Learned,
        NormKind::LayerNorm,
        Activation::Gelu,
        true,
    );
    cfg.dropout = 0.1;
    let names = gradcheck(&cfg, Some(DropoutRng::new(3))).unwrap();
    assert_covers(
        &names,
        &[
            "wte.weight",
            "wpe.weight",
            "attn.c_attn.weight",
            "attn.c_attn.bias",
            "attn.c_proj.weight",
            "mlp.c_fc.weight",
            "mlp.c_proj.bias",
            "ln_1.weight",
            "ln_2.bias",
            "ln_f.weight",
        ],
    );
}

#[test]
fn gradients_match_finite_differences_for_rope_rmsnorm_swiglu_and_untied_head() {
    let cfg = tiny(
        PositionKind::Rope,
        NormKind::RmsNorm,
        Activation::Swiglu,
        false,
    );
    let names = gradcheck(&cfg, None).unwrap();
    assert_covers(
        &names,
        &[
            "wte.weight",
            "lm_head.weight",
            "attn.c_attn.weight",
            "mlp.c_fc.weight",
            "ln_1.weight",
        ],
    );
    assert!(!names.iter().any(|n| n.contains("wpe")));
}

#[test]
fn gradients_match_finite_differences_for_an_moe_block_router_included() {
    let mut cfg = tiny(
        PositionKind::Learned,
        NormKind::LayerNorm,
        Activation::Gelu,
        true,
    );
    cfg.moe = Some(MoeConfig {
        num_experts: 4,
        top_k: 2,
        every_n_layers: 2,
        aux_loss_weight: 0.3,
        z_loss_weight: 0.05,
        router_jitter: 0.1,
        shared_expert: true,
        ..MoeConfig::default()
    });
    // The rng enables router jitter; a fresh clone per evaluation keeps the noise fixed.
    let names = gradcheck(&cfg, Some(DropoutRng::new(5))).unwrap();
    assert_covers(
        &names,
        &[
            "h.1.mlp.router.weight",
            "h.1.mlp.experts.0.c_fc.weight",
            "h.1.mlp.experts.3.c_proj.weight",
            "h.1.mlp.shared_expert.c_fc.weight",
            "h.0.mlp.c_fc.weight",
        ],
    );
}

#[test]
fn gradients_match_finite_differences_for_top1_moe_with_capacity_drops() {
    let mut cfg = tiny(
        PositionKind::Rope,
        NormKind::RmsNorm,
        Activation::Swiglu,
        false,
    );
    cfg.moe = Some(MoeConfig {
        num_experts: 3,
        top_k: 1,
        capacity_factor: 0.5,
        aux_loss_weight: 0.1,
        ..MoeConfig::default()
    });
    let names = gradcheck(&cfg, None).unwrap();
    assert_covers(
        &names,
        &["h.0.mlp.router.weight", "h.1.mlp.experts.2.c_fc.weight"],
    );
}

#[test]
fn gradients_match_finite_differences_on_the_primitive_op_paths_too() {
    let _primitives = kernels::primitives_only();
    for (position, norm, activation, bias) in [
        (
            PositionKind::Learned,
            NormKind::LayerNorm,
            Activation::Gelu,
            true,
        ),
        (
            PositionKind::Rope,
            NormKind::RmsNorm,
            Activation::Swiglu,
            false,
        ),
    ] {
        let cfg = tiny(position, norm, activation, bias);
        let names = gradcheck(&cfg, None).unwrap();
        assert_covers(&names, &["wte.weight", "attn.c_attn.weight", "ln_f.weight"]);
    }
}

/// A hybrid stack: Mamba-2 blocks (with and without an MLP), attention, dense and MoE MLPs.
fn hybrid() -> ModelConfig {
    let mut cfg = tiny(
        PositionKind::Rope,
        NormKind::RmsNorm,
        Activation::Swiglu,
        false,
    );
    cfg.layer_pattern = Some("MFAEM".parse().unwrap());
    cfg.n_layers = 3;
    cfg.mamba = Some(MambaConfig {
        d_state: 3,
        d_conv: 3,
        expand: 2,
        head_dim: 4,
        chunk_size: 3, // 7 tokens: two full chunks and a padded one
    });
    cfg.moe = Some(MoeConfig {
        num_experts: 3,
        top_k: 2,
        ..MoeConfig::default()
    });
    cfg
}

#[test]
fn gradients_match_finite_differences_for_mamba2_blocks_conv_and_gated_norm_included() {
    let names = gradcheck(&hybrid(), None).unwrap();
    let mamba = [
        "in_proj.weight",
        "conv1d.weight",
        "conv1d.bias",
        "dt_bias",
        "A_log",
        "mamba.D",
        "ln_out.weight",
        "out_proj.weight",
    ];
    for block in ["h.0.mamba.", "h.2.mamba."] {
        let kinds: Vec<String> = mamba
            .iter()
            .map(|k| format!("{block}{}", k.trim_start_matches("mamba.")))
            .collect();
        let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
        assert_covers(&names, &kinds);
    }
    assert_covers(&names, &["h.1.attn.c_attn.weight", "h.1.mlp.router.weight"]);
}

#[test]
fn mamba2_gradients_match_finite_differences_on_the_primitive_op_paths_too() {
    let _primitives = kernels::primitives_only();
    let names = gradcheck(&hybrid(), None).unwrap();
    assert_covers(
        &names,
        &["h.0.mamba.ln_out.weight", "h.0.mamba.conv1d.weight"],
    );
}
