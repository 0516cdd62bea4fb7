//! Direct Preference Optimization (Rafailov et al., 2023): `training.objective: dpo`.
//!
//! Each record of `data.dataset` (JSONL) is `{"prompt", "chosen", "rejected"}`. A sequence is
//! the prompt's tokens, then the completion's and the end-of-text token; its log-probability
//! log π(y|x) is summed over the completion's tokens only. With the frozen reference model's
//! log-probabilities beside them, the loss of a pair is
//! `-log σ(β·((log π(c) − log ref(c)) − (log π(r) − log ref(r))))`, and the implicit rewards are
//! `β·(log π − log ref)` of each completion.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, D};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use crate::data::{split, Document, SamplerState, TextTokenizer};
use crate::model::{DropoutRng, Gpt, TrainPass};

/// One preference record.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    pub prompt: String,
    pub chosen: String,
    pub rejected: String,
}

/// Reads the JSONL preference file and splits it by content hash (`data.val_fraction`), the
/// rule text documents follow.
pub fn load_pairs(path: &Path, val_fraction: f64) -> Result<(Vec<Pair>, Vec<Pair>)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("data.dataset: reading {}", path.display()))?;
    let mut docs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let origin = format!("{}:{}", path.display(), i + 1);
        let _: Pair = serde_json::from_str(line).with_context(|| {
            format!(
                "data.dataset: {origin}: expected {{\"prompt\", \"chosen\", \"rejected\"}} \
                 with a string each"
            )
        })?;
        docs.push(Document {
            origin,
            text: line.to_string(),
        });
    }
    if docs.len() < 2 {
        bail!(
            "data.dataset: {} holds {} preference pairs; DPO needs at least 2 (one to validate)",
            path.display(),
            docs.len()
        );
    }
    let (train, val) = split::split(docs, val_fraction)?;
    let parse = |docs: Vec<Document>| -> Result<Vec<Pair>> {
        docs.iter()
            .map(|d| Ok(serde_json::from_str(&d.text)?))
            .collect()
    };
    Ok((parse(train)?, parse(val)?))
}

/// Token ids of a batch of sequences: (N, T) inputs and targets, and (N, T) weights that are 1
/// where the target is a completion token.
pub struct SeqBatch {
    pub inputs: Tensor,
    pub targets: Tensor,
    pub mask: Tensor,
}

/// The chosen sequences of `pairs`, then their rejected ones, at most `seq_len` long: prompts are
/// cut from the left first (keeping one token), then completions from the right; rows are
/// padded with end-of-text under a zero weight.
pub fn encode(
    pairs: &[&Pair],
    tokenizer: &TextTokenizer,
    seq_len: usize,
    device: &Device,
) -> Result<SeqBatch> {
    let eot = tokenizer.eot_id();
    let mut rows: Vec<(Vec<u32>, usize)> = Vec::with_capacity(2 * pairs.len());
    for side in [true, false] {
        for pair in pairs {
            let mut prompt = tokenizer.encode(&pair.prompt)?;
            if prompt.is_empty() {
                prompt.push(eot);
            }
            let mut completion =
                tokenizer.encode(if side { &pair.chosen } else { &pair.rejected })?;
            completion.push(eot);
            let room = seq_len + 1; // inputs and targets overlap by all but one token
            let keep_prompt = prompt
                .len()
                .min(room.saturating_sub(completion.len()).max(1));
            let prompt = &prompt[prompt.len() - keep_prompt..];
            completion.truncate(room - keep_prompt);
            let mut ids = prompt.to_vec();
            ids.extend(completion);
            rows.push((ids, keep_prompt));
        }
    }
    let t = rows
        .iter()
        .map(|(ids, _)| ids.len() - 1)
        .max()
        .unwrap_or(1)
        .max(1);
    let n = rows.len();
    let (mut x, mut y, mut m) = (vec![eot; n * t], vec![eot; n * t], vec![0f32; n * t]);
    for (r, (ids, prompt_len)) in rows.iter().enumerate() {
        for i in 0..ids.len() - 1 {
            x[r * t + i] = ids[i];
            y[r * t + i] = ids[i + 1];
            // Target i is token i + 1: a completion token once i + 1 reaches the prompt's end.
            m[r * t + i] = if i + 1 >= *prompt_len { 1.0 } else { 0.0 };
        }
    }
    Ok(SeqBatch {
        inputs: Tensor::from_vec(x, (n, t), device)?,
        targets: Tensor::from_vec(y, (n, t), device)?,
        mask: Tensor::from_vec(m, (n, t), device)?,
    })
}

