//! Batches of (input, target) windows cut from a packed token stream.
//!
//! Training batches are random windows (like nanoGPT's `get_batch`), drawn from a ChaCha stream
//! chosen by the batch's index: batch `n` depends only on the seed and `n`, so the sampler's whole
//! state is two integers and a resumed run draws exactly the batches it would have drawn.
//! Validation batches are evenly spaced windows, the same at every evaluation.

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{DataError, Result, TokenSplit};

/// `batch_size` rows of `seq_len` inputs and the same windows shifted by one as targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub batch_size: usize,
    pub seq_len: usize,
    /// Row-major (batch_size, seq_len) input ids.
    pub x: Vec<u32>,
    /// Row-major (batch_size, seq_len) target ids: x shifted left by one.
    pub y: Vec<u32>,
}

impl Batch {
    /// (x, y) as u32 tensors of shape (batch_size, seq_len) on `device`.
    pub fn to_tensors(&self, device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
        let shape = (self.batch_size, self.seq_len);
        let x = Tensor::from_slice(&self.x, shape, device)?; // (B, T)
        let y = Tensor::from_slice(&self.y, shape, device)?; // (B, T)
        Ok((x, y))
    }

    fn from_starts(split: &TokenSplit, starts: &[usize], seq_len: usize) -> Self {
        let mut x = Vec::with_capacity(starts.len() * seq_len);
        let mut y = Vec::with_capacity(starts.len() * seq_len);
        let mut window = vec![0u32; seq_len + 1];
        for &start in starts {
            split.copy_window(start, &mut window);
            x.extend_from_slice(&window[..seq_len]);
            y.extend_from_slice(&window[1..]);
        }
        Batch {
            batch_size: starts.len(),
            seq_len,
            x,
            y,
        }
    }
}

/// Where a sampler is: saved in checkpoints, restored on resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    pub seed: u64,
    /// Batches drawn so far.
    pub batches: u64,
}

/// Draws training batches deterministically from a seed.
#[derive(Debug, Clone)]
pub struct BatchSampler {
    batch_size: usize,
    seq_len: usize,
    state: SamplerState,
}

impl BatchSampler {
    pub fn new(batch_size: usize, seq_len: usize, seed: u64) -> Self {
        Self::from_state(batch_size, seq_len, SamplerState { seed, batches: 0 })
    }

    /// Continues where a saved sampler stopped.
    pub fn from_state(batch_size: usize, seq_len: usize, state: SamplerState) -> Self {
        BatchSampler {
            batch_size,
            seq_len,
            state,
        }
    }

    pub fn state(&self) -> SamplerState {
        self.state
    }

    /// Changes the length of the windows drawn from now on (the sequence-length curriculum).
    pub fn set_seq_len(&mut self, seq_len: usize) {
        self.seq_len = seq_len;
    }

    /// The next batch of random windows from `split`.
    pub fn next_batch(&mut self, split: &TokenSplit) -> Result<Batch> {
        let last_start = last_start(split, self.seq_len, "training")?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.state.seed);
        rng.set_stream(self.state.batches);
        let starts: Vec<usize> = (0..self.batch_size)
            .map(|_| rng.random_range(0..=last_start))
            .collect();
        self.state.batches += 1;
        Ok(Batch::from_starts(split, &starts, self.seq_len))
    }
}

/// `n_batches` fixed validation batches: windows spread evenly over the whole split.
pub fn eval_batches(
    split: &TokenSplit,
    batch_size: usize,
    seq_len: usize,
    n_batches: usize,
) -> Result<Vec<Batch>> {
    let last_start = last_start(split, seq_len, "validation")?;
    let windows = n_batches * batch_size;
    let starts: Vec<usize> = (0..windows)
        .map(|i| {
            if windows <= 1 {
                0
            } else {
                i * last_start / (windows - 1)
            }
        })
        .collect();
    Ok(starts
        .chunks(batch_size.max(1))
        .map(|chunk| Batch::from_starts(split, chunk, seq_len))
        .collect())
}

