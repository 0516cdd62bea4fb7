//! One residual block: x + mixer(ln_1(x)), then x + mlp(ln_2(x)). The mixer is causal
//! self-attention or Mamba-2, the MLP dense or Mixture-of-Experts, and a block of a hybrid
//! stack may have only one of the two (`model.layer_pattern`, config/pattern.rs).

use candle_core::{Module, Result, Tensor, D};
use candle_nn::VarBuilder;

use super::mamba::{Mamba2, MambaState, Scan};
use super::{maybe_dropout, CausalSelfAttention, DropoutRng, Mlp, MoeLayer, MoeLayerStats, Norm};
use crate::config::{BlockKind, FfnKind, LoraConfig, LoraTarget, MixerKind, ModelConfig};
use crate::kernels;
use crate::profile::LayerTimer;

#[derive(Debug, Clone)]
enum Mixer {
    /// Parameters under `attn`.
    Attention(CausalSelfAttention),
    /// Parameters under `mamba`.
    Mamba(Mamba2),
}

#[derive(Debug, Clone)]
enum FeedForward {
    Dense(Mlp),
    Moe(MoeLayer),
}

/// What generation keeps of a block's mixer between calls (`Gpt::prefill`, `Gpt::decode_step`).
#[derive(Debug, Clone)]
pub enum MixerCache {
    /// The normalised inputs the attention has seen (B, t, D): each new token attends over
    /// them again (there is no key/value cache yet).
    Attention(Tensor),
    /// The convolution inputs and the SSM state: each new token is one recurrence step.
    Mamba(MambaState),
}

#[derive(Debug, Clone)]
pub struct Block {
    /// The pre-norm `ln_1` and the mixer; None in an MLP-only block.
    mixer: Option<(Norm, Mixer)>,
    /// The pre-norm `ln_2` and the MLP (`mlp`); None in a mixer-only block.
    mlp: Option<(Norm, FeedForward)>,
    dropout: f64,
}

/// A norm's step followed by a sublayer's, when both have fused forms.
fn branch(
    norm: Option<Box<dyn kernels::Step>>,
    sublayer: Option<Vec<Box<dyn kernels::Step>>>,
) -> Option<Vec<Box<dyn kernels::Step>>> {
    let mut steps = vec![norm?];
    steps.extend(sublayer?);
    Some(steps)
}

impl Block {
    /// Block `layer` of the stack `cfg` describes, of kind `kind` (`ModelConfig::blocks`).
    pub fn new(cfg: &ModelConfig, kind: BlockKind, layer: usize, vb: VarBuilder) -> Result<Self> {
        let mixer = match kind.mixer {
            Some(MixerKind::Attention) => Some(Mixer::Attention(CausalSelfAttention::new(
                cfg,
                vb.pp("attn"),
            )?)),
            Some(MixerKind::Mamba) => Some(Mixer::Mamba(Mamba2::new(cfg, vb.pp("mamba"))?)),
            None => None,
        };
        let mlp = match (kind.mlp, &cfg.moe) {
            (Some(FfnKind::Moe), Some(moe)) => Some(FeedForward::Moe(MoeLayer::new(
                cfg,
                moe,
                layer,
                vb.pp("mlp"),
            )?)),
            (Some(FfnKind::Moe), None) => {
                candle_core::bail!("block {layer} is MoE without model.moe")
            }
            (Some(FfnKind::Dense), _) => Some(FeedForward::Dense(Mlp::new(cfg, vb.pp("mlp"))?)),
            (None, _) => None,
        };
        Ok(Block {
            mixer: match mixer {
                Some(m) => Some((Norm::new(cfg, vb.pp("ln_1"))?, m)),
                None => None,
            },
            mlp: match mlp {
                Some(m) => Some((Norm::new(cfg, vb.pp("ln_2"))?, m)),
                None => None,
            },
            dropout: cfg.dropout,
        })
    }

    /// LoRA adapters on the projections `lora.targets` names; `vb` is the block's path.
    /// Mamba-2 mixers get none (no target names them).
    pub fn adapt(&mut self, lora: &LoraConfig, vb: &VarBuilder) -> Result<()> {
        if let Some((_, Mixer::Attention(attn))) = &mut self.mixer {
            attn.adapt(lora, &vb.pp("attn"))?;
        }
        match &mut self.mlp {
            Some((_, FeedForward::Dense(mlp))) => mlp.adapt(
                lora,
                lora.adapts(LoraTarget::MlpIn),
                lora.adapts(LoraTarget::MlpOut),
                &vb.pp("mlp"),
            ),
            Some((_, FeedForward::Moe(moe))) => moe.adapt(lora, &vb.pp("mlp")),
            None => Ok(()),
        }
    }

    /// The same block without adapters (sharing the weights).
    pub fn without_adapters(&self) -> Self {
        Block {
            mixer: self.mixer.as_ref().map(|(ln, m)| {
                let m = match m {
                    Mixer::Attention(attn) => Mixer::Attention(attn.without_adapters()),
                    Mixer::Mamba(mamba) => Mixer::Mamba(mamba.clone()),
                };
                (ln.clone(), m)
            }),
            mlp: self.mlp.as_ref().map(|(ln, f)| {
                let f = match f {
                    FeedForward::Dense(mlp) => FeedForward::Dense(mlp.without_adapters()),
                    FeedForward::Moe(moe) => FeedForward::Moe(moe.without_adapters()),
                };
                (ln.clone(), f)
            }),
            dropout: self.dropout,
        }
    }

