//! The decoder: embeddings → pre-norm blocks → final norm → (tied) output head.

use candle_core::{bail, Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::{
    maybe_dropout, CausalSelfAttention, DropoutRng, Embedding, Linear, Mlp, ModelOutput, MoeLayer,
    MoeLayerStats, Norm,
};
use crate::config::{Activation, LoraConfig, ModelConfig, PositionKind};

#[derive(Debug, Clone)]
enum FeedForward {
    Dense(Mlp),
    Moe(MoeLayer),
}

/// x + attn(ln_1(x)), then x + mlp(ln_2(x)); the MLP may be a Mixture-of-Experts.
#[derive(Debug, Clone)]
pub struct Block {
    ln_1: Norm,
    attn: CausalSelfAttention,
    ln_2: Norm,
    mlp: FeedForward,
    dropout: f64,
}

impl Block {
    pub fn new(cfg: &ModelConfig, layer: usize, vb: VarBuilder) -> Result<Self> {
        let mlp = match &cfg.moe {
            Some(moe) if (layer + 1).is_multiple_of(moe.every_n_layers) => {
                FeedForward::Moe(MoeLayer::new(cfg, moe, layer, vb.pp("mlp"))?)
            }
            _ => FeedForward::Dense(Mlp::new(cfg, vb.pp("mlp"))?),
        };
        Ok(Block {
            ln_1: Norm::new(cfg, vb.pp("ln_1"))?,
            attn: CausalSelfAttention::new(cfg, vb.pp("attn"))?,
            ln_2: Norm::new(cfg, vb.pp("ln_2"))?,
            mlp,
            dropout: cfg.dropout,
        })
    }

    /// LoRA adapters on the projections `lora.targets` names; `vb` is the block's path.
    pub fn adapt(&mut self, lora: &LoraConfig, vb: &VarBuilder) -> Result<()> {
        self.attn.adapt(lora, &vb.pp("attn"))?;
        let targets = |t: &str| lora.targets.iter().any(|x| x == t);
        match &mut self.mlp {
            FeedForward::Dense(mlp) => {
                mlp.adapt(lora, targets("mlp_in"), targets("mlp_out"), &vb.pp("mlp"))
            }
            FeedForward::Moe(moe) => moe.adapt(lora, &vb.pp("mlp")),
        }
    }

    /// The same block without adapters (sharing the weights).
    pub fn without_adapters(&self) -> Self {
        Block {
            attn: self.attn.without_adapters(),
            mlp: match &self.mlp {
                FeedForward::Dense(mlp) => FeedForward::Dense(mlp.without_adapters()),
                FeedForward::Moe(moe) => FeedForward::Moe(moe.without_adapters()),
            },
            ..self.clone()
        }
    }

    /// x (B, T, D) → (B, T, D), plus the MoE layer's weighted aux loss and stats.
    pub fn forward(
        &self,
        x: &Tensor,
        mut rng: Option<&mut DropoutRng>,
    ) -> Result<(Tensor, Option<(Tensor, MoeLayerStats)>)> {
        let a = self
            .attn
            .forward(&self.ln_1.forward(x)?, rng.as_deref_mut())?;
        let x = (x + maybe_dropout(&a, self.dropout, rng.as_deref_mut())?)?;
        let h = self.ln_2.forward(&x)?;
        let (m, moe) = match &self.mlp {
            FeedForward::Dense(mlp) => (mlp.forward_t(&h, rng.as_deref_mut())?, None),
            FeedForward::Moe(moe) => {
                let out = moe.forward(&h, rng.as_deref_mut())?;
                (out.y, Some((out.aux_loss, out.stats)))
            }
        };
        let x = (x + maybe_dropout(&m, self.dropout, rng)?)?;
        Ok((x, moe))
    }
}

#[derive(Debug, Clone)]
pub struct Gpt {
    wte: Embedding,
    wpe: Option<Embedding>,
    h: Vec<Block>,
    ln_f: Norm,
    /// D → V; the `wte` table itself when embeddings are tied.
    lm_head: Linear,
    cfg: ModelConfig,
}

impl Gpt {
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let wte = Embedding::new(cfg.vocab_size, cfg.d_model, vb.pp("wte"))?;
        let wpe = match cfg.position {
            PositionKind::Learned => {
                Some(Embedding::new(cfg.max_seq_len, cfg.d_model, vb.pp("wpe"))?)
            }
            PositionKind::Rope => None,
        };
        let h = (0..cfg.n_layers)
            .map(|i| Block::new(cfg, i, vb.pp(format!("h.{i}"))))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = Norm::new(cfg, vb.pp("ln_f"))?;
        let lm_head = if cfg.tie_embeddings {
            Linear::tied(wte.table())
        } else {
            Linear::new(cfg.d_model, cfg.vocab_size, false, vb.pp("lm_head"))?
        };
        Ok(Gpt {
            wte,
            wpe,
            h,
            ln_f,
            lm_head,
            cfg: cfg.clone(),
        })
    }

    /// The same model with LoRA adapters on `lora.targets` (variables under `vb`, which should
    /// come from `lora::var_builder` so the base weights are frozen).
    pub fn with_adapters(cfg: &ModelConfig, lora: &LoraConfig, vb: VarBuilder) -> Result<Self> {
        let mut gpt = Gpt::new(cfg, vb.clone())?;
        for (i, block) in gpt.h.iter_mut().enumerate() {
            block.adapt(lora, &vb.pp(format!("h.{i}")))?;
        }
        Ok(gpt)
    }

    /// The base model: the same weights without adapters (the DPO reference under LoRA).
    pub fn without_adapters(&self) -> Self {
        Gpt {
            h: self.h.iter().map(Block::without_adapters).collect(),
            ..self.clone()
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Where the weights live.
    pub fn device(&self) -> &candle_core::Device {
        self.wte.table().device()
    }

    /// idx (B, T) u32 → logits (B, T, V). Pass a `DropoutRng` when training: it enables
    /// dropout and router jitter; `None` is evaluation mode.
    pub fn forward(
        &self,
        idx: &Tensor,
        mut dropout: Option<&mut DropoutRng>,
    ) -> Result<ModelOutput> {
        let (_, t) = idx.dims2()?;
        if t > self.cfg.max_seq_len {
            bail!(
                "sequence length {t} exceeds model.max_seq_len {}",
                self.cfg.max_seq_len
            );
        }
        let mut x = self.wte.forward(idx)?; // (B, T, D)
        if let Some(wpe) = &self.wpe {
            let pos = Tensor::arange(0u32, t as u32, idx.device())?; // (T,)
            x = x.broadcast_add(&wpe.forward(&pos)?)?; // (B, T, D)
        }
        let mut x = maybe_dropout(&x, self.cfg.dropout, dropout.as_deref_mut())?;
        let mut aux: Option<Tensor> = None;
        let mut stats = Vec::new();
        for block in &self.h {
            let (y, moe) = block.forward(&x, dropout.as_deref_mut())?;
            x = y;
            if let Some((loss, s)) = moe {
                aux = Some(match aux {
                    Some(a) => (a + loss)?,
                    None => loss,
                });
                stats.push(s);
            }
        }
        let x = self.ln_f.forward(&x)?; // (B, T, D)
        let logits = self.lm_head.forward(&x)?; // (B, T, V)
        Ok(ModelOutput {
            logits,
            aux_loss: aux,
            moe: stats,
        })
    }

    /// Training FLOPs per token: 6 per active matmul weight (forward + backward) plus the
    /// attention scores and mixing, 12·L·D·T (the PaLM / nanoGPT estimate used for MFU).
    pub fn flops_per_token(cfg: &ModelConfig, seq_len: usize) -> f64 {
        let d = cfg.d_model as f64;
        let ff = cfg.d_ff as f64;
        let mlp = match cfg.activation {
            Activation::Gelu => 2.0 * d * ff,
            Activation::Swiglu => 3.0 * d * ff,
        };
        let mut per_token = 0.0;
        for layer in 0..cfg.n_layers {
            per_token += 4.0 * d * d; // c_attn + c_proj
            per_token += match &cfg.moe {
                Some(m) if (layer + 1) % m.every_n_layers == 0 => {
                    let shared = if m.shared_expert { mlp } else { 0.0 };
                    m.top_k as f64 * mlp + shared + d * m.num_experts as f64
                }
                _ => mlp,
            };
        }
        per_token += d * cfg.vocab_size as f64; // output head
        let attention = 12.0 * cfg.n_layers as f64 * d * seq_len as f64;
        6.0 * per_token + attention
    }
}
