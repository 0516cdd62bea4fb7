//! Causal multi-head self-attention with learned or rotary positions.

use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

use super::{DropoutRng, Linear};
use crate::config::{LoraConfig, LoraTarget, ModelConfig, PositionKind};
use crate::kernels::{self, CausalAttention, Rope};

#[derive(Debug, Clone)]
pub struct CausalSelfAttention {
    /// d → 3·d: q, k and v side by side, each head-major.
    c_attn: Linear,
    /// softmax(q·kᵀ/√hd + causal mask)·v per head, RoPE on q and k when configured.
    attn: CausalAttention,
    /// d → d
    c_proj: Linear,
    /// On the attention probabilities.
    dropout: f64,
}

impl CausalSelfAttention {
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let d = cfg.d_model;
        let (dev, dtype) = (vb.device(), vb.dtype());
        let rope = match cfg.position {
            PositionKind::Learned => None,
            PositionKind::Rope => Some(Rope::new(
                cfg.rope_theta,
                d / cfg.n_heads,
                cfg.max_seq_len,
                dev,
                dtype,
            )?),
        };
        Ok(CausalSelfAttention {
            c_attn: Linear::new(d, 3 * d, cfg.bias, vb.pp("c_attn"))?,
            attn: CausalAttention::new(cfg.n_heads, cfg.max_seq_len, rope, dev, dtype)?,
            c_proj: Linear::new(d, d, cfg.bias, vb.pp("c_proj"))?,
            dropout: cfg.dropout,
        })
    }

    /// LoRA adapters on the targeted projections (q, k, v, o).
    pub fn adapt(&mut self, lora: &LoraConfig, vb: &VarBuilder) -> Result<()> {
        let qkv: Vec<&str> = [LoraTarget::Q, LoraTarget::K, LoraTarget::V]
            .into_iter()
            .filter(|&t| lora.adapts(t))
            .map(LoraTarget::as_str)
            .collect();
        self.c_attn.adapt(lora, &qkv, &vb.pp("c_attn"))?;
        if lora.adapts(LoraTarget::O) {
            self.c_proj
                .adapt(lora, &[LoraTarget::O.as_str()], &vb.pp("c_proj"))?;
        }
        Ok(())
    }

    /// The same attention without adapters (sharing the weights).
    pub fn without_adapters(&self) -> Self {
        CausalSelfAttention {
            c_attn: self.c_attn.without_adapter(),
            c_proj: self.c_proj.without_adapter(),
            ..self.clone()
        }
    }

    /// The projections and the attention as steps of a fused residual branch
    /// (`kernels::residual`): both projections with biases and no adapters only.
    pub fn steps(&self) -> Result<Option<Vec<Box<dyn kernels::Step>>>> {
        match (self.c_attn.plain(), self.c_proj.plain()) {
            (Some((w, Some(b))), Some((w_proj, Some(b_proj)))) => Ok(Some(vec![
                self.attn.projected_step(w, b)?,
                kernels::linear_step(w_proj, b_proj)?,
            ])),
            _ => Ok(None),
        }
    }

    /// x (B, T, D) → (B, T, D). With an rng (training), the probabilities get dropout (and
    /// adapters their LoRA dropout).
    pub fn forward(&self, x: &Tensor, mut rng: Option<&mut DropoutRng>) -> Result<Tensor> {
        let p = self.dropout;
        if let (Some((w, b)), false) = (self.c_attn.plain(), rng.is_some() && p > 0.0) {
            // No adapter and no dropout: the projection and the attention may be one op.
            let y = self.attn.forward_projected(x, w, b)?; // (B, T, D)
            return self.c_proj.forward_t(&y, rng);
        }
        let qkv = self.c_attn.forward_t(x, rng.as_deref_mut())?; // (B, T, 3D)
        let probs_dropout = rng
            .as_deref_mut()
            .filter(|_| p > 0.0)
            .map(|rng| move |att: &Tensor| rng.dropout(att, p));
        let y = self.attn.forward(&qkv, probs_dropout)?; // (B, T, D)
        self.c_proj.forward_t(&y, rng)
    }
}