/// The last valid window start, or an error when the split cannot hold one window.
fn last_start(split: &TokenSplit, seq_len: usize, which: &str) -> Result<usize> {
    let needed = seq_len + 1;
    if seq_len == 0 || split.len() < needed {
        return Err(DataError::invalid(
            "training.seq_len",
            format!(
                "the {which} split has {} tokens but one window needs seq_len + 1 = {needed}; \
                 lower training.seq_len or add data (or raise data.val_fraction)",
                split.len()
            ),
        ));
    }
    Ok(split.len() - needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(n: u32) -> TokenSplit {
        TokenSplit::from_vec((0..n).collect())
    }

    #[test]
    fn targets_are_inputs_shifted_by_one() {
        let data = split(1000);
        let batch = BatchSampler::new(4, 16, 7).next_batch(&data).unwrap();
        assert_eq!(batch.x.len(), 4 * 16);
        for row in 0..4 {
            let x = &batch.x[row * 16..(row + 1) * 16];
            let y = &batch.y[row * 16..(row + 1) * 16];
            assert!(x.iter().zip(y).all(|(a, b)| a + 1 == *b));
            assert!(*y.last().unwrap() < 1000);
        }
    }

    #[test]
    fn a_restored_sampler_continues_with_the_same_batches() {
        let data = split(5000);
        let mut straight = BatchSampler::new(8, 32, 1337);
        let expected: Vec<Batch> = (0..10)
            .map(|_| straight.next_batch(&data).unwrap())
            .collect();

        let mut first = BatchSampler::new(8, 32, 1337);
        let mut got: Vec<Batch> = (0..5).map(|_| first.next_batch(&data).unwrap()).collect();
        let saved = serde_json::to_string(&first.state()).unwrap();
        let state: SamplerState = serde_json::from_str(&saved).unwrap();
        let mut resumed = BatchSampler::from_state(8, 32, state);
        got.extend((0..5).map(|_| resumed.next_batch(&data).unwrap()));

        assert_eq!(got, expected);
        assert_ne!(expected[0], expected[1], "batches differ from step to step");
    }

    #[test]
    fn different_seeds_draw_different_batches() {
        let data = split(5000);
        let a = BatchSampler::new(8, 32, 1).next_batch(&data).unwrap();
        let b = BatchSampler::new(8, 32, 2).next_batch(&data).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn validation_batches_are_the_same_every_time_and_cover_the_split() {
        let data = split(10_000);
        let first = eval_batches(&data, 4, 16, 5).unwrap();
        assert_eq!(first, eval_batches(&data, 4, 16, 5).unwrap());
        assert_eq!(first.len(), 5);
        assert_eq!(first[0].x[0], 0, "starts at the beginning");
        let last = first.last().unwrap();
        assert_eq!(*last.y.last().unwrap(), 9_999, "ends at the end");
    }

    #[test]
    fn a_split_shorter_than_one_window_names_seq_len() {
        let data = split(16);
        let cases = [
            BatchSampler::new(2, 16, 0).next_batch(&data).map(|_| ()),
            eval_batches(&data, 2, 16, 1).map(|_| ()),
        ];
        for result in cases {
            let err = result.unwrap_err();
            assert_eq!(err.key(), "training.seq_len");
            assert!(err.to_string().contains("16 tokens"), "{err}");
        }
        assert!(
            BatchSampler::new(2, 15, 0).next_batch(&data).is_ok(),
            "exactly one window fits"
        );
    }

    #[test]
    fn a_shorter_seq_len_draws_shorter_windows_from_the_same_stream() {
        let data = split(1000);
        let mut sampler = BatchSampler::new(2, 32, 5);
        sampler.set_seq_len(8);
        let short = sampler.next_batch(&data).unwrap();
        assert_eq!((short.seq_len, short.x.len()), (8, 16));
        sampler.set_seq_len(32);
        let long = sampler.next_batch(&data).unwrap();
        assert_eq!((long.seq_len, long.x.len()), (32, 64));
        assert_eq!(
            sampler.state().batches,
            2,
            "every batch counts, whatever its length"
        );
    }

    #[test]
    fn batches_become_tensors_of_the_right_shape() {
        let batch = BatchSampler::new(3, 5, 0).next_batch(&split(100)).unwrap();
        let (x, y) = batch.to_tensors(&Device::Cpu).unwrap();
        assert_eq!(x.dims(), [3, 5]);
        assert_eq!(y.to_vec2::<u32>().unwrap()[2], batch.y[10..15]);
    }
}
