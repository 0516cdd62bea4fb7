//! What a fine-tuning run adds to [`Trainer`]: the starting weights (`training.init_from`, a
//! checkpoint or `hf:PATH`), LoRA adapters over frozen base weights, and the DPO objective.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};

use super::dpo::{self, Pair, Preference};
use super::{dropout_seed_for, StepStats, Trainer};
use crate::checkpoint;
use crate::config::{Config, Objective};
use crate::data::{DataStats, FilterStats, PreparedData, TextTokenizer, TokenSplit};
use crate::hf;
use crate::model::{self, lora, DropoutRng, Gpt};
use crate::optim::{self, clip_grad_norm, lr_at, Param};

/// Resolves `training.init_from` to an absolute checkpoint directory or `hf:` directory and
/// the tokenizer that comes with it; for `hf:PATH` the checkpoint's shape replaces `model.*`
/// (settings it does not fix, such as dropout, stay). Errors name the key.
pub fn resolve_init_from(cfg: &mut Config) -> Result<Option<(String, PathBuf)>> {
    let Some(spec) = cfg.training.init_from.clone() else {
        return Ok(None);
    };
    let resolved = match hf::import::hf_path(&spec) {
        Some(dir) => {
            let dir = std::path::absolute(&dir).context("training.init_from")?;
            let (_, model) =
                hf::import::model_config(&dir, &cfg.model).context("training.init_from")?;
            if model != cfg.model {
                tracing::info!(from = %dir.display(), "model.* follows the Hugging Face config.json");
                cfg.model = model;
            }
            let tokenizer = dir.join(hf::TOKENIZER_FILE);
            (format!("{}{}", hf::PREFIX, dir.display()), tokenizer)
        }
        None => {
            let dir = checkpoint::resolve(Path::new("."), &spec).context("training.init_from")?;
            let dir = std::path::absolute(&dir).context("training.init_from")?;
            let tokenizer = dir.join(checkpoint::TOKENIZER_FILE);
            (dir.display().to_string(), tokenizer)
        }
    };
    Ok(Some(resolved))
}

/// The model, its variables and the parameters the optimizer updates: every weight, or with
/// `training.lora` only the adapters (the base weights are built detached, so they get no
/// gradient and no optimizer state). Base weights come from `init_from` (or the seeded init).
pub fn build_model(
    cfg: &Config,
    init_from: Option<&str>,
    device: &Device,
) -> Result<(VarMap, Gpt, Vec<Param>)> {
    let varmap = VarMap::new();
    let t = &cfg.training;
    let model = match &t.lora {
        Some(l) => Gpt::with_adapters(
            &cfg.model,
            l,
            lora::var_builder(&varmap, DType::F32, device),
        )?,
        None => Gpt::new(
            &cfg.model,
            VarBuilder::from_varmap(&varmap, DType::F32, device),
        )?,
    };
    checkpoint::load_base(init_from, cfg, &varmap, device).context("training.init_from")?;
    let mut params = optim::params_from_varmap(&varmap, model::is_decayed);
    if t.lora.is_some() {
        lora::init_adapters(&varmap, t.seed)?;
        params.retain(|p| lora::is_adapter(&p.name));
    }
    Ok((varmap, model, params))
}

/// For `training.objective: dpo`: the preference pairs, their tokenizer (the starting
/// checkpoint's, else `data.tokenizer`) and the frozen reference model. `PreparedData` then
/// holds no token streams, only the tokenizer and counts.
pub fn prepare_preferences(
    cfg: &Config,
    tokenizer_hint: Option<&Path>,
    init_from: Option<&str>,
    policy: &Gpt,
    device: &Device,
) -> Result<(PreparedData, Preference)> {
    let (train, val) = dpo::load_pairs(Path::new(&cfg.data.dataset), cfg.data.val_fraction)?;
    let tokenizer = match (tokenizer_hint, cfg.data.tokenizer.as_str()) {
        (Some(path), _) => TextTokenizer::load(path)?,
        (None, "bytes") => TextTokenizer::Bytes,
        (None, "bpe") => {
            let texts: Vec<String> = train
                .iter()
                .map(|p: &Pair| format!("{}{}\n{}", p.prompt, p.chosen, p.rejected))
                .collect();
            TextTokenizer::train_bpe_on(&texts, cfg.model.vocab_size)?
        }
        (None, path) => TextTokenizer::load(Path::new(path))?,
    };
    if tokenizer.vocab_size() > cfg.model.vocab_size {
        anyhow::bail!(
            "model.vocab_size: {} is smaller than the tokenizer's vocabulary of {}",
            cfg.model.vocab_size,
            tokenizer.vocab_size()
        );
    }
    let reference = match (cfg.training.dpo.reference.as_str(), &cfg.training.lora) {
        // The same weights with the adapters off: no second copy.
        ("init", Some(_)) => policy.without_adapters(),
        ("init", None) => frozen_model(cfg, init_from, device)?,
        (other, _) => {
            let spec = match hf::import::hf_path(other) {
                Some(_) => other.to_string(),
                None => checkpoint::resolve(Path::new("."), other)
                    .context("training.dpo.reference")?
                    .display()
                    .to_string(),
            };
            frozen_model(cfg, Some(&spec), device).context("training.dpo.reference")?
        }
    };
    let mut seen = std::collections::HashSet::new();
    let duplicates = train
        .iter()
        .chain(&val)
        .filter(|p| !seen.insert((&p.prompt, &p.chosen, &p.rejected)))
        .count();
    let stats = DataStats {
        documents: train.len() + val.len(),
        filtered: FilterStats::default(),
        train_documents: train.len(),
        val_documents: val.len(),
        train_tokens: 0,
        val_tokens: 0,
        vocab_size: tokenizer.vocab_size(),
        cache_hit: false,
        cache_key: String::new(),
        pairs: Some(crate::data::PairStats {
            train: train.len(),
            val: val.len(),
            duplicates,
        }),
    };
    let data = PreparedData {
        tokenizer,
        train: TokenSplit::from_vec(Vec::new()),
        val: TokenSplit::from_vec(Vec::new()),
        stats,
    };
    let preference = Preference {
        train,
        val,
        reference,
        beta: cfg.training.dpo.beta,
    };
    Ok((data, preference))
}

