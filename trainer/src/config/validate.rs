//! Cross-field and range rules, checked before any work starts.

use super::{Config, ConfigError, LoraTarget, Objective, PositionKind};

fn positive(key: &str, v: usize) -> Result<(), ConfigError> {
    if v == 0 {
        return Err(ConfigError::invalid(key, "must be at least 1"));
    }
    Ok(())
}

fn positive_f(key: &str, v: f64) -> Result<(), ConfigError> {
    if !(v.is_finite() && v > 0.0) {
        return Err(ConfigError::invalid(key, format!("must be > 0, got {v}")));
    }
    Ok(())
}

fn non_negative(key: &str, v: f64) -> Result<(), ConfigError> {
    if !(v.is_finite() && v >= 0.0) {
        return Err(ConfigError::invalid(key, format!("must be >= 0, got {v}")));
    }
    Ok(())
}

/// Probabilities and betas: in [0, 1).
fn unit_open(key: &str, v: f64) -> Result<(), ConfigError> {
    if !(0.0..1.0).contains(&v) {
        return Err(ConfigError::invalid(
            key,
            format!("must be in [0, 1), got {v}"),
        ));
    }
    Ok(())
}

impl Config {
    /// Checks every rule; the first violation is returned, naming its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_model()?;
        self.validate_training()?;
        self.validate_data()?;
        self.validate_logging()
    }

    fn validate_model(&self) -> Result<(), ConfigError> {
        let m = &self.model;
        positive("model.vocab_size", m.vocab_size)?;
        positive("model.d_model", m.d_model)?;
        positive("model.n_layers", m.n_layers)?;
        positive("model.n_heads", m.n_heads)?;
        positive("model.d_ff", m.d_ff)?;
        positive("model.max_seq_len", m.max_seq_len)?;
        if !m.d_model.is_multiple_of(m.n_heads) {
            return Err(ConfigError::invalid(
                "model.d_model",
                format!(
                    "must be divisible by model.n_heads ({} % {} = {})",
                    m.d_model,
                    m.n_heads,
                    m.d_model % m.n_heads
                ),
            ));
        }
        if m.position == PositionKind::Rope && !(m.d_model / m.n_heads).is_multiple_of(2) {
            return Err(ConfigError::invalid(
                "model.position",
                format!(
                    "rope needs an even head dimension, d_model / n_heads = {}",
                    m.d_model / m.n_heads
                ),
            ));
        }
        unit_open("model.dropout", m.dropout)?;
        positive_f("model.rope_theta", m.rope_theta)?;
        positive_f("model.norm_eps", m.norm_eps)?;
        positive_f("model.init_std", m.init_std)?;
        if let Some(moe) = &m.moe {
            positive("model.moe.num_experts", moe.num_experts)?;
            positive("model.moe.top_k", moe.top_k)?;
            if moe.top_k > moe.num_experts {
                return Err(ConfigError::invalid(
                    "model.moe.top_k",
                    format!(
                        "must be <= model.moe.num_experts ({} > {})",
                        moe.top_k, moe.num_experts
                    ),
                ));
            }
            positive("model.moe.every_n_layers", moe.every_n_layers)?;
            if moe.every_n_layers > m.n_layers {
                return Err(ConfigError::invalid(
                    "model.moe.every_n_layers",
                    format!(
                        "must be <= model.n_layers ({}), or no block would use MoE",
                        m.n_layers
                    ),
                ));
            }
            non_negative("model.moe.capacity_factor", moe.capacity_factor)?;
            non_negative("model.moe.aux_loss_weight", moe.aux_loss_weight)?;
            non_negative("model.moe.z_loss_weight", moe.z_loss_weight)?;
            unit_open("model.moe.router_jitter", moe.router_jitter)?;
        }
        self.validate_hybrid()
    }

    fn validate_training(&self) -> Result<(), ConfigError> {
        let t = &self.training;
        positive("training.batch_size", t.batch_size)?;
        positive("training.seq_len", t.seq_len)?;
        if t.seq_len > self.model.max_seq_len {
            return Err(ConfigError::invalid(
                "training.seq_len",
                format!(
                    "must be <= model.max_seq_len ({} > {})",
                    t.seq_len, self.model.max_seq_len
                ),
            ));
        }
        positive("training.max_steps", t.max_steps)?;
        positive_f("training.learning_rate", t.learning_rate)?;
        non_negative("training.min_lr", t.min_lr)?;
        if t.min_lr > t.learning_rate {
            return Err(ConfigError::invalid(
                "training.min_lr",
                format!(
                    "must be <= training.learning_rate ({} > {})",
                    t.min_lr, t.learning_rate
                ),
            ));
        }
        if t.warmup_steps >= t.max_steps {
            return Err(ConfigError::invalid(
                "training.warmup_steps",
                format!(
                    "must be < training.max_steps ({} >= {})",
                    t.warmup_steps, t.max_steps
                ),
            ));
        }
        positive_f("training.lr_power", t.lr_power)?;
        if !(t.lr_gamma > 0.0 && t.lr_gamma <= 1.0) {
            return Err(ConfigError::invalid(
                "training.lr_gamma",
                format!("must be in (0, 1], got {}", t.lr_gamma),
            ));
        }
        unit_open("training.beta1", t.beta1)?;
        unit_open("training.beta2", t.beta2)?;
        positive_f("training.eps", t.eps)?;
        unit_open("training.momentum", t.momentum)?;
        non_negative("training.weight_decay", t.weight_decay)?;
        non_negative("training.grad_clip", t.grad_clip)?;
        positive("training.grad_accum_steps", t.grad_accum_steps)?;
        positive("training.eval_iters", t.eval_iters)?;
        if matches!(&t.init_from, Some(p) if p.trim().is_empty() || p.trim() == "hf:") {
            return Err(ConfigError::invalid(
                "training.init_from",
                "must be a checkpoint path, hf:PATH or null",
            ));
        }
        self.validate_dpo()?;
        self.validate_lora()?;
        self.validate_guide_options()
    }

    /// Label smoothing, the restart schedule, the curriculum and the instability guard.
    fn validate_guide_options(&self) -> Result<(), ConfigError> {
        let t = &self.training;
        unit_open("training.label_smoothing", t.label_smoothing)?;
        positive("training.lr_restart_period", t.lr_restart_period)?;
        if !(t.lr_restart_mult.is_finite() && t.lr_restart_mult >= 1.0) {
            return Err(ConfigError::invalid(
                "training.lr_restart_mult",
                format!("must be >= 1, got {}", t.lr_restart_mult),
            ));
        }
        let lm_only = |key: &str| {
            ConfigError::invalid(
                key,
                "applies to training.objective lm only (dpo scores whole responses)",
            )
        };
        if t.objective == Objective::Dpo {
            if t.label_smoothing > 0.0 {
                return Err(lm_only("training.label_smoothing"));
            }
            if !t.curriculum.is_empty() {
                return Err(lm_only("training.curriculum"));
            }
            if t.instability_guard.is_some() {
                return Err(lm_only("training.instability_guard"));
            }
        }
        for (i, stage) in t.curriculum.iter().enumerate() {
            positive(&format!("training.curriculum[{i}].seq_len"), stage.seq_len)?;
            positive(&format!("training.curriculum[{i}].steps"), stage.steps)?;
            if stage.seq_len > t.seq_len {
                return Err(ConfigError::invalid(
                    &format!("training.curriculum[{i}].seq_len"),
                    format!(
                        "must be <= training.seq_len ({} > {}): the curriculum warms up to it",
                        stage.seq_len, t.seq_len
                    ),
                ));
            }
        }
        if let Some(g) = &t.instability_guard {
            if !(g.spike_factor.is_finite() && g.spike_factor > 1.0) {
                return Err(ConfigError::invalid(
                    "training.instability_guard.spike_factor",
                    format!("must be > 1, got {}", g.spike_factor),
                ));
            }
            positive(
                "training.instability_guard.rollback_after",
                g.rollback_after,
            )?;
            if !(g.lr_scale > 0.0 && g.lr_scale <= 1.0) {
                return Err(ConfigError::invalid(
                    "training.instability_guard.lr_scale",
                    format!("must be in (0, 1], got {}", g.lr_scale),
                ));
            }
        }
        Ok(())
    }

    fn validate_dpo(&self) -> Result<(), ConfigError> {
        let t = &self.training;
        positive_f("training.dpo.beta", t.dpo.beta)?;
        let reference = t.dpo.reference.trim();
        if reference.is_empty() || reference == "hf:" {
            return Err(ConfigError::invalid(
                "training.dpo.reference",
                "must be `init`, a checkpoint path or hf:PATH",
            ));
        }
        if t.objective == Objective::Dpo && !self.data.dataset.ends_with(".jsonl") {
            return Err(ConfigError::invalid(
                "data.dataset",
                format!(
                    "training.objective dpo reads preference pairs from a .jsonl file of \
                     {{\"prompt\", \"chosen\", \"rejected\"}} lines, got \"{}\"",
                    self.data.dataset
                ),
            ));
        }
        Ok(())
    }

    fn validate_lora(&self) -> Result<(), ConfigError> {
        let Some(lora) = &self.training.lora else {
            return Ok(());
        };
        positive("training.lora.r", lora.r)?;
        positive_f("training.lora.alpha", lora.alpha)?;
        unit_open("training.lora.dropout", lora.dropout)?;
        if lora.targets.is_empty() {
            return Err(ConfigError::invalid(
                "training.lora.targets",
                format!("must name at least one of {}", LoraTarget::choices()),
            ));
        }
        let moe = self.model.moe.as_ref();
        let all_moe = moe.is_some_and(|m| m.every_n_layers == 1);
        for (i, &target) in lora.targets.iter().enumerate() {
            let key = format!("training.lora.targets[{i}]");
            if lora.targets[..i].contains(&target) {
                return Err(ConfigError::invalid(
                    &key,
                    format!("\"{target}\" is listed twice"),
                ));
            }
            if target.is_expert() && moe.is_none() {
                return Err(ConfigError::invalid(
                    &key,
                    format!("\"{target}\" adapts MoE experts, but the model has no model.moe"),
                ));
            }
            if target.is_dense_mlp() && all_moe {
                return Err(ConfigError::invalid(
                    &key,
                    format!(
                        "\"{target}\" adapts dense MLPs, but every block is MoE \
                         (use expert_in or expert_out)"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_data(&self) -> Result<(), ConfigError> {
        let d = &self.data;
        if d.dataset.trim().is_empty() {
            return Err(ConfigError::invalid(
                "data.dataset",
                "must be `dummy`, `demo` or a path",
            ));
        }
        if d.text_column.is_empty() {
            return Err(ConfigError::invalid(
                "data.text_column",
                "must not be empty",
            ));
        }
        match d.tokenizer.as_str() {
            "" => {
                return Err(ConfigError::invalid(
                    "data.tokenizer",
                    "must be `bytes`, `bpe` or a tokenizer.json path",
                ))
            }
            "bytes" | "bpe" if self.model.vocab_size < 256 => {
                return Err(ConfigError::invalid(
                    "model.vocab_size",
                    format!(
                        "must be >= 256 with data.tokenizer = {} (got {})",
                        d.tokenizer, self.model.vocab_size
                    ),
                ))
            }
            _ => {}
        }
        unit_open("data.val_fraction", d.val_fraction)?;
        if !(d.near_dedup_threshold > 0.0 && d.near_dedup_threshold <= 1.0) {
            return Err(ConfigError::invalid(
                "data.near_dedup_threshold",
                format!("must be in (0, 1], got {}", d.near_dedup_threshold),
            ));
        }
        Ok(())
    }

    fn validate_logging(&self) -> Result<(), ConfigError> {
        let l = &self.logging;
        positive("logging.log_every", l.log_every)?;
        positive("logging.moe_every", l.moe_every)?;
        if l.flush_interval_ms == 0 {
            return Err(ConfigError::invalid(
                "logging.flush_interval_ms",
                "must be at least 1",
            ));
        }
        if l.heartbeat_interval_secs == 0 {
            return Err(ConfigError::invalid(
                "logging.heartbeat_interval_secs",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}
