//! The GPT decoder: embeddings, pre-norm blocks of causal attention and MLP (or
//! Mixture-of-Experts), tied output head. The layers here are the math; every op they call
//! (`crate::kernels`) picks a fused CPU kernel or candle's primitives by itself, and has a
//! backward pass: the finite-difference tests in `tests/gradcheck.rs` prove it.

mod attention;
mod block;
mod decode;
mod embedding;
mod gpt;
mod init;
mod linear;
pub mod lora;
pub mod mamba;
mod mlp;
pub mod moe;
mod norm;
mod recompute;

use candle_core::{Result, Tensor};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The training objective: mean next-token cross-entropy of (B, T, V) logits.
pub use crate::kernels::cross_entropy;
pub use attention::CausalSelfAttention;
pub use block::{Block, MixerCache};
pub use decode::DecodeState;
pub use embedding::Embedding;
pub use gpt::Gpt;
pub use init::{init_weights, is_decayed, num_params};
pub use linear::Linear;
pub use mlp::Mlp;
pub use moe::{MoeLayer, MoeLayerStats};
pub use norm::Norm;
pub use recompute::TrainPass;

/// What one forward pass produces.
#[derive(Debug, Clone)]
pub struct ModelOutput {
    /// (B, T, V), the model's dtype (f32 in training).
    pub logits: Tensor,
    /// Sum over MoE layers of the weighted load-balancing and z losses (scalar); None for a
    /// dense model. Add it to the language-model loss before `backward`.
    pub aux_loss: Option<Tensor>,
    /// Per MoE layer routing statistics for telemetry (empty for a dense model).
    pub moe: Vec<MoeLayerStats>,
}

/// Seeded, serializable randomness for training-time noise (dropout masks, router jitter).
/// Its state goes into checkpoints so a resumed run draws the same masks as a straight one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DropoutRng {
    rng: ChaCha8Rng,
}

impl DropoutRng {
    pub fn new(seed: u64) -> Self {
        DropoutRng {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Inverted dropout: zeroes each element with probability `p`, scales survivors by
    /// 1/(1-p). Masks are drawn on the host so they are identical on every device.
    pub fn dropout(&mut self, x: &Tensor, p: f64) -> Result<Tensor> {
        if p <= 0.0 {
            return Ok(x.clone());
        }
        let keep = 1.0 / (1.0 - p) as f32;
        let mask: Vec<f32> = (0..x.elem_count())
            .map(|_| {
                if self.rng.random::<f64>() < p {
                    0.0
                } else {
                    keep
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
        x * mask
    }

    /// Uniform noise in [1 - eps, 1 + eps] with the shape of `x` (Switch router jitter).
    pub fn jitter(&mut self, x: &Tensor, eps: f64) -> Result<Tensor> {
        let noise: Vec<f32> = (0..x.elem_count())
            .map(|_| (1.0 - eps + 2.0 * eps * self.rng.random::<f64>()) as f32)
            .collect();
        let noise = Tensor::from_vec(noise, x.shape(), x.device())?.to_dtype(x.dtype())?;
        x * noise
    }
}

/// Applies dropout when training (an rng is given) and `p > 0`.
pub(crate) fn maybe_dropout(x: &Tensor, p: f64, rng: Option<&mut DropoutRng>) -> Result<Tensor> {
    match rng {
        Some(rng) if p > 0.0 => rng.dropout(x, p),
        _ => Ok(x.clone()),
    }
}