/// Σ over the masked positions of `log softmax(logits)[target]`: logits (N, T, V), targets (N, T)
/// u32, mask (N, T) → (N,). From differentiable primitives (the fused cross-entropy is a mean).
pub fn sequence_logps(logits: &Tensor, targets: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let logits = logits.to_dtype(DType::F32)?;
    let max = logits.max_keepdim(D::Minus1)?.detach(); // (N, T, 1)
    let z = logits.broadcast_sub(&max)?; // (N, T, V)
    let lse = z.exp()?.sum_keepdim(D::Minus1)?.log()?; // (N, T, 1)
    let picked = z.gather(&targets.unsqueeze(D::Minus1)?, D::Minus1)?; // (N, T, 1)
    let logp = (picked - lse)?.squeeze(D::Minus1)?; // (N, T)
    Ok((logp * mask)?.sum(D::Minus1)?) // (N,)
}

/// The DPO loss of a batch (scalar, differentiable through the policy's log-probabilities) and
/// its statistics. Each argument is (P,): summed completion log-probabilities per pair.
pub fn loss(
    policy_chosen: &Tensor,
    policy_rejected: &Tensor,
    ref_chosen: &Tensor,
    ref_rejected: &Tensor,
    beta: f64,
) -> Result<(Tensor, DpoStats)> {
    let chosen = (policy_chosen - ref_chosen)?.affine(beta, 0.0)?; // (P,) implicit rewards
    let rejected = (policy_rejected - ref_rejected)?.affine(beta, 0.0)?;
    let margin = (&chosen - &rejected)?;
    // -log σ(m) = softplus(-m) = max(-m, 0) + log(1 + exp(-|m|)), stable for any m.
    let neg = margin.neg()?;
    let softplus = (neg.relu()? + neg.abs()?.neg()?.exp()?.affine(1.0, 1.0)?.log()?)?;
    let loss = softplus.mean_all()?;
    let host = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.detach().to_dtype(DType::F32)?.to_vec1()?) };
    let (c, r) = (host(&chosen)?, host(&rejected)?);
    let p = c.len().max(1) as f64;
    let stats = DpoStats {
        loss: f64::from(loss.detach().to_dtype(DType::F32)?.to_scalar::<f32>()?),
        reward_accuracy: c.iter().zip(&r).filter(|(c, r)| c > r).count() as f64 / p,
        chosen_reward: c.iter().map(|&v| f64::from(v)).sum::<f64>() / p,
        rejected_reward: r.iter().map(|&v| f64::from(v)).sum::<f64>() / p,
    };
    Ok((loss, stats))
}

/// Batch means of the DPO quantities.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DpoStats {
    pub loss: f64,
    /// Share of pairs whose chosen reward exceeds the rejected one.
    pub reward_accuracy: f64,
    pub chosen_reward: f64,
    pub rejected_reward: f64,
}

impl DpoStats {
    /// Under `prefix` (`dpo/` or `val/dpo/`): loss, reward_accuracy, chosen_reward,
    /// rejected_reward and margin (chosen minus rejected).
    pub fn metrics(&self, prefix: &str, out: &mut BTreeMap<String, f64>) {
        out.insert(format!("{prefix}loss"), self.loss);
        out.insert(format!("{prefix}reward_accuracy"), self.reward_accuracy);
        out.insert(format!("{prefix}chosen_reward"), self.chosen_reward);
        out.insert(format!("{prefix}rejected_reward"), self.rejected_reward);
        out.insert(
            format!("{prefix}margin"),
            self.chosen_reward - self.rejected_reward,
        );
    }

