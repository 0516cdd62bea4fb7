//! The training loop, readable top to bottom: [`Trainer`] owns the model, optimizer, data and
//! counters and exposes one optimizer [`Trainer::step`] (also used by benchmarks);
//! [`run`](run::run) drives it with evaluation, checkpoints, metrics and stop requests.
//!
//! On the CPU a run is deterministic: same config and thread count, same losses, bit for bit,
//! including across a checkpoint and `--resume` (the sampler position, the dropout seed, the
//! optimizer moments and the weights are all restored; the learning rate is a function of the
//! step). The `best` checkpoint holds no optimizer moments: resuming from it continues with
//! fresh ones.

pub mod curriculum;
pub mod device;
pub mod dpo;
pub mod finetune;
pub mod guard;
#[cfg(test)]
mod guide_tests;
pub mod mfu;
pub mod norms;
pub mod run;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;

use crate::checkpoint::{self, Snapshot, TrainState};
use crate::config::Config;
use crate::data::{self, Batch, BatchSampler, PreparedData};
use crate::kernels;
use crate::model::{self, DropoutRng, Gpt, MoeLayerStats};
use crate::optim::{self, clip::clip_grad_norm_on_device, lr_at, Optimizer};
use crate::profile;
use crate::wire::moe_keys;

pub use run::{run, RunOptions, RunOutcome};

/// What one optimizer step did.
#[derive(Debug, Clone)]
pub struct StepStats {
    /// Optimizer steps completed, this one included (1-based).
    pub step: u64,
    /// Mean training loss over the micro-batches (cross-entropy only, no auxiliary losses).
    pub loss: f32,
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Tokens processed by this step.
    pub tokens: usize,
    /// Wall time of the step in seconds.
    pub seconds: f64,
    /// Metrics beyond the basics (MoE telemetry), already under their final keys.
    pub extra: BTreeMap<String, f64>,
    /// With `training.instability_guard`: whether the update was applied, skipped, or skipped
    /// with a rollback due ([`Trainer::follow_guard`] carries it out).
    pub guard: Option<guard::Verdict>,
}

/// A model being trained, with everything needed to continue it exactly.
pub struct Trainer {
    cfg: Config,
    device: Device,
    varmap: VarMap,
    model: Gpt,
    optimizer: Box<dyn Optimizer>,
    data: PreparedData,
    sampler: BatchSampler,
    eval_batches: Vec<Batch>,
    state: TrainState,
    tokenizer_json: String,
    num_params: usize,
    /// Parameters the optimizer updates (with LoRA, the adapters only).
    trainable_params: usize,
    /// With LoRA: the base weights the adapters go with, saved beside them.
    base: Option<checkpoint::BaseRef>,
    /// With `training.objective: dpo`: the pairs and the frozen reference.
    preference: Option<dpo::Preference>,
    /// Test hook: losses of chosen steps multiplied by a factor (see [`guard::FaultPlan`]).
    faults: guard::FaultPlan,
}

impl Trainer {
    /// A fresh run from `cfg` (weights from `training.init_from` when set), on `device`.
    pub fn new(cfg: Config, device: Device) -> Result<Self> {
        Trainer::build(cfg, device, None, None)
    }

    /// Continues from the checkpoint in `dir` with `cfg` (normally the checkpoint's own config,
    /// possibly with overrides such as a larger `training.max_steps`).
    pub fn resume(cfg: Config, device: Device, dir: &Path) -> Result<Self> {
        let state = checkpoint::read_state(dir)?;
        let tokenizer = dir.join(checkpoint::TOKENIZER_FILE);
        let mut trainer = Trainer::build(cfg, device, Some(&tokenizer), Some(state))?;
        checkpoint::load_model(dir, &trainer.cfg, &trainer.varmap, &trainer.device)?;
        if checkpoint::has_optimizer(dir) {
            checkpoint::load_optimizer(dir, trainer.optimizer.as_mut(), &trainer.device)?;
            tracing::info!(from = %dir.display(), step = trainer.state.step, "resumed");
        } else {
            // The `best` checkpoint keeps weights only: its run goes on, not bit for bit.
            tracing::warn!(
                from = %dir.display(),
                step = trainer.state.step,
                "resumed the weights with fresh optimizer state: this checkpoint holds none"
            );
        }
        Ok(trainer)
    }

