//! LoRA (Hu et al., 2021): a frozen linear layer W plus a trainable low-rank update,
//! y = x·Wᵀ + b + (alpha/r)·(dropout(x)·Aᵀ)·Bᵀ, with A (r, in) random and B (out, r) zero at the
//! start, so training begins exactly at the base model.
//!
//! Adapters live in the same `VarMap` as the base weights, under the layer's path:
//! `h.0.attn.c_attn.lora_a.q` (r, in) and `h.0.attn.c_attn.lora_b.q` (rows, r). A fused
//! projection (q, k, v side by side in `c_attn`; gate and up in a SwiGLU `c_fc`) gets one
//! adapter per targeted block of its output rows. The base weights are handed to the model
//! detached ([`var_builder`]), so the backward pass computes no gradient for them and the
//! optimizer holds no state for them.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Shape, Tensor, D};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{maybe_dropout, DropoutRng};
use crate::config::{Activation, LoraConfig, ModelConfig};

/// Whether a variable is a LoRA adapter matrix (trainable) rather than a base weight.
pub fn is_adapter(name: &str) -> bool {
    name.contains(".lora_a.") || name.contains(".lora_b.")
}

/// The output rows (first, count) of a layer that the target `part` adapts: q, k and v are
/// thirds of `c_attn`; every other target covers its layer's whole output.
pub fn part_rows(part: &str, out_dim: usize) -> (usize, usize) {
    match part {
        "q" => (0, out_dim / 3),
        "k" => (out_dim / 3, out_dim / 3),
        "v" => (2 * out_dim / 3, out_dim / 3),
        _ => (0, out_dim),
    }
}

/// Output width of a layer's fused first MLP projection (SwiGLU holds gate and up).
pub fn mlp_in_rows(cfg: &ModelConfig) -> usize {
    match cfg.activation {
        Activation::Gelu => cfg.d_ff,
        Activation::Swiglu => 2 * cfg.d_ff,
    }
}

#[derive(Debug, Clone)]
struct Part {
    /// First output row of the block this adapter updates.
    start: usize,
    /// (r, in)
    a: Tensor,
    /// (rows, r)
    b: Tensor,
}

/// The adapters of one linear layer, in output-row order.
#[derive(Debug, Clone)]
pub struct Adapter {
    parts: Vec<Part>,
    out_dim: usize,
    /// alpha / r
    scale: f64,
    dropout: f64,
}

impl Adapter {
    /// Adapters for the targets in `parts` (names as in `training.lora.targets`) of a layer
    /// (in_dim → out_dim) whose variables live under `vb`.
    pub fn new(
        lora: &LoraConfig,
        parts: &[&str],
        in_dim: usize,
        out_dim: usize,
        vb: &VarBuilder,
    ) -> Result<Self> {
        let mut made = Vec::with_capacity(parts.len());
        for part in parts {
            let (start, rows) = part_rows(part, out_dim);
            // Placeholder inits; `init_adapters` sets the seeded values (A random, B zero).
            let a =
                vb.get_with_hints((lora.r, in_dim), &format!("lora_a.{part}"), Init::Const(0.))?;
            let b =
                vb.get_with_hints((rows, lora.r), &format!("lora_b.{part}"), Init::Const(0.))?;
            made.push(Part { start, a, b });
        }
        made.sort_by_key(|p| p.start);
        Ok(Adapter {
            parts: made,
            out_dim,
            scale: lora.alpha / lora.r as f64,
            dropout: lora.dropout,
        })
    }

    /// x (.., in) → the update (.., out): (alpha/r)·B·A·x on the adapted rows, zero elsewhere.
    pub fn forward(&self, x: &Tensor, rng: Option<&mut DropoutRng>) -> Result<Tensor> {
        let x = maybe_dropout(x, self.dropout, rng)?;
        let mut blocks = Vec::with_capacity(2 * self.parts.len() + 1);
        let mut row = 0;
        let zeros = |n: usize| {
            let mut shape = x.dims().to_vec();
            if let Some(last) = shape.last_mut() {
                *last = n;
            }
            Tensor::zeros(shape, x.dtype(), x.device())
        };
        for p in &self.parts {
            if p.start > row {
                blocks.push(zeros(p.start - row)?);
            }
            let low = crate::kernels::linear(&x, &p.a, None)?; // (.., r)
            let up = crate::kernels::linear(&low, &p.b, None)?; // (.., rows)
            row = p.start + up.dim(D::Minus1)?;
            blocks.push(up);
        }
        if row < self.out_dim {
            blocks.push(zeros(self.out_dim - row)?);
        }
        let delta = if blocks.len() == 1 {
            blocks.remove(0)
        } else {
            Tensor::cat(&blocks, D::Minus1)?
        }; // (.., out)
        delta.affine(self.scale, 0.0)
    }
}