    /// The weighted mean of several batches' statistics (weights: pairs per batch).
    pub fn mean(parts: &[(DpoStats, usize)]) -> DpoStats {
        let n = parts.iter().map(|(_, w)| *w).sum::<usize>().max(1) as f64;
        let avg =
            |f: fn(&DpoStats) -> f64| parts.iter().map(|(s, w)| f(s) * *w as f64).sum::<f64>() / n;
        DpoStats {
            loss: avg(|s| s.loss),
            reward_accuracy: avg(|s| s.reward_accuracy),
            chosen_reward: avg(|s| s.chosen_reward),
            rejected_reward: avg(|s| s.rejected_reward),
        }
    }
}

/// The data and frozen reference of a DPO run.
pub struct Preference {
    pub train: Vec<Pair>,
    pub val: Vec<Pair>,
    /// The reference model (weights shared with the policy's base under LoRA).
    pub reference: Gpt,
    pub beta: f64,
}

impl Preference {
    /// Indices of the next training batch, drawn from the sampler's seeded stream like text
    /// batches are, so a resumed run continues with the same pairs.
    pub fn next_indices(&self, state: &mut SamplerState, batch: usize) -> Vec<usize> {
        let mut rng = ChaCha8Rng::seed_from_u64(state.seed);
        rng.set_stream(state.batches);
        state.batches += 1;
        (0..batch)
            .map(|_| rng.random_range(0..self.train.len()))
            .collect()
    }