    /// The block's mixer as a word for per-layer-type accounting: `attention`, `mamba` or
    /// `mlp` (an MLP-only block).
    pub fn kind_name(&self) -> &'static str {
        match &self.mixer {
            Some((_, Mixer::Attention(_))) => "attention",
            Some((_, Mixer::Mamba(_))) => "mamba",
            None => "mlp",
        }
    }

    /// x (B, T, D) → (B, T, D), plus the MoE layer's weighted aux loss and stats.
    pub fn forward(
        &self,
        x: &Tensor,
        rng: Option<&mut DropoutRng>,
    ) -> Result<(Tensor, Option<(Tensor, MoeLayerStats)>)> {
        let timer = LayerTimer::start(x.device(), self.kind_name())?;
        let out = self.forward_inner(x, rng)?;
        timer.stop()?;
        Ok(out)
    }

    fn forward_inner(
        &self,
        x: &Tensor,
        mut rng: Option<&mut DropoutRng>,
    ) -> Result<(Tensor, Option<(Tensor, MoeLayerStats)>)> {
        let mut x = x.clone();
        // Without dropout, a half whose ops all have fused CPU forms is one op (see
        // `kernels::residual`): the same values, fewer gradient buffers.
        let fused = kernels::use_fused(&x)
            && !kernels::autocast::is_active()
            && !(rng.is_some() && self.dropout > 0.0);
        let mixer_steps = match &self.mixer {
            Some((ln_1, Mixer::Attention(attn))) if fused => branch(ln_1.step()?, attn.steps()?),
            _ => None,
        };
        if let Some(steps) = mixer_steps {
            x = kernels::residual(&x, steps)?;
        } else if let Some((ln_1, mixer)) = &self.mixer {
            let h = ln_1.forward(&x)?;
            let a = match mixer {
                Mixer::Attention(attn) => attn.forward(&h, rng.as_deref_mut())?,
                Mixer::Mamba(mamba) => mamba.forward(&h)?,
            };
            x = (x + maybe_dropout(&a, self.dropout, rng.as_deref_mut())?)?;
        }
        let Some((ln_2, mlp)) = &self.mlp else {
            return Ok((x, None));
        };
        if let (FeedForward::Dense(dense), true) = (mlp, fused) {
            let rows = x.elem_count() / x.dim(D::Minus1)?.max(1);
            let step = dense.step(rows)?.map(|s| vec![s]);
            if let Some(steps) = branch(ln_2.step()?, step) {
                return Ok((kernels::residual(&x, steps)?, None));
            }
        }
        let h = ln_2.forward(&x)?;
        let (m, moe) = match mlp {
            FeedForward::Dense(mlp) => (mlp.forward_t(&h, rng.as_deref_mut())?, None),
            FeedForward::Moe(moe) => {
                let out = moe.forward(&h, rng.as_deref_mut())?;
                (out.y, Some((out.aux_loss, out.stats)))
            }
        };
        let x = (x + maybe_dropout(&m, self.dropout, rng)?)?;
        Ok((x, moe))
    }

    /// Evaluation forward of new tokens x (B, T, D) after those `cache` holds (none when it
    /// is None), updating it: a prompt runs the chunked scan, a single token the recurrence.
    pub fn forward_cached(&self, x: &Tensor, cache: &mut Option<MixerCache>) -> Result<Tensor> {
        let mut x = x.clone();
        if let Some((ln_1, mixer)) = &self.mixer {
            let h = ln_1.forward(&x)?; // (B, T, D)
            let t = h.dim(1)?;
            let a = match (mixer, cache.take()) {
                (Mixer::Attention(attn), seen) => {
                    let all = match seen {
                        Some(MixerCache::Attention(prev)) => Tensor::cat(&[&prev, &h], 1)?,
                        _ => h,
                    };
                    let len = all.dim(1)?;
                    let y = attn.forward(&all, None)?.narrow(1, len - t, t)?;
                    *cache = Some(MixerCache::Attention(all));
                    y
                }
                (Mixer::Mamba(mamba), seen) => {
                    let state = match seen {
                        Some(MixerCache::Mamba(s)) => Some(s),
                        _ => None,
                    };
                    let scan = if t == 1 {
                        Scan::Recurrent
                    } else {
                        Scan::Chunked
                    };
                    let (y, next) = mamba.forward_with_state(&h, state.as_ref(), scan)?;
                    *cache = Some(MixerCache::Mamba(next));
                    y
                }
            };
            x = (x + a)?;
        }
        if let Some((ln_2, mlp)) = &self.mlp {
            let h = ln_2.forward(&x)?;
            let m = match mlp {
                FeedForward::Dense(mlp) => mlp.forward(&h)?,
                FeedForward::Moe(moe) => moe.forward(&h, None)?.y,
            };
            x = (x + m)?;
        }
        Ok(x)
    }
}
