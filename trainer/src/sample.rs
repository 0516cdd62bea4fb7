//! Text generation from a checkpoint: temperature, top-k and nucleus (top-p) sampling. Models
//! with Mamba-2 layers generate with carried state (`Gpt::prefill`, `Gpt::decode_step`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::{VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint;
use crate::config::Config;
use crate::data::TextTokenizer;
use crate::model::{DecodeState, Gpt};

/// How to pick each next token.
#[derive(Debug, Clone, Copy)]
pub struct SamplingParams {
    /// 0 = greedy (argmax).
    pub temperature: f64,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1.0 = all).
    pub top_p: f64,
}

/// What generated text shows where the model ended a document (its end-of-text token): a
/// visible break, never the token itself (`<|endoftext|>`, or a NUL byte for raw bytes).
pub const DOCUMENT_BREAK: &str = "\n\n--- end of text ---\n\n";

/// A model loaded from a checkpoint with its config and tokenizer.
pub struct LoadedModel {
    pub config: Config,
    pub tokenizer: TextTokenizer,
    pub model: Gpt,
    /// The model's variables (base weights and, for a LoRA checkpoint, adapters).
    pub varmap: VarMap,
    pub device: Device,
    /// The checkpoint directory the weights came from.
    pub dir: PathBuf,
    /// The optimizer steps its weights had been trained for.
    pub step: u64,
}

/// Loads a checkpoint directory, or a run directory (its `best` checkpoint, else its latest).
/// A LoRA checkpoint loads its base weights and then its adapters.
pub fn load(path: &Path, device: Device) -> Result<LoadedModel> {
    let dir = checkpoint::resolve_for_reading(path)
        .with_context(|| format!("--checkpoint {}", path.display()))?;
    let step = checkpoint::read_state(&dir)?.step;
    let config = checkpoint::read_config(&dir)?;
    let tokenizer = TextTokenizer::load(&dir.join(checkpoint::TOKENIZER_FILE))?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let model = match &config.training.lora {
        Some(lora) => Gpt::with_adapters(&config.model, lora, vb)?,
        None => Gpt::new(&config.model, vb)?,
    };
    checkpoint::load_model(&dir, &config, &varmap, &device)?;
    Ok(LoadedModel {
        config,
        tokenizer,
        model,
        varmap,
        device,
        dir,
        step,
    })
}

impl LoadedModel {
    /// Continues `prompt` by up to `max_new_tokens` tokens; returns only the new text.
    pub fn generate(
        &self,
        prompt: &str,
        max_new_tokens: usize,
        params: SamplingParams,
        seed: u64,
    ) -> Result<String> {
        let mut ids = self.tokenizer.encode(prompt)?;
        if ids.is_empty() {
            // An empty prompt starts from the end-of-text separator, as between documents.
            ids.push(self.tokenizer.eot_id());
        }
        let prompt_len = ids.len();
        let context = self.config.model.max_seq_len;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        if self.config.model.has_mamba() {
            self.extend_recurrent(&mut ids, max_new_tokens, params, &mut rng)?;
            return render(&self.tokenizer, &ids[prompt_len..]);
        }
        for _ in 0..max_new_tokens {
            let start = ids.len().saturating_sub(context);
            let window = &ids[start..];
            let x = Tensor::new(window, &self.device)?.unsqueeze(0)?; // (1, T)
            let out = self.model.forward(&x, None)?;
            let last = out.logits.i((0, window.len() - 1))?; // (V,)
            let logits: Vec<f32> = last.to_dtype(DType::F32)?.to_vec1()?;
            let next = sample_next(&logits, params, &mut rng)?;
            ids.push(next);
        }
        render(&self.tokenizer, &ids[prompt_len..])
    }