    /// A trainer for `cfg`: base weights from `training.init_from` (a checkpoint or `hf:PATH`,
    /// whose tokenizer it keeps unless `tokenizer_hint`, a resumed checkpoint's, says otherwise),
    /// LoRA adapters and the DPO reference when configured.
    fn build(
        mut cfg: Config,
        device: Device,
        tokenizer_hint: Option<&Path>,
        state: Option<TrainState>,
    ) -> Result<Self> {
        let init_from = finetune::resolve_init_from(&mut cfg)?;
        let init_spec = init_from.as_ref().map(|(spec, _)| spec.as_str());
        let tokenizer_hint = tokenizer_hint.or(init_from.as_ref().map(|(_, tok)| tok.as_path()));
        let (varmap, model, params) = finetune::build_model(&cfg, init_spec, &device)?;
        let (data, preference) = if finetune::is_dpo(&cfg) {
            let (data, pref) =
                finetune::prepare_preferences(&cfg, tokenizer_hint, init_spec, &model, &device)?;
            (data, Some(pref))
        } else {
            (data::prepare(&cfg, tokenizer_hint)?, None)
        };
        let t = &cfg.training;
        let eval_batches = match preference {
            Some(_) => Vec::new(),
            None => data::eval_batches(&data.val, t.batch_size, t.seq_len, t.eval_iters.max(1))?,
        };
        let num_params = model::num_params(&varmap);
        let trainable_params = params.iter().map(|p| p.var.elem_count()).sum();
        let base = t.lora.as_ref().map(|_| checkpoint::BaseRef {
            init_from: init_spec.map(str::to_string),
        });
        let optimizer = optim::build(t, params)?;
        let state = state.unwrap_or_else(|| TrainState {
            step: 0,
            tokens_seen: 0,
            sampler: BatchSampler::new(t.batch_size, t.seq_len, t.seed).state(),
            // A different stream from init and data, derived from the same seed.
            dropout_seed: t.seed ^ 0x5eed_d0d0_5eed_d0d0,
            best_val_loss: None,
            evals_without_improvement: 0,
            early_stopped: false,
            val_loss: None,
            guard: guard::GuardState::default(),
        });
        let sampler = BatchSampler::from_state(t.batch_size, t.seq_len, state.sampler);
        let tokenizer_json = data.tokenizer.to_json()?;
        Ok(Trainer {
            cfg,
            device,
            varmap,
            model,
            optimizer,
            data,
            sampler,
            eval_batches,
            state,
            tokenizer_json,
            num_params,
            trainable_params,
            base,
            preference,
            faults: guard::FaultPlan::default(),
        })
    }

