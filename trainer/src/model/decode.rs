//! Generation with carried state: a prompt runs once through the model (`prefill`), then each
//! new token is one step (`decode_step`) in which Mamba-2 mixers advance their recurrence by
//! one token instead of rescanning the sequence. Attention mixers attend over the inputs they
//! have seen (recomputed: there is no key/value cache yet), so a step of a hybrid costs its
//! attention blocks what a full forward would and its Mamba blocks O(1) in the length.

use candle_core::{IndexOp, Result, Tensor};

use super::{Gpt, MixerCache};

/// What the model carries between generation steps.
#[derive(Debug, Clone)]
pub struct DecodeState {
    /// Per block, what its mixer keeps (None for an MLP-only block).
    caches: Vec<Option<MixerCache>>,
    /// Tokens seen so far: the position of the next one.
    len: usize,
}

impl DecodeState {
    /// Tokens the state has taken in.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token has been taken in.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Gpt {
    /// Runs the prompt idx (B, T) in evaluation mode; returns the logits of its last position
    /// (B, V) and the state to continue from.
    pub fn prefill(&self, idx: &Tensor) -> Result<(Tensor, DecodeState)> {
        let mut state = DecodeState {
            caches: vec![None; self.blocks().len()],
            len: 0,
        };
        let logits = self.advance(idx, &mut state)?;
        Ok((logits, state))
    }

    /// One more token per sequence, tokens (B,) u32, after `state`; returns its logits (B, V).
    pub fn decode_step(&self, tokens: &Tensor, state: &mut DecodeState) -> Result<Tensor> {
        self.advance(&tokens.unsqueeze(1)?, state)
    }

    /// idx (B, T) after the state's tokens → logits (B, V) of the last new position.
    fn advance(&self, idx: &Tensor, state: &mut DecodeState) -> Result<Tensor> {
        let (_, t) = idx.dims2()?;
        let mut x = self.embed_from(idx, state.len)?; // (B, T, D)
        for (block, cache) in self.blocks().iter().zip(state.caches.iter_mut()) {
            x = block.forward_cached(&x, cache)?;
        }
        state.len += t;
        let last = x.i((.., t - 1..t, ..))?; // (B, 1, D)
        self.head(&last)?.squeeze(1) // (B, V)
    }
}
