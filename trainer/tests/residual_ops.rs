//! The residual-branch op (`trainer::kernels::residual`): a block's attention half and MLP
//! half as one op give the bits of their separate ops (values and every gradient), their
//! gradients match finite differences in f64, a branch that changes the width is refused, and
//! a GPT on the fused CPU path builds the one-op halves (counted in its graph).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};

use trainer::config::ModelConfig;
use trainer::kernels::{
    self, gelu_mlp, gelu_mlp_step, layer_norm, layer_norm_step, linear, linear_step, residual,
    CausalAttention, Rope,
};
use trainer::model::Gpt;

mod op_kit;
use op_kit::{check_gradient, outputs_and_grads, values};

const EPS: f64 = 1e-5;

/// x (B, T, D) and an attention half's tensors: LayerNorm gain and shift, W_qkv (3D, D),
/// b_qkv, W_proj (D, D), b_proj.
fn attention_inputs((b, t, d): (usize, usize, usize), dtype: DType) -> Result<Vec<Tensor>> {
    Ok(vec![
        values(&[b, t, d], dtype, 0.3)?,
        values(&[d], dtype, 0.9)?.affine(0.5, 1.0)?,
        (values(&[d], dtype, 2.2)? * 0.1)?,
        (values(&[3 * d, d], dtype, 1.1)? * 0.2)?,
        (values(&[3 * d], dtype, 2.3)? * 0.1)?,
        (values(&[d, d], dtype, 0.7)? * 0.2)?,
        (values(&[d], dtype, 1.9)? * 0.1)?,
    ])
}

/// x (N, D) and an MLP half's tensors: LayerNorm gain and shift, W_fc (F, D), b_fc,
/// W_proj (D, F), b_proj.
fn mlp_inputs((n, d, f): (usize, usize, usize), dtype: DType) -> Result<Vec<Tensor>> {
    Ok(vec![
        values(&[n, d], dtype, 0.4)?,
        values(&[d], dtype, 0.8)?.affine(0.5, 1.0)?,
        (values(&[d], dtype, 2.1)? * 0.1)?,
        (values(&[f, d], dtype, 1.3)? * 0.2)?,
        (values(&[f], dtype, 2.5)? * 0.1)?,
        (values(&[d, f], dtype, 0.6)? * 0.2)?,
        (values(&[d], dtype, 1.7)? * 0.1)?,
    ])
}

fn attention_half(attn: &CausalAttention, t: &[Tensor]) -> Result<Tensor> {
    residual(
        &t[0],
        vec![
            layer_norm_step(&t[1], &t[2], EPS)?,
            attn.projected_step(&t[3], &t[4])?,
            linear_step(&t[5], &t[6])?,
        ],
    )
}

fn attention_separately(attn: &CausalAttention, t: &[Tensor]) -> Result<Tensor> {
    let h = layer_norm(&t[0], &t[1], Some(&t[2]), EPS)?;
    let y = attn.forward_projected(&h, &t[3], Some(&t[4]))?;
    t[0].clone() + linear(&y, &t[5], Some(&t[6]))?
}

fn mlp_half(t: &[Tensor]) -> Result<Tensor> {
    let rows = t[0].dim(0)?;
    residual(
        &t[0],
        vec![
            layer_norm_step(&t[1], &t[2], EPS)?,
            gelu_mlp_step([&t[3], &t[4], &t[5], &t[6]], rows)?,
        ],
    )
}

fn mlp_separately(t: &[Tensor]) -> Result<Tensor> {
    let rows = t[0].dim(0)?;
    let h = layer_norm(&t[0], &t[1], Some(&t[2]), EPS)?;
    t[0].clone() + gelu_mlp(&h, &[[&t[3], &t[4], &t[5], &t[6]]], &[rows])?
}

const NAMES: [&str; 8] = [
    "y", "dx", "dgain", "dshift", "dW_in", "db_in", "dW_proj", "db_proj",
];

