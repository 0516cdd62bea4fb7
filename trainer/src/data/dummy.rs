//! The `dummy` dataset: tokens from a fixed random Markov chain, for smoke tests.
//!
//! Every token has `SUCCESSORS.len()` possible next tokens with fixed probabilities, so the
//! entropy rate of the stream (the best loss any model can reach) is the entropy of those
//! probabilities, ~1.21 nats, far below the ln(vocab) ≈ 5.5 nats of guessing uniformly. A model
//! that learns the bigram table reaches it; a broken one stays near uniform.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{DataError, Result};

/// Probabilities of a token's successors, most likely first.
const SUCCESSORS: [f64; 4] = [0.5, 0.25, 0.15, 0.1];
/// Ids used: the raw-bytes range, so samples decode with the bytes tokenizer.
const MAX_DUMMY_VOCAB: usize = 256;
const TRAIN_TOKENS: usize = 1 << 18;
const VAL_TOKENS: usize = 1 << 15;

/// A seeded Markov chain over `vocab_size` ids.
#[derive(Debug, Clone)]
pub struct DummyData {
    seed: u64,
    vocab_size: usize,
    /// successors[t] = the ids that may follow t, in SUCCESSORS order.
    successors: Vec<[u32; SUCCESSORS.len()]>,
}

impl DummyData {
    /// The chain for a model with `model_vocab` ids (at most 256 are used).
    pub fn new(model_vocab: usize, seed: u64) -> Result<Self> {
        let vocab_size = model_vocab.min(MAX_DUMMY_VOCAB);
        if vocab_size < 2 * SUCCESSORS.len() {
            return Err(DataError::invalid(
                "model.vocab_size",
                format!(
                    "the dummy dataset needs at least {} ids, got {model_vocab}",
                    2 * SUCCESSORS.len()
                ),
            ));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let successors = (0..vocab_size)
            .map(|_| {
                let mut next = [0u32; SUCCESSORS.len()];
                for i in 0..next.len() {
                    // Distinct successors, so the probabilities above are the real ones.
                    next[i] = loop {
                        let candidate = rng.random_range(0..vocab_size as u32);
                        if !next[..i].contains(&candidate) {
                            break candidate;
                        }
                    };
                }
                next
            })
            .collect();
        Ok(DummyData {
            seed,
            vocab_size,
            successors,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Entropy rate of the chain in nats: the lowest achievable mean cross-entropy.
    pub fn entropy_rate(&self) -> f64 {
        SUCCESSORS.iter().map(|p| -p * p.ln()).sum()
    }

    /// Loss of a model that guesses uniformly over the vocabulary, ln(vocab).
    pub fn uniform_loss(&self) -> f64 {
        (self.vocab_size as f64).ln()
    }

    /// `len` tokens of the chain drawn from stream `stream` of the seed.
    pub fn generate(&self, len: usize, stream: u64) -> Vec<u32> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(stream);
        let mut token = rng.random_range(0..self.vocab_size as u32);
        let mut out = Vec::with_capacity(len);
        for _ in 0..len {
            out.push(token);
            let u: f64 = rng.random();
            let mut acc = 0.0;
            let mut pick = SUCCESSORS.len() - 1;
            for (i, p) in SUCCESSORS.iter().enumerate() {
                acc += p;
                if u < acc {
                    pick = i;
                    break;
                }
            }
            token = self.successors[token as usize][pick];
        }
        out
    }

    /// (train, validation) streams, independent draws from the same chain.
    pub fn splits(&self) -> (Vec<u32>, Vec<u32>) {
        (self.generate(TRAIN_TOKENS, 1), self.generate(VAL_TOKENS, 2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn the_chain_is_far_more_predictable_than_uniform() {
        let dummy = DummyData::new(256, 1337).unwrap();
        assert!(
            (dummy.entropy_rate() - 1.2080).abs() < 1e-3,
            "{}",
            dummy.entropy_rate()
        );
        assert!(dummy.entropy_rate() < dummy.uniform_loss() / 4.0);
    }

    #[test]
    fn the_empirical_bigram_entropy_matches_the_theoretical_rate() {
        let dummy = DummyData::new(64, 3).unwrap();
        let tokens = dummy.generate(200_000, 9);
        let mut pairs: HashMap<(u32, u32), f64> = HashMap::new();
        let mut firsts: HashMap<u32, f64> = HashMap::new();
        for w in tokens.windows(2) {
            *pairs.entry((w[0], w[1])).or_default() += 1.0;
            *firsts.entry(w[0]).or_default() += 1.0;
        }
        let n = (tokens.len() - 1) as f64;
        let conditional: f64 = pairs
            .iter()
            .map(|((a, _), c)| -(c / n) * (c / firsts[a]).ln())
            .sum();
        assert!(
            (conditional - dummy.entropy_rate()).abs() < 0.02,
            "{conditional}"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_data_and_another_seed_does_not() {
        let a = DummyData::new(256, 1).unwrap().splits();
        assert_eq!(a, DummyData::new(256, 1).unwrap().splits());
        assert_ne!(a.0, DummyData::new(256, 2).unwrap().splits().0);
        assert_ne!(
            a.0[..1000],
            a.1[..1000],
            "train and validation are separate draws"
        );
    }

    #[test]
    fn ids_stay_within_the_vocabulary() {
        for vocab in [8, 100, 256, 50_000] {
            let dummy = DummyData::new(vocab, 0).unwrap();
            let limit = vocab.min(256) as u32;
            assert!(
                dummy.generate(10_000, 0).iter().all(|&t| t < limit),
                "{vocab}"
            );
        }
        assert_eq!(DummyData::new(4, 0).unwrap_err().key(), "model.vocab_size");
    }
}
