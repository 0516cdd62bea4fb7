//! Causal multi-head self-attention with learned or rotary positions.

use std::sync::Arc;

use candle_core::{Module, Result, Tensor, D};
use candle_nn::VarBuilder;

use super::fused_attention::{self, RopeTables};
use super::{fused, maybe_dropout, DropoutRng, Linear};
use crate::config::{ModelConfig, PositionKind};

#[derive(Debug, Clone)]
pub struct CausalSelfAttention {
    c_attn: Linear,
    c_proj: Linear,
    n_heads: usize,
    head_dim: usize,
    dropout: f64,
    /// (max_T, max_T): 0 on and below the diagonal, -inf above.
    mask: Tensor,
    /// (max_T, head_dim/2) each, for RoPE.
    rope: Option<(Tensor, Tensor)>,
    /// The same tables for the fused CPU attention.
    rope_tables: Option<Arc<RopeTables>>,
}

impl CausalSelfAttention {
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let d = cfg.d_model;
        let head_dim = d / cfg.n_heads;
        let c_attn = Linear::new(d, 3 * d, cfg.bias, vb.pp("c_attn"))?;
        let c_proj = Linear::new(d, d, cfg.bias, vb.pp("c_proj"))?;
        let t = cfg.max_seq_len;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), vb.device())?.to_dtype(vb.dtype())?;
        let rope = match cfg.position {
            PositionKind::Learned => None,
            PositionKind::Rope => {
                let half = head_dim / 2;
                let mut cos = Vec::with_capacity(t * half);
                let mut sin = Vec::with_capacity(t * half);
                for pos in 0..t {
                    for i in 0..half {
                        let freq = cfg.rope_theta.powf(-2.0 * i as f64 / head_dim as f64);
                        let angle = pos as f64 * freq;
                        cos.push(angle.cos());
                        sin.push(angle.sin());
                    }
                }
                let tables = RopeTables {
                    cos: cos.clone(),
                    sin: sin.clone(),
                    half,
                };
                let cos = Tensor::from_vec(cos, (t, half), vb.device())?.to_dtype(vb.dtype())?;
                let sin = Tensor::from_vec(sin, (t, half), vb.device())?.to_dtype(vb.dtype())?;
                Some(((cos, sin), Arc::new(tables)))
            }
        };
        let (rope, rope_tables) = match rope {
            Some((tensors, tables)) => (Some(tensors), Some(tables)),
            None => (None, None),
        };
        Ok(CausalSelfAttention {
            c_attn,
            c_proj,
            n_heads: cfg.n_heads,
            head_dim,
            dropout: cfg.dropout,
            mask,
            rope,
            rope_tables,
        })
    }

    /// Rotate-half RoPE on (BH, T, hd) with differentiable ops.
    fn apply_rope(&self, x: &Tensor, t: usize) -> Result<Tensor> {
        let Some((cos, sin)) = &self.rope else {
            return Ok(x.clone());
        };
        let half = self.head_dim / 2;
        let cos = cos.narrow(0, 0, t)?; // (T, hd/2)
        let sin = sin.narrow(0, 0, t)?;
        let x1 = x.narrow(D::Minus1, 0, half)?; // (BH, T, hd/2)
        let x2 = x.narrow(D::Minus1, half, half)?;
        let r1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
        let r2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
        Tensor::cat(&[r1, r2], D::Minus1) // (BH, T, hd)
    }

    /// x (B, T, D) → (B, T, D)
    pub fn forward(&self, x: &Tensor, rng: Option<&mut DropoutRng>) -> Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        let (h, hd) = (self.n_heads, self.head_dim);
        let qkv = self.c_attn.forward(x)?; // (B, T, 3D)
        let scale = 1.0 / (hd as f64).sqrt();
        // Dropout on the probabilities needs them as a tensor: the fused op serves the rest.
        if fused::use_fused(&qkv) && (self.dropout == 0.0 || rng.is_none()) {
            let y = fused_attention::causal_attention(&qkv, h, scale, self.rope_tables.clone())?; // (B, T, D)
            return self.c_proj.forward(&y);
        }
        // One copy puts q, k, v head-major: (3, B, H, T, hd).
        let qkv = qkv
            .reshape((b, t, 3, h, hd))?
            .permute((2, 0, 3, 1, 4))?
            .contiguous()?;
        let q = qkv.get(0)?.reshape((b * h, t, hd))?; // (BH, T, hd)
        let k = qkv.get(1)?.reshape((b * h, t, hd))?;
        let v = qkv.get(2)?.reshape((b * h, t, hd))?;
        let q = self.apply_rope(&q, t)?;
        let k = self.apply_rope(&k, t)?;
        let scores = super::autocast::matmul(&q, &k.t()?)?; // (BH, T, T)
        let att = if fused::use_fused(&scores) {
            // One pass for scale + mask + softmax, and one for its backward.
            fused::causal_softmax(&scores, scale)?
        } else {
            let mask = self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?; // (T, T)
            candle_nn::ops::softmax(&(scores * scale)?.broadcast_add(&mask)?, D::Minus1)?
        }; // (BH, T, T)
        let att = maybe_dropout(&att, self.dropout, rng)?;
        let y = super::autocast::matmul(&att, &v)?; // (BH, T, hd)
        let y = y
            .reshape((b, h, t, hd))?
            .transpose(1, 2)?
            .reshape((b, t, d))?; // (B, T, D)
        self.c_proj.forward(&y)
    }
}
