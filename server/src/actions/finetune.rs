//! Fine-tuning from a checkpoint: the model a launch starts from (`training.init_from`) or
//! measures against (`training.dpo.reference`) is the checkpoint's, so a config whose `model.*`
//! differs from the checkpoint's is refused at launch, naming the first key that differs,
//! instead of a trainer that fails later with `no tensor ...`.

use std::path::Path;

use serde_json::Value;
use trainer::config::{Config, ModelConfig};

use crate::validate::Invalid;

/// `model.*` keys a fine-tune may change: they shape training, not the weights.
const MAY_DIFFER: [&str; 6] = [
    "dropout",
    "init_std",
    "moe.capacity_factor",
    "moe.aux_loss_weight",
    "moe.z_loss_weight",
    "moe.router_jitter",
];

/// The model config of the checkpoint at `dir` (a checkpoint directory or a run directory
/// with checkpoints; its best, else latest); `None` when there is none to read there (the
/// trainer then says what is missing).
pub fn checkpoint_model(dir: &Path) -> Option<ModelConfig> {
    let source = trainer::checkpoint::resolve_for_reading(dir).ok()?;
    trainer::checkpoint::read_config(&source)
        .ok()
        .map(|c| c.model)
}

/// Refuses a config whose model differs from the checkpoint it starts from or is measured
/// against (paths already resolved and their access checked). Blocking: reads the
/// checkpoints' configs.
pub fn check_starting_model(cfg: &Config) -> Result<(), Invalid> {
    let reference = Some(cfg.training.dpo.reference.as_str()).filter(|r| r.trim() != "init");
    let starts = [
        ("training.init_from", cfg.training.init_from.as_deref()),
        ("training.dpo.reference", reference),
    ];
    for (key, spec) in starts {
        let Some(spec) = spec.filter(|s| {
            !s.trim().is_empty() && *s != "latest" && !s.starts_with(trainer::hf::PREFIX)
        }) else {
            continue;
        };
        let Some(theirs) = checkpoint_model(Path::new(spec)) else {
            continue;
        };
        if let Some((field, ours, theirs)) = first_difference(&cfg.model, &theirs) {
            return Err(Invalid::new(
                field.clone(),
                format!(
                    "{field} is {ours} here but {theirs} in the checkpoint {key} names; a \
                     fine-tune keeps its checkpoint's model, so leave {field} out or set it to \
                     {theirs}"
                ),
            ));
        }
    }
    Ok(())
}

/// The first `model.*` key (in the config's order) whose value differs, with both values as
/// written in YAML (`absent` for a section one side lacks).
pub fn first_difference(
    ours: &ModelConfig,
    theirs: &ModelConfig,
) -> Option<(String, String, String)> {
    let (a, b) = (
        serde_json::to_value(ours).ok()?,
        serde_json::to_value(theirs).ok()?,
    );
    differ("model", "", &a, &b)
}

fn differ(path: &str, rel: &str, a: &Value, b: &Value) -> Option<(String, String, String)> {
    if MAY_DIFFER.contains(&rel) {
        return None;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k)));
            for k in keys {
                let null = Value::Null;
                let (va, vb) = (x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null));
                let rel = if rel.is_empty() {
                    k.clone()
                } else {
                    format!("{rel}.{k}")
                };
                if let Some(d) = differ(&format!("{path}.{k}"), &rel, va, vb) {
                    return Some(d);
                }
            }
            None
        }
        _ if numbers_equal(a, b) => None,
        _ => Some((path.to_string(), shown(a), shown(b))),
    }
}

/// 64 and 64.0 are the same value.
fn numbers_equal(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn shown(v: &Value) -> String {
    match v {
        Value::Null => "absent".to_string(),
        Value::String(s) => s.clone(),
        Value::Object(_) => "set".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainer::config::MoeConfig;

    #[test]
    fn the_first_differing_model_key_is_named_and_training_only_keys_may_differ() {
        let base = ModelConfig::default();
        assert_eq!(first_difference(&base, &base), None);
        let dropout = ModelConfig {
            dropout: 0.2,
            init_std: 0.01,
            ..base.clone()
        };
        assert_eq!(
            first_difference(&dropout, &base),
            None,
            "dropout may change"
        );
        let wider = ModelConfig {
            d_ff: base.d_ff * 2,
            ..base.clone()
        };
        let (field, ours, theirs) = first_difference(&wider, &base).expect("a difference");
        assert_eq!(field, "model.d_ff");
        assert_eq!((ours.as_str(), theirs.as_str()), ("512", "256"));
        let moe = ModelConfig {
            moe: Some(MoeConfig::default()),
            ..base.clone()
        };
        let (field, ours, theirs) = first_difference(&base, &moe).expect("a difference");
        assert_eq!((field.as_str(), ours.as_str()), ("model.moe", "absent"));
        assert_eq!(theirs, "set");
        let routed = ModelConfig {
            moe: Some(MoeConfig {
                capacity_factor: 1.5,
                ..MoeConfig::default()
            }),
            ..base.clone()
        };
        assert_eq!(first_difference(&routed, &moe), None, "capacity may change");
        let experts = ModelConfig {
            moe: Some(MoeConfig {
                num_experts: 4,
                ..MoeConfig::default()
            }),
            ..base
        };
        let (field, _, _) = first_difference(&experts, &moe).expect("a difference");
        assert_eq!(field, "model.moe.num_experts");
    }
}