/// A `VarBuilder` over `varmap` for a model with adapters: base weights come back detached
/// (frozen: no gradient is computed for them), adapters as trainable variables.
pub fn var_builder(varmap: &VarMap, dtype: DType, device: &Device) -> VarBuilder<'static> {
    VarBuilder::from_backend(Box::new(FrozenBase(varmap.clone())), dtype, device.clone())
}

struct FrozenBase(VarMap);

impl SimpleBackend for FrozenBase {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let t = self.0.get(s, name, h, dtype, dev)?;
        Ok(if is_adapter(name) { t } else { t.detach() })
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> Result<Tensor> {
        SimpleBackend::get_unchecked(&self.0, name, dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        SimpleBackend::contains_tensor(&self.0, name)
    }
}

/// The paper's initialization from one seeded stream over the sorted adapter names: A with
/// N(0, 1/in) entries (PEFT's Kaiming scale), B zero, so the adapted model starts as the base.
pub fn init_adapters(varmap: &VarMap, seed: u64) -> Result<()> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| candle_core::Error::Msg("variable map lock poisoned".to_string()))?;
    let mut names: Vec<&String> = data.keys().filter(|n| is_adapter(n)).collect();
    names.sort();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x10_7a_10_7a);
    for name in names {
        let var = &data[name];
        let values: Vec<f32> = if name.contains(".lora_a.") {
            let std = 1.0 / (var.dim(1)? as f64).sqrt();
            (0..var.elem_count())
                .map(|_| {
                    // Box–Muller, as the base init: seedable and identical on every device.
                    let u1: f64 = 1.0 - rng.random::<f64>();
                    let u2: f64 = rng.random::<f64>();
                    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * std) as f32
                })
                .collect()
        } else {
            vec![0.0; var.elem_count()]
        };
        let t = Tensor::from_vec(values, var.shape(), var.device())?.to_dtype(var.dtype())?;
        var.set(&t)?;
    }
    Ok(())
}

/// The base weights with every adapter folded in: `W[rows] += (alpha/r)·B·A`. The result has
/// only base names, the shapes of a model without adapters.
pub fn merged_weights(
    varmap: &VarMap,
    lora: &LoraConfig,
) -> candle_core::Result<HashMap<String, Tensor>> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| candle_core::Error::Msg("variable map lock poisoned".to_string()))?;
    let mut out: HashMap<String, Tensor> = data
        .iter()
        .filter(|(n, _)| !is_adapter(n))
        .map(|(n, v)| (n.clone(), v.as_tensor().detach()))
        .collect();
    let scale = lora.alpha / lora.r as f64;
    let mut adapters: Vec<&String> = data.keys().filter(|n| n.contains(".lora_a.")).collect();
    adapters.sort();
    for a_name in adapters {
        let Some((layer, part)) = a_name.split_once(".lora_a.") else {
            continue;
        };
        let b_name = format!("{layer}.lora_b.{part}");
        let w_name = format!("{layer}.weight");
        let (Some(b), Some(w)) = (data.get(&b_name), out.get(&w_name)) else {
            candle_core::bail!("adapter {a_name} has no {b_name} or base {w_name}");
        };
        let (start, rows) = part_rows(part, w.dim(0)?);
        let delta = b
            .as_tensor()
            .matmul(data[a_name].as_tensor())?
            .affine(scale, 0.0)?; // (rows, in)
        let mut pieces = Vec::new();
        if start > 0 {
            pieces.push(w.narrow(0, 0, start)?);
        }
        pieces.push((w.narrow(0, start, rows)? + delta)?);
        if start + rows < w.dim(0)? {
            pieces.push(w.narrow(0, start + rows, w.dim(0)? - start - rows)?);
        }
        let merged = Tensor::cat(&pieces, 0)?;
        out.insert(w_name, merged);
    }
    Ok(out)
}