/// A model of `cfg.model` with the base weights `init_from` names, every weight detached.
fn frozen_model(cfg: &Config, init_from: Option<&str>, device: &Device) -> Result<Gpt> {
    let varmap = VarMap::new();
    let model = Gpt::new(&cfg.model, lora::var_builder(&varmap, DType::F32, device))?;
    checkpoint::load_base(init_from, cfg, &varmap, device)?;
    Ok(model)
}

/// Whether this run trains on preference pairs.
pub fn is_dpo(cfg: &Config) -> bool {
    cfg.training.objective == Objective::Dpo
}

impl Trainer {
    /// One DPO optimizer step over `grad_accum_steps` batches of `batch_size` pairs.
    pub(super) fn dpo_step(&mut self) -> Result<StepStats> {
        let started = Instant::now();
        let t = &self.cfg.training;
        let Some(pref) = &self.preference else {
            anyhow::bail!("training.objective: dpo without preference data");
        };
        let _autocast = crate::kernels::autocast::autocast(t.precision);
        let accum = t.grad_accum_steps.max(1);
        let lr = lr_at(t, self.state.step as usize);
        let noisy =
            self.cfg.model.dropout > 0.0 || t.lora.as_ref().is_some_and(|l| l.dropout > 0.0);
        let mut rng = noisy
            .then(|| DropoutRng::new(dropout_seed_for(self.state.dropout_seed, self.state.step)));
        let params: Vec<Tensor> = self
            .optimizer
            .params()
            .iter()
            .map(|p| p.var.as_tensor().clone())
            .collect();
        let mut grads: Vec<Option<Tensor>> = vec![None; params.len()];
        let mut parts = Vec::with_capacity(accum);
        let mut sampler = self.state.sampler;
        let mut tokens = 0;
        for _ in 0..accum {
            let picked = pref.next_indices(&mut sampler, t.batch_size);
            let pairs: Vec<&Pair> = picked.iter().map(|&i| &pref.train[i]).collect();
            let (loss, stats, pass) = pref.batch_loss(
                &self.model,
                &pairs,
                &self.data.tokenizer,
                t.seq_len,
                rng.as_mut(),
                t.gradient_checkpointing,
            )?;
            // The loss goes into `backward` with no handle left here: it frees the head's
            // activations before any recompute.
            let objective = loss.affine(1.0 / accum as f64, 0.0)?;
            drop(loss);
            let micro = pass.backward(objective)?;
            for (slot, p) in grads.iter_mut().zip(&params) {
                if let Some(g) = micro.get(p) {
                    *slot = Some(match slot.take() {
                        Some(acc) => (acc + g)?,
                        None => g.clone(),
                    });
                }
            }
            parts.push((stats, pairs.len()));
            tokens += 2 * pairs.len() * t.seq_len;
        }
        let grad_norm = clip_grad_norm(&mut grads, t.grad_clip)?;
        self.optimizer.step(&grads, lr)?;
        self.state.step += 1;
        self.state.tokens_seen += tokens as u64;
        self.state.sampler = sampler;
        self.state.val_loss = None;
        let stats = dpo::DpoStats::mean(&parts);
        let mut extra = BTreeMap::new();
        stats.metrics("dpo/", &mut extra);
        Ok(StepStats {
            step: self.state.step,
            loss: stats.loss as f32,
            lr,
            grad_norm,
            tokens,
            seconds: started.elapsed().as_secs_f64(),
            extra,
            guard: None,
        })
    }

    /// Validation DPO statistics under `val/dpo/`, and `val/loss` (the DPO loss).
    pub(super) fn dpo_evaluate(&self) -> Result<(f64, BTreeMap<String, f64>)> {
        let Some(pref) = &self.preference else {
            anyhow::bail!("training.objective: dpo without preference data");
        };
        let t = &self.cfg.training;
        let _autocast = crate::kernels::autocast::autocast(t.precision);
        let stats = pref.evaluate(&self.model, &self.data.tokenizer, t.seq_len, t.batch_size)?;
        let mut out = BTreeMap::new();
        stats.metrics("val/dpo/", &mut out);
        out.insert("val/loss".into(), stats.loss);
        Ok((stats.loss, out))
    }
}