    /// Test hook: from now on, multiply the loss of the plan's steps by their factors.
    pub fn inject_faults(&mut self, plan: guard::FaultPlan) {
        self.faults = plan;
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn state(&self) -> &TrainState {
        &self.state
    }

    pub(crate) fn state_mut(&mut self) -> &mut TrainState {
        &mut self.state
    }

    pub fn num_params(&self) -> usize {
        self.num_params
    }

    /// Parameters the optimizer updates: all of them, or with LoRA the adapters.
    pub fn trainable_params(&self) -> usize {
        self.trainable_params
    }

    /// Scalars of optimizer state (moments), which the optimizer keeps only for trainable
    /// parameters.
    pub fn optimizer_state_scalars(&self) -> Result<usize> {
        Ok(self
            .optimizer
            .state()?
            .values()
            .map(Tensor::elem_count)
            .sum())
    }

    /// The model being trained.
    pub fn model(&self) -> &Gpt {
        &self.model
    }

    /// Every variable (base weights and adapters) by name.
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    pub fn data(&self) -> &PreparedData {
        &self.data
    }

    /// One optimizer step: `grad_accum_steps` forward/backward passes, clipping, the update.
    pub fn step(&mut self) -> Result<StepStats> {
        if self.preference.is_some() {
            return self.dpo_step();
        }
        let started = Instant::now();
        let t = &self.cfg.training;
        let _autocast = kernels::autocast::autocast(t.precision);
        let accum = t.grad_accum_steps.max(1);
        let step_index = self.state.step; // 0-based index of this step
        let lr = lr_at(t, step_index as usize) * self.state.guard.lr_scale;
        let seq_len = curriculum::seq_len_at(t, step_index);
        self.sampler.set_seq_len(seq_len);
        let fault = self.faults.loss_factors.get(&(step_index + 1)).copied();
        let lora_dropout = t.lora.as_ref().is_some_and(|l| l.dropout > 0.0);
        let mut dropout = (self.cfg.model.dropout > 0.0 || lora_dropout)
            .then(|| DropoutRng::new(dropout_seed_for(self.state.dropout_seed, step_index)));
        let params: Vec<Tensor> = self
            .optimizer
            .params()
            .iter()
            .map(|p| p.var.as_tensor().clone())
            .collect();
        let mut grads: Vec<Option<Tensor>> = vec![None; params.len()];
        let mut loss_sum = Tensor::zeros((), DType::F32, &self.device)?;
        let mut moe_stats = Vec::new();
        let mut clock = profile::PhaseClock::new(&self.device, profile::enabled())?;
        for _ in 0..accum {
            let batch = self.sampler.next_batch(&self.data.train)?;
            let (x, y) = batch.to_tensors(&self.device)?; // (B, T), (B, T)
            let mut pass =
                self.model
                    .forward_train(&x, dropout.as_mut(), t.gradient_checkpointing)?;
            let smoothing = t.label_smoothing;
            let mut ce = kernels::loss::smoothed_cross_entropy(&pass.output.logits, &y, smoothing)?;
            if let Some(factor) = fault {
                ce = ce.affine(factor, 0.0)?;
            }
            loss_sum = (loss_sum + ce.detach())?;
            // MoE load-balancing and z losses (already weighted) join the objective. No handle
            // to it or the logits outlives `backward`, which frees them before recomputing.
            let objective = match &pass.output.aux_loss {
                Some(aux) => (ce + aux)?,
                None => ce,
            }
            .affine(1.0 / accum as f64, 0.0)?;
            moe_stats.append(&mut pass.output.moe);
            clock.mark("forward")?;
            let micro_grads = pass.backward(objective)?;
            for (slot, p) in grads.iter_mut().zip(&params) {
                if let Some(g) = micro_grads.get(p) {
                    *slot = Some(match slot.take() {
                        Some(acc) => (acc + g)?,
                        None => g.clone(),
                    });
                }
            }
            clock.mark("backward")?;
        }
        let mut extra = BTreeMap::new();
        let norms_every = self.cfg.logging.layer_norms_every as u64;
        if norms_every > 0 && (step_index + 1).is_multiple_of(norms_every) {
            norms::layer_norms(self.optimizer.params(), &grads, &mut extra)?;
        }
        let grad_norm = clip_grad_norm_on_device(&mut grads, t.grad_clip)?; // scalar, on device
        clock.mark("clip")?;
        // The guard judges the loss before the update, so it reads it first; without the guard
        // the step's one read comes after the update.
        let mut read = None;
        let verdict = match &t.instability_guard {
            Some(g) => {
                let (loss, norm) = read_loss_and_norm(&loss_sum, &grad_norm, accum)?;
                read = Some((loss, norm));
                Some(self.state.guard.judge(g, loss, norm))
            }
            None => None,
        };
        if verdict.is_none_or(guard::Verdict::updates) {
            self.optimizer.step(&grads, lr)?;
        }
        clock.mark("optimizer")?;

        let tokens = accum * t.batch_size * seq_len;
        self.state.step += 1;
        self.state.tokens_seen += tokens as u64;
        self.state.sampler = self.sampler.state();
        self.state.val_loss = None;
        let (loss, grad_norm) = match read {
            Some(read) => read,
            None => read_loss_and_norm(&loss_sum, &grad_norm, accum)?,
        };
        clock.report(&mut extra);
        let moe_every = self.cfg.logging.moe_every.max(1) as u64;
        if !moe_stats.is_empty() && self.state.step.is_multiple_of(moe_every) {
            moe_metrics(&moe_stats, &mut extra)?;
        }
        Ok(StepStats {
            step: self.state.step,
            loss,
            lr,
            grad_norm,
            tokens,
            seconds: started.elapsed().as_secs_f64(),
            extra,
            guard: verdict,
        })
    }

    /// The validation metrics of an evaluation and `val/loss` (what early stopping and the
    /// best checkpoint follow): `val/loss` and `val/ppl`, or for DPO `val/dpo/...`.
    pub fn evaluate(&self) -> Result<(f64, BTreeMap<String, f64>)> {
        if self.preference.is_some() {
            return self.dpo_evaluate();
        }
        let val = self.estimate_loss()?;
        let metrics = BTreeMap::from([
            ("val/loss".to_string(), val),
            ("val/ppl".to_string(), val.exp()),
        ]);
        Ok((val, metrics))
    }

    /// Mean validation loss over the fixed `eval_iters` validation batches (no dropout).
    pub fn estimate_loss(&self) -> Result<f64> {
        let _autocast = kernels::autocast::autocast(self.cfg.training.precision);
        let mut sum = 0.0f64;
        for batch in &self.eval_batches {
            let (x, y) = batch.to_tensors(&self.device)?; // (B, T), (B, T)
            let out = self.model.forward_no_grad(&x)?;
            let ce = model::cross_entropy(&out.logits, &y)?;
            sum += f64::from(ce.to_scalar::<f32>()?);
        }
        Ok(sum / self.eval_batches.len().max(1) as f64)
    }

    fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            varmap: &self.varmap,
            optimizer: self.optimizer.as_ref(),
            state: &self.state,
            config: &self.cfg,
            tokenizer_json: &self.tokenizer_json,
            base: self.base.as_ref(),
        }
    }

    /// Writes `run_dir/checkpoints/step-NNNNNN/` and applies `save_total_limit`.
    pub fn save_checkpoint(&self, run_dir: &Path) -> Result<PathBuf> {
        checkpoint::save_step(
            run_dir,
            &self.snapshot(),
            self.cfg.training.save_total_limit,
        )
    }

    /// Writes `run_dir/checkpoints/best/`.
    pub fn save_best(&self, run_dir: &Path) -> Result<PathBuf> {
        checkpoint::save_best(run_dir, &self.snapshot())
    }
}