    /// Appends `n` sampled tokens to `ids` with carried state: the prompt runs once, then each
    /// token is one step (the Mamba-2 recurrence). Each token sees at most the last
    /// model.max_seq_len tokens, as the windowed path does: when the window is full the state
    /// restarts from its last max_seq_len tokens.
    fn extend_recurrent(
        &self,
        ids: &mut Vec<u32>,
        n: usize,
        params: SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> Result<()> {
        let context = self.config.model.max_seq_len;
        let mut state: Option<DecodeState> = None;
        for _ in 0..n {
            let logits = match state.as_mut() {
                Some(s) if s.len() < context => {
                    let last = Tensor::new(&ids[ids.len() - 1..], &self.device)?; // (1,)
                    self.model.decode_step(&last, s)?
                }
                _ => {
                    let window = &ids[ids.len().saturating_sub(context)..];
                    let x = Tensor::new(window, &self.device)?.unsqueeze(0)?; // (1, T)
                    let (logits, s) = self.model.prefill(&x)?;
                    state = Some(s);
                    logits
                }
            }; // (1, V)
            let logits: Vec<f32> = logits.i(0)?.to_dtype(DType::F32)?.to_vec1()?;
            ids.push(sample_next(&logits, params, rng)?);
        }
        Ok(())
    }

    /// `loaded checkpoint DIR (step N)`: what `sample` says before the text.
    pub fn describe(&self) -> String {
        format!(
            "loaded checkpoint {} (step {})",
            self.dir.display(),
            self.step
        )
    }
}

/// Decodes generated ids, with [`DOCUMENT_BREAK`] wherever the model emitted end-of-text.
pub fn render(tokenizer: &TextTokenizer, ids: &[u32]) -> Result<String> {
    let eot = tokenizer.eot_id();
    let parts = ids
        .split(|&id| id == eot)
        .map(|part| tokenizer.decode(part))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(parts.join(DOCUMENT_BREAK))
}

/// Draws one token id from `logits` (one row of the vocabulary).
pub fn sample_next(logits: &[f32], p: SamplingParams, rng: &mut impl Rng) -> Result<u32> {
    if logits.is_empty() {
        bail!("empty logits");
    }
    if p.temperature <= 0.0 {
        return Ok(argmax(logits));
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if p.top_k > 0 {
        order.truncate(p.top_k);
    }
    let max = f64::from(logits[order[0]]);
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(logits[i]) - max) / p.temperature).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|q| *q /= total);
    if p.top_p < 1.0 {
        let mut cum = 0.0;
        let keep = probs
            .iter()
            .position(|q| {
                cum += q;
                cum >= p.top_p
            })
            .map_or(probs.len(), |i| i + 1);
        probs.truncate(keep);
        order.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    let mut r = rng.random::<f64>() * total;
    for (q, &i) in probs.iter().zip(&order) {
        if r < *q {
            return Ok(i as u32);
        }
        r -= q;
    }
    Ok(order[order.len() - 1] as u32)
}

fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in xs.iter().enumerate() {
        if *x > xs[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f64, top_k: usize, top_p: f64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
        }
    }

    #[test]
    fn end_of_text_is_rendered_as_a_document_break_not_as_the_token() {
        let bytes = TextTokenizer::Bytes;
        let ids: Vec<u32> = b"ab\0cd\0".iter().map(|&b| u32::from(b)).collect();
        assert_eq!(
            render(&bytes, &ids).unwrap(),
            format!("ab{DOCUMENT_BREAK}cd{DOCUMENT_BREAK}")
        );
        let texts = ["the cat sat on the mat", "a dog ran in the park"].repeat(20);
        let bpe = TextTokenizer::train_bpe_on(&texts, 300).unwrap();
        let mut ids = bpe.encode("the cat").unwrap();
        ids.push(bpe.eot_id());
        ids.extend(bpe.encode("a dog").unwrap());
        let text = render(&bpe, &ids).unwrap();
        assert_eq!(text, format!("the cat{DOCUMENT_BREAK}a dog"));
        assert!(!text.contains(crate::data::EOT_TOKEN));
    }

    #[test]
    fn zero_temperature_is_greedy() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let got = sample_next(&[0.1, 3.0, 2.9], params(0.0, 0, 1.0), &mut rng).unwrap();
        assert_eq!(got, 1);
    }

    #[test]
    fn top_k_never_picks_outside_the_k_best() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let logits = [1.0, 0.9, 5.0, 4.9, 0.8];
        for _ in 0..200 {
            let t = sample_next(&logits, params(5.0, 2, 1.0), &mut rng).unwrap();
            assert!(t == 2 || t == 3, "{t}");
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        // Probabilities ≈ [0.84, 0.11, 0.04, ...]: p = 0.9 keeps the first two.
        let logits = [4.0, 2.0, 1.0, 0.0, -1.0];
        let mut seen = [0usize; 5];
        for _ in 0..500 {
            seen[sample_next(&logits, params(1.0, 0, 0.9), &mut rng).unwrap() as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        assert_eq!(seen[2] + seen[3] + seen[4], 0, "{seen:?}");
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let logits = [0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75]
        let n = 4000;
        let ones = (0..n)
            .filter(|_| sample_next(&logits, params(1.0, 0, 1.0), &mut rng).unwrap() == 1)
            .count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.03, "{frac}");
    }
}
