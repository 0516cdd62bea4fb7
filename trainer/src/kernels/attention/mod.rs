//! Causal multi-head attention over the packed output of a q/k/v projection:
//! y = softmax(q·kᵀ/√hd + causal mask)·v for every head, with rotary positions applied to q and
//! k when configured.
//!
//! On CPU in f32 and f64 it is one fused op (`fused.rs`) from the packed (B, T, 3·D) input to the
//! head-merged (B, T, D) output; on a GPU under bf16 autocast (without rotary positions) one
//! CUDA op does the same (`kernels::cuda::attention`). Elsewhere, and when the attention probabilities get dropout
//! (the fused op keeps them inside), the reference path below does the same from primitives,
//! its matmuls in the autocast scope's precision.

mod fused;
mod qkv;

use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor, D};

pub use fused::{fused_causal_attention, RopeTables};
pub use qkv::{fused_qkv_attention, qkv_attention_step};

use super::residual::Step;
use super::{autocast, softmax};

/// Rotate-half rotary positions (GPT-NeoX, LLaMA): (x1, x2) ↦ (x1·cos − x2·sin, x2·cos + x1·sin)
/// for the two halves of each head, at angle pos · θ^(−2i/hd).
#[derive(Debug, Clone)]
pub struct Rope {
    /// (max_T, hd/2) each, for the reference path.
    cos: Tensor,
    sin: Tensor,
    /// The same values for the fused path.
    tables: Arc<RopeTables>,
}

impl Rope {
    pub fn new(
        theta: f64,
        head_dim: usize,
        max_t: usize,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_t * half);
        let mut sin = Vec::with_capacity(max_t * half);
        for pos in 0..max_t {
            for i in 0..half {
                let angle = pos as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let tensor = |values: &[f64]| {
            Tensor::from_vec(values.to_vec(), (max_t, half), device)?.to_dtype(dtype)
        };
        Ok(Rope {
            cos: tensor(&cos)?,
            sin: tensor(&sin)?,
            tables: Arc::new(RopeTables { cos, sin, half }),
        })
    }

    /// x (BH, T, hd) rotated by position, from differentiable ops.
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let (_, t, hd) = x.dims3()?;
        let half = hd / 2;
        let cos = self.cos.narrow(0, 0, t)?; // (T, hd/2)
        let sin = self.sin.narrow(0, 0, t)?;
        let x1 = x.narrow(D::Minus1, 0, half)?; // (BH, T, hd/2)
        let x2 = x.narrow(D::Minus1, half, half)?;
        let r1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
        let r2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
        Tensor::cat(&[r1, r2], D::Minus1) // (BH, T, hd)
    }
}

/// The attention op of one layer: head count, the causal mask and rotary tables, built once.
#[derive(Debug, Clone)]
pub struct CausalAttention {
    n_heads: usize,
    /// (max_T, max_T): 0 on and below the diagonal, −∞ above (reference path).
    mask: Tensor,
    rope: Option<Rope>,
}

