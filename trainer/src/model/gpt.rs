//! The decoder: embeddings → pre-norm blocks → final norm → (tied) output head.

use candle_core::{bail, Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::{maybe_dropout, Block, DropoutRng, Embedding, Linear, ModelOutput, Norm};
use crate::config::{Activation, FfnKind, LoraConfig, MixerKind, ModelConfig, PositionKind};

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
        let kinds = cfg.blocks();
        if kinds.len() != cfg.n_layers {
            // A pattern `Config::validate` refuses.
            bail!(
                "model.layer_pattern describes {} blocks, but model.n_layers is {}",
                kinds.len(),
                cfg.n_layers
            );
        }
        let h = kinds
            .into_iter()
            .enumerate()
            .map(|(i, kind)| Block::new(cfg, kind, i, vb.pp(format!("h.{i}"))))
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
        let mut x = self.embed(idx, dropout.as_deref_mut())?; // (B, T, D)
        let mut aux: Option<Tensor> = None;
        let mut stats = Vec::new();
        for block in self.blocks() {
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
        Ok(ModelOutput {
            logits: self.head(&x)?,
            aux_loss: aux,
            moe: stats,
        })
    }

    /// Token (and learned position) embeddings with embedding dropout: idx (B, T) → (B, T, D).
    pub(crate) fn embed(&self, idx: &Tensor, dropout: Option<&mut DropoutRng>) -> Result<Tensor> {
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
        maybe_dropout(&x, self.cfg.dropout, dropout)
    }

    /// The residual blocks in order. Everything between `embed` and `head` goes through here,
    /// so activation checkpointing (`model::recompute`) covers every kind of block.
    pub(crate) fn blocks(&self) -> &[Block] {
        &self.h
    }

    /// Embeddings of tokens at positions start, start + 1, ... (generation after a prefix):
    /// idx (B, T) → (B, T, D), no dropout.
    pub(crate) fn embed_from(&self, idx: &Tensor, start: usize) -> Result<Tensor> {
        let (_, t) = idx.dims2()?;
        if start + t > self.cfg.max_seq_len {
            bail!(
                "position {} exceeds model.max_seq_len {}",
                start + t,
                self.cfg.max_seq_len
            );
        }
        let x = self.wte.forward(idx)?; // (B, T, D)
        match &self.wpe {
            Some(wpe) => {
                let pos = Tensor::arange(start as u32, (start + t) as u32, idx.device())?;
                x.broadcast_add(&wpe.forward(&pos)?) // (B, T, D)
            }
            None => Ok(x),
        }
    }

    /// Final norm and output head: (B, T, D) → logits (B, T, V).
    pub(crate) fn head(&self, x: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(&self.ln_f.forward(x)?)
    }

    /// Training FLOPs per token: 6 per active matmul weight (forward + backward) plus the
    /// attention scores and mixing, 12·D·T per attention block (the PaLM / nanoGPT estimate
    /// used for MFU), plus each Mamba-2 block's scan (`mamba::flops_per_token`).
    pub fn flops_per_token(cfg: &ModelConfig, seq_len: usize) -> f64 {
        let d = cfg.d_model as f64;
        let ff = cfg.d_ff as f64;
        let mlp = match cfg.activation {
            Activation::Gelu => 2.0 * d * ff,
            Activation::Swiglu => 3.0 * d * ff,
        };
        let mut per_token = 0.0; // active matmul weights
        let mut mixing = 0.0; // training FLOPs that are not weight matmuls
        for block in cfg.blocks() {
            match block.mixer {
                Some(MixerKind::Attention) => {
                    per_token += 4.0 * d * d; // c_attn + c_proj
                    mixing += 12.0 * d * seq_len as f64;
                }
                Some(MixerKind::Mamba) => {
                    let (weights, scan) = super::mamba::flops_per_token(cfg, seq_len);
                    per_token += weights;
                    mixing += scan;
                }
                None => {}
            }
            per_token += match (block.mlp, &cfg.moe) {
                (Some(FfnKind::Moe), Some(m)) => {
                    let shared = if m.shared_expert { mlp } else { 0.0 };
                    m.top_k as f64 * mlp + shared + d * m.num_experts as f64
                }
                (Some(_), _) => mlp,
                (None, _) => 0.0,
            };
        }
        per_token += d * cfg.vocab_size as f64; // output head
        6.0 * per_token + mixing
    }
}