    /// The loss and statistics of `pairs` under `policy` (dropout when `rng` is given), and the
    /// policy's forward pass, whose `backward` takes the loss (with `checkpoint`, recomputing
    /// the blocks).
    pub fn batch_loss<'m>(
        &self,
        policy: &'m Gpt,
        pairs: &[&Pair],
        tokenizer: &TextTokenizer,
        seq_len: usize,
        rng: Option<&mut DropoutRng>,
        checkpoint: bool,
    ) -> Result<(Tensor, DpoStats, TrainPass<'m>)> {
        let dev = policy.device().clone();
        let b = encode(pairs, tokenizer, seq_len, &dev)?;
        let p = pairs.len();
        let pass = policy.forward_train(&b.inputs, rng, checkpoint)?;
        let logps = sequence_logps(&pass.output.logits, &b.targets, &b.mask)?; // (2P,)
        let reference = self.reference.forward_no_grad(&b.inputs)?;
        let ref_logps = sequence_logps(&reference.logits, &b.targets, &b.mask)?.detach();
        let (loss, stats) = loss(
            &logps.narrow(0, 0, p)?,
            &logps.narrow(0, p, p)?,
            &ref_logps.narrow(0, 0, p)?,
            &ref_logps.narrow(0, p, p)?,
            self.beta,
        )?;
        // MoE load-balancing losses keep the router healthy under preference tuning too.
        let loss = match &pass.output.aux_loss {
            Some(aux) => (loss + aux)?,
            None => loss,
        };
        Ok((loss, stats, pass))
    }

    /// Statistics over every validation pair, in batches of `batch` (no dropout).
    pub fn evaluate(
        &self,
        policy: &Gpt,
        tokenizer: &TextTokenizer,
        seq_len: usize,
        batch: usize,
    ) -> Result<DpoStats> {
        let mut parts = Vec::new();
        for chunk in self.val.chunks(batch.max(1)) {
            let pairs: Vec<&Pair> = chunk.iter().collect();
            let (_, stats, _) = self.batch_loss(policy, &pairs, tokenizer, seq_len, None, false)?;
            parts.push((stats, pairs.len()));
        }
        Ok(DpoStats::mean(&parts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loss_matches_a_hand_computed_value() {
        // Policy: p(chosen) = 3/4, p(rejected) = 1/4; reference: 1/2 for both. The margin is
        // β·((ln 3/4 − ln 1/2) − (ln 1/4 − ln 1/2)) = β·ln 3, so with β = 1 the loss is
        // −ln σ(ln 3) = −ln(3/4) = ln(4/3).
        let dev = Device::Cpu;
        let t = |v: f64| Tensor::new(&[v.ln() as f32], &dev).unwrap();
        let (l, stats) = loss(&t(0.75), &t(0.25), &t(0.5), &t(0.5), 1.0).unwrap();
        let got = f64::from(l.to_scalar::<f32>().unwrap());
        assert!((got - (4.0f64 / 3.0).ln()).abs() < 1e-6, "{got}");
        assert_eq!(stats.reward_accuracy, 1.0);
        assert!((stats.chosen_reward - 1.5f64.ln()).abs() < 1e-6);
        assert!((stats.rejected_reward - 0.5f64.ln()).abs() < 1e-6);
        // β = 0.5 halves the margin: −ln σ(ln √3) = ln(1 + 1/√3).
        let (l, _) = loss(&t(0.75), &t(0.25), &t(0.5), &t(0.5), 0.5).unwrap();
        let got = f64::from(l.to_scalar::<f32>().unwrap());
        assert!((got - (1.0 + 1.0 / 3f64.sqrt()).ln()).abs() < 1e-6, "{got}");
    }

    #[test]
    fn log_probabilities_are_summed_over_the_completion_tokens_only() {
        let dev = Device::Cpu;
        let pair = Pair {
            prompt: "ab".into(),
            chosen: "c".into(),
            rejected: "de".into(),
        };
        let b = encode(&[&pair], &TextTokenizer::Bytes, 16, &dev).unwrap();
        // chosen: a b c EOT → targets b c EOT, completion = c, EOT; rejected: a b d e EOT.
        let mask: Vec<Vec<f32>> = b.mask.to_vec2().unwrap();
        assert_eq!(mask[0], [0.0, 1.0, 1.0, 0.0]);
        assert_eq!(mask[1], [0.0, 1.0, 1.0, 1.0]);
        // Uniform logits over V = 256: every token has log-probability −ln 256.
        let logits = Tensor::zeros((2, 4, 256), DType::F32, &dev).unwrap();
        let logps: Vec<f32> = sequence_logps(&logits, &b.targets, &b.mask)
            .unwrap()
            .to_vec1()
            .unwrap();
        let per_token = -(256f32).ln();
        assert!((logps[0] - 2.0 * per_token).abs() < 1e-5, "{logps:?}");
        assert!((logps[1] - 3.0 * per_token).abs() < 1e-5, "{logps:?}");
    }

    #[test]
    fn long_pairs_lose_prompt_tokens_from_the_left_first() {
        let pair = Pair {
            prompt: "0123456789".into(),
            chosen: "abc".into(),
            rejected: "xyz".into(),
        };
        let b = encode(&[&pair], &TextTokenizer::Bytes, 6, &Device::Cpu).unwrap();
        let x: Vec<Vec<u32>> = b.inputs.to_vec2().unwrap();
        // 7 tokens fit: the prompt keeps its last 3 ("789"), the completion "abc" + EOT.
        assert_eq!(
            x[0],
            b"789abc".iter().map(|&c| u32::from(c)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_malformed_record_names_the_dataset_key_and_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prefs.jsonl");
        std::fs::write(&path, "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n{\"prompt\": \"a\", \"chosen\": \"b\"}\n").unwrap();
        let err = format!("{:#}", load_pairs(&path, 0.5).unwrap_err());
        assert!(
            err.starts_with("data.dataset:") && err.contains("prefs.jsonl:2"),
            "{err}"
        );
    }
}