impl CausalAttention {
    /// For sequences up to `max_t`; `rope`, when given, rotates q and k.
    pub fn new(
        n_heads: usize,
        max_t: usize,
        rope: Option<Rope>,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let mask: Vec<f32> = (0..max_t * max_t)
            .map(|i| {
                if i % max_t > i / max_t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (max_t, max_t), device)?.to_dtype(dtype)?;
        Ok(CausalAttention {
            n_heads,
            mask,
            rope,
        })
    }

    /// `forward` of the packed projection x·Wᵀ + b, without probability dropout: x (B, T, C),
    /// W (3·D, C) → y (B, T, D). On the fused CPU path the projection and the attention are
    /// one op (`fused_qkv_attention`); elsewhere the two ops.
    pub fn forward_projected(&self, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
        match b {
            Some(b) if super::use_fused(x) && !autocast::is_active() => {
                let hd = w.dim(0)? / 3 / self.n_heads;
                let scale = 1.0 / (hd as f64).sqrt();
                let tables = self.rope.as_ref().map(|r| r.tables.clone());
                fused_qkv_attention(x, w, b, self.n_heads, scale, tables) // (B, T, D)
            }
            _ => {
                let qkv = super::linear(x, w, b)?; // (B, T, 3·D)
                self.forward(&qkv, None::<fn(&Tensor) -> Result<Tensor>>)
            }
        }
    }

    /// `forward_projected` with a bias as a step of a residual branch (`residual`, the fused
    /// CPU path only).
    pub fn projected_step(&self, w: &Tensor, b: &Tensor) -> Result<Box<dyn Step>> {
        let hd = w.dim(0)? / 3 / self.n_heads;
        let scale = 1.0 / (hd as f64).sqrt();
        let tables = self.rope.as_ref().map(|r| r.tables.clone());
        qkv_attention_step(w, b, self.n_heads, scale, tables)
    }

    /// qkv (B, T, 3·D), q then k then v along the last dim, each head-major → y (B, T, D).
    /// `probs_dropout`, when given, is applied to the attention probabilities (training with
    /// attention dropout); only the reference path has them as a tensor, so it serves those calls.
    pub fn forward<F>(&self, qkv: &Tensor, probs_dropout: Option<F>) -> Result<Tensor>
    where
        F: FnOnce(&Tensor) -> Result<Tensor>,
    {
        let (b, t, d3) = qkv.dims3()?;
        let (h, d) = (self.n_heads, d3 / 3);
        let hd = d / h;
        let scale = 1.0 / (hd as f64).sqrt();
        if super::use_fused(qkv) && probs_dropout.is_none() {
            let tables = self.rope.as_ref().map(|r| r.tables.clone());
            return fused_causal_attention(qkv, h, scale, tables); // (B, T, D)
        }
        if probs_dropout.is_none()
            && self.rope.is_none()
            && autocast::is_active()
            && super::use_cuda_kernel(qkv, super::CudaKernel::Attention)
        {
            // One graph node on the GPU, products in bf16 (see `cuda::attention`).
            return bf16_attention_on_gpu(qkv, h, scale); // (B, T, D)
        }
        // One copy puts q, k, v head-major: (3, B, H, T, hd).
        let qkv = qkv
            .reshape((b, t, 3, h, hd))?
            .permute((2, 0, 3, 1, 4))?
            .contiguous()?;
        let q = qkv.get(0)?.reshape((b * h, t, hd))?; // (BH, T, hd)
        let k = qkv.get(1)?.reshape((b * h, t, hd))?;
        let v = qkv.get(2)?.reshape((b * h, t, hd))?;
        let (q, k) = match &self.rope {
            Some(rope) => (rope.apply(&q)?, rope.apply(&k)?),
            None => (q, k),
        };
        if probs_dropout.is_none()
            && autocast::is_active()
            && super::use_cuda_kernel(&q, super::CudaKernel::Softmax)
        {
            // Under bf16 autocast on a GPU the scores and probabilities stay bf16 between the two
            // products (the softmax kernel computes in f32): they are the model's biggest
            // tensors, and casting them to f32 and back costs three extra passes each way.
            let bf16 = |x: &Tensor| x.to_dtype(DType::BF16);
            let scores = bf16(&q)?.matmul(&bf16(&k)?.t()?)?; // (BH, T, T) bf16
            let att = softmax::fused_causal_softmax(&scores, scale)?; // (BH, T, T) bf16
            let y = att.matmul(&bf16(&v)?)?.to_dtype(q.dtype())?; // (BH, T, hd)
            return y
                .reshape((b, h, t, hd))?
                .transpose(1, 2)?
                .reshape((b, t, d)); // (B, T, D)
        }
        let scores = autocast::matmul(&q, &k.t()?)?; // (BH, T, T)
        let att = softmax::causal_softmax(&scores, scale, &self.mask)?; // (BH, T, T)
        let att = match probs_dropout {
            Some(dropout) => dropout(&att)?,
            None => att,
        };
        let y = autocast::matmul(&att, &v)?; // (BH, T, hd)
        y.reshape((b, h, t, hd))?
            .transpose(1, 2)?
            .reshape((b, t, d)) // (B, T, D)
    }
}

#[cfg(feature = "cuda")]
fn bf16_attention_on_gpu(qkv: &Tensor, heads: usize, scale: f64) -> Result<Tensor> {
    super::cuda::attention::bf16_causal_attention(qkv, heads, scale)
}

#[cfg(not(feature = "cuda"))]
fn bf16_attention_on_gpu(_: &Tensor, _: usize, _: f64) -> Result<Tensor> {
    candle_core::bail!("attention: this build has no CUDA kernels") // never taken without them
}