#[test]
fn an_attention_half_as_one_op_gives_the_bits_of_its_separate_ops() -> Result<()> {
    // 4 × 96 tokens: the norm's rows, the attention's (batch, head) pairs and the projections'
    // rows all split across threads.
    let (b, t, d, h) = (4, 96, 48, 4);
    let dev = Device::Cpu;
    let rope = Rope::new(10_000.0, d / h, t, &dev, DType::F32)?;
    for attn in [
        CausalAttention::new(h, t, None, &dev, DType::F32)?,
        CausalAttention::new(h, t, Some(rope), &dev, DType::F32)?,
    ] {
        let inputs = attention_inputs((b, t, d), DType::F32)?;
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let g = values(&[b, t, d], DType::F32, 0.7)?;
        let (dims, one_op) = outputs_and_grads(&|t| attention_half(&attn, t), &refs, &g)?;
        assert_eq!(dims, [b, t, d]);
        let (_, separate) = outputs_and_grads(&|t| attention_separately(&attn, t), &refs, &g)?;
        for (i, what) in NAMES.iter().enumerate() {
            assert_eq!(one_op[i], separate[i], "{what}");
        }
    }
    Ok(())
}

#[test]
fn an_mlp_half_as_one_op_gives_the_bits_of_its_separate_ops() -> Result<()> {
    let (n, d, f) = (700, 40, 100);
    let inputs = mlp_inputs((n, d, f), DType::F32)?;
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let g = values(&[n, d], DType::F32, 0.5)?;
    let (dims, one_op) = outputs_and_grads(&mlp_half, &refs, &g)?;
    assert_eq!(dims, [n, d]);
    let (_, separate) = outputs_and_grads(&mlp_separately, &refs, &g)?;
    for (i, what) in NAMES.iter().enumerate() {
        assert_eq!(one_op[i], separate[i], "{what}");
    }
    Ok(())
}

/// A half-block of its input and tensors.
type Half<'a> = &'a dyn Fn(&[Tensor]) -> Result<Tensor>;

#[test]
fn both_halves_gradients_match_finite_differences_in_f64() -> Result<()> {
    let dev = Device::Cpu;
    let attn = CausalAttention::new(2, 5, None, &dev, DType::F64)?;
    let halves: [(Vec<Tensor>, Half); 2] = [
        (attention_inputs((2, 5, 4), DType::F64)?, &|t| {
            attention_half(&attn, t)
        }),
        (mlp_inputs((3, 4, 6), DType::F64)?, &mlp_half),
    ];
    for (h, (inputs, half)) in halves.iter().enumerate() {
        for (i, input) in inputs.iter().enumerate() {
            let with = |v: &Tensor| {
                let mut t = inputs.clone();
                t[i] = v.clone();
                half(&t)
            };
            let worst = check_gradient(with, input.dims())?;
            assert!(
                worst < 1e-6,
                "half {h}, {}: worst relative error {worst}",
                NAMES[i + 1]
            );
        }
    }
    Ok(())
}

#[test]
fn a_branch_that_changes_the_width_is_refused() -> Result<()> {
    let x = values(&[3, 4], DType::F32, 0.3)?;
    let (w, b) = (
        values(&[5, 4], DType::F32, 1.1)?,
        values(&[5], DType::F32, 0.2)?,
    );
    let err = residual(&x, vec![linear_step(&w, &b)?]).unwrap_err();
    assert!(
        err.to_string().contains("branch maps [3, 4] to [3, 5]"),
        "{err}"
    );
    Ok(())
}

/// The number of distinct (B, T, D) tensors in the backward graph of a GPT's logits.
fn activation_nodes(cfg: &ModelConfig, b: usize, t: usize) -> Result<usize> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let gpt = Gpt::new(cfg, vb)?;
    let idx = Tensor::zeros((b, t), DType::U32, &Device::Cpu)?;
    let logits = gpt.forward(&idx, None)?.logits;
    let nodes = logits.sorted_nodes();
    Ok(nodes
        .iter()
        .filter(|n| n.dims() == [b, t, cfg.d_model])
        .count())
}

#[test]
fn a_gpt_on_the_fused_path_has_one_activation_node_per_half_block() -> Result<()> {
    let cfg = ModelConfig {
        vocab_size: 16,
        d_model: 8,
        n_layers: 3,
        n_heads: 2,
        d_ff: 16,
        max_seq_len: 8,
        ..ModelConfig::default()
    };
    // The token embeddings, the position embeddings broadcast over the batch and their sum;
    // then one per half-block; then the final norm's output.
    assert_eq!(activation_nodes(&cfg, 2, 8)?, 3 + 2 * cfg.n_layers + 1);
    // With the primitive ops, each half has at least its norm's, its sublayer's and its
    // sum's outputs.
    let _primitive = kernels::primitives_only();
    let (embeddings, final_norm) = (3, 1);
    assert!(activation_nodes(&cfg, 2, 8)? >= embeddings + 2 * 3 * cfg.n_layers + final_norm);
    Ok(())
}