/// The step's one read from the device: the summed loss and the gradient norm together; the
/// loss as the mean over `accum` micro-batches.
fn read_loss_and_norm(loss_sum: &Tensor, grad_norm: &Tensor, accum: usize) -> Result<(f32, f32)> {
    let both = Tensor::stack(&[loss_sum, &grad_norm.to_device(loss_sum.device())?], 0)?;
    let read = both.to_vec1::<f32>()?;
    Ok((read[0] / accum as f32, read[1]))
}

/// The dropout seed of step `step`: a fresh generator per step means the step alone fixes the
/// masks, so a resumed run needs no generator state beyond the base seed.
fn dropout_seed_for(base: u64, step: u64) -> u64 {
    base ^ step.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// MoE telemetry (keys in `wire::moe_keys`): the aux and z losses (unweighted, mean over layers
/// and micro-batches), and per layer each expert's share of routing assignments, the dropped
/// fraction and the router entropy (micro-batches averaged).
pub fn moe_metrics(stats: &[MoeLayerStats], out: &mut BTreeMap<String, f64>) -> Result<()> {
    let n = stats.len().max(1) as f64;
    let losses = MoeLayerStats::read_losses(stats)?;
    out.insert(
        moe_keys::AUX_LOSS.into(),
        losses.iter().map(|l| f64::from(l.0)).sum::<f64>() / n,
    );
    out.insert(
        moe_keys::Z_LOSS.into(),
        losses.iter().map(|l| f64::from(l.1)).sum::<f64>() / n,
    );
    let mut per_layer: BTreeMap<usize, Vec<&MoeLayerStats>> = BTreeMap::new();
    for s in stats {
        per_layer.entry(s.layer).or_default().push(s);
    }
    for (layer, group) in per_layer {
        let k = group.len() as f64;
        let experts = group
            .iter()
            .map(|s| s.tokens_per_expert.len())
            .max()
            .unwrap_or(0);
        for e in 0..experts {
            let share: f64 = group
                .iter()
                .map(|s| f64::from(s.tokens_per_expert.get(e).copied().unwrap_or(0.0)))
                .sum();
            out.insert(moe_keys::expert(layer, e), share / k);
        }
        let dropped: f64 = group.iter().map(|s| f64::from(s.dropped_fraction)).sum();
        out.insert(moe_keys::dropped(layer), dropped / k);
        let entropy: f64 = group.iter().map(|s| f64::from(s.router_entropy)).sum();
        out.insert(moe_keys::entropy(layer), entropy / k);
    }
    Ok(())
}
