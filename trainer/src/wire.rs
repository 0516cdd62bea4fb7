//! Wire types shared by the trainer (client) and the server: defined once, used by both ends.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Unix time in milliseconds: the clock of every stored time, on both ends (a point's `time`,
/// a run's timestamps, the server's sessions and tokens).
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Most points one `POST /api/v1/runs/{id}/metrics` request may carry: the server refuses a
/// larger batch (422), so the reporter never sends one.
pub const MAX_POINTS_PER_BATCH: usize = 10_000;

/// Longest `reason` of a status change the server accepts, in bytes; the reporter shortens a
/// longer one (an error chain) rather than lose the status change.
pub const MAX_REASON_LEN: usize = 4 * 1024;

/// One metric observation, as posted to `POST /api/v1/runs/{id}/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricPoint {
    /// Metric name, e.g. `train/loss`, `val/ppl`, `moe/layer0/expert3`.
    pub key: String,
    /// Training step (>= 0). Writes are idempotent on (run, key, step): the first value wins.
    pub step: i64,
    /// A finite number, or NaN (a diverged loss): JSON has no NaN, so it travels as `null`
    /// (the string `"NaN"` is read too). Infinities are refused.
    #[serde(deserialize_with = "nan_as_null::deserialize")]
    pub value: f64,
    /// Wall-clock time in unix milliseconds; the server fills in its own clock when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<i64>,
}

/// A metric value in JSON: a number, or `null` for NaN (what `serde_json` writes for a NaN
/// `f64`), or the string `"NaN"`.
pub mod nan_as_null {
    use serde::de::{self, Deserializer, Visitor};
    use std::fmt;

    struct Value;

    impl<'de> Visitor<'de> for Value {
        type Value = f64;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a number, or null or \"NaN\" for NaN")
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_unit<E: de::Error>(self) -> Result<f64, E> {
            Ok(f64::NAN)
        }
        fn visit_none<E: de::Error>(self) -> Result<f64, E> {
            Ok(f64::NAN)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
            if v == "NaN" {
                Ok(f64::NAN)
            } else {
                Err(E::invalid_value(de::Unexpected::Str(v), &self))
            }
        }
    }

    /// Reads a value (see the module).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        d.deserialize_any(Value)
    }
}

/// Keys of the MoE telemetry metrics. The trainer writes them; the server reads the per-expert
/// ones back into utilisation matrices and heatmaps. Both ends build and parse them here.
///
/// - `moe/aux_loss`, `moe/z_loss`: the unweighted load-balancing and router z losses, mean over
///   MoE layers.
/// - `moe/layer{L}/expert{E}`: the share of layer L's routing assignments that chose expert E
///   (the shares of a layer sum to 1).
/// - `moe/layer{L}/dropped`: the fraction of layer L's assignments dropped at capacity.
/// - `moe/layer{L}/entropy`: the mean entropy of layer L's router distribution, in nats.
///
/// L is the block index, E the expert index, both in decimal without leading signs.
pub mod moe_keys {
    /// The mean unweighted load-balancing loss.
    pub const AUX_LOSS: &str = "moe/aux_loss";
    /// The mean unweighted router z-loss.
    pub const Z_LOSS: &str = "moe/z_loss";

    /// `moe/layer{L}/expert`: an expert's key is this prefix followed by the expert index.
    pub fn expert_prefix(layer: usize) -> String {
        format!("moe/layer{layer}/expert")
    }

    /// `moe/layer{L}/expert{E}`.
    pub fn expert(layer: usize, expert: usize) -> String {
        format!("{}{expert}", expert_prefix(layer))
    }

    /// `moe/layer{L}/dropped`.
    pub fn dropped(layer: usize) -> String {
        format!("moe/layer{layer}/dropped")
    }

    /// `moe/layer{L}/entropy`.
    pub fn entropy(layer: usize) -> String {
        format!("moe/layer{layer}/entropy")
    }

    /// (L, E) of a `moe/layer{L}/expert{E}` key; None for any other key, and for indices that
    /// are not plain decimal digits or do not fit in a u32.
    pub fn parse_expert(key: &str) -> Option<(u32, u32)> {
        let rest = key.strip_prefix("moe/layer")?;
        let (layer, rest) = rest.split_once('/')?;
        let expert = rest.strip_prefix("expert")?;
        let index = |s: &str| {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse::<u32>().ok()
        };
        Some((index(layer)?, index(expert)?))
    }
}

/// Keys of the per-layer norms (`logging.layer_norms_every`): `grad_norm/{layer}` and
/// `param_norm/{layer}`, the L2 norms of a layer's gradients (before clipping) and weights, where
/// the layer is `layer{N}` for transformer block N or a top-level module name (`wte`, `wpe`,
/// `ln_f`, `lm_head`). The server charts each family on one card.
pub mod norm_keys {
    /// Prefix of the per-layer gradient norms.
    pub const GRAD_PREFIX: &str = "grad_norm/";
    /// Prefix of the per-layer parameter norms.
    pub const PARAM_PREFIX: &str = "param_norm/";

    /// `grad_norm/{layer}`.
    pub fn grad(layer: &str) -> String {
        format!("{GRAD_PREFIX}{layer}")
    }

    /// `param_norm/{layer}`.
    pub fn param(layer: &str) -> String {
        format!("{PARAM_PREFIX}{layer}")
    }
}

/// Keys of the instability guard's record (`training.instability_guard`), written at the steps
/// where it acted; the server lists them as the run's guard events.
///
/// - `guard/skipped_steps`: at a step whose update was skipped, the number skipped so far.
/// - `guard/rollback_to`: at a step that ended in a rollback, the step of the checkpoint the
///   weights went back to.
/// - `guard/lr_scale`: at a rollback, the factor on the learning rate from then on.
pub mod guard_keys {
    /// Updates skipped so far, at each skipped step.
    pub const SKIPPED_STEPS: &str = "guard/skipped_steps";
    /// The checkpoint step a rollback returned to.
    pub const ROLLBACK_TO: &str = "guard/rollback_to";
    /// The learning-rate factor after a rollback.
    pub const LR_SCALE: &str = "guard/lr_scale";
}

/// Body of `POST /api/v1/runs/{id}/metrics`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MetricBatch {
    pub points: Vec<MetricPoint>,
}

/// One line of `DIR/metrics.jsonl`: `{"step": N, "time": unix_ms, "metrics": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsLine {
    pub step: i64,
    pub time: i64,
    pub metrics: BTreeMap<String, f64>,
}

impl MetricsLine {
    /// Flattens the line into the points the metric API takes.
    pub fn to_points(&self) -> Vec<MetricPoint> {
        self.metrics
            .iter()
            .map(|(key, value)| MetricPoint {
                key: key.clone(),
                step: self.step,
                value: *value,
                time: Some(self.time),
            })
            .collect()
    }
}

/// Lifecycle of a run. `created` (recorded, nothing launched) → `queued` (waiting for a slot) →
/// `running` → one of the terminal states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Created,
    Queued,
    Running,
    Finished,
    Failed,
    Stopped,
    /// Was running, then went silent (no heartbeat, metrics or update) for longer than the
    /// server's `--lost-after-secs`: its process was probably killed. A sign of life makes it
    /// `running` again.
    Lost,
    /// Stopped early by its sweep's early-stopping rule (ASHA, median, Hyperband): its metrics
    /// and last checkpoint are kept; only the server's sweep controller sets it.
    Pruned,
}

impl RunStatus {
    pub const ALL: [RunStatus; 8] = [
        RunStatus::Created,
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Finished,
        RunStatus::Failed,
        RunStatus::Stopped,
        RunStatus::Lost,
        RunStatus::Pruned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Created => "created",
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Finished => "finished",
            RunStatus::Failed => "failed",
            RunStatus::Stopped => "stopped",
            RunStatus::Lost => "lost",
            RunStatus::Pruned => "pruned",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Finished | RunStatus::Failed | RunStatus::Stopped | RunStatus::Pruned
        )
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RunStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = RunStatus::ALL.iter().map(|st| st.as_str()).collect();
                format!("unknown status `{s}`; expected one of {}", names.join(", "))
            })
    }
}

/// Body of `PATCH /api/v1/runs/{id}` as a reporting client (the trainer) sends it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    /// Why the status changed (recorded on the run event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The fully resolved config; write-once (flattened into params on first write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
}

/// The body of every refusal of the API: `{"error": {"code", "message", "field"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: Refusal,
}

/// Why the server refused a request, as its error body says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// `invalid_field`, `not_found`, `conflict`, ...
    pub code: String,
    pub message: String,
    /// The request field it is about, if one.
    #[serde(default)]
    pub field: Option<String>,
}

/// `field: message` (a config message that starts with its key already is left as it is).
impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) if !self.message.starts_with(&format!("{field}:")) => {
                write!(f, "{field}: {}", self.message)
            }
            _ => f.write_str(&self.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{moe_keys, MetricPoint, Refusal};

    #[test]
    fn a_nan_value_travels_as_null_and_reads_back_as_nan() {
        let nan = MetricPoint {
            key: "loss".into(),
            step: 3,
            value: f64::NAN,
            time: None,
        };
        let text = serde_json::to_string(&nan).unwrap_or_default();
        assert_eq!(text, r#"{"key":"loss","step":3,"value":null}"#);
        for body in [text.as_str(), r#"{"key":"loss","step":3,"value":"NaN"}"#] {
            let back: MetricPoint = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}"));
            assert!(back.value.is_nan(), "{body}");
        }
        let one: Result<MetricPoint, _> = serde_json::from_str(r#"{"key":"a","step":0,"value":2}"#);
        assert!(matches!(one, Ok(p) if p.value == 2.0));
        let word: Result<MetricPoint, _> =
            serde_json::from_str(r#"{"key":"a","step":0,"value":"two"}"#);
        assert!(word.is_err());
    }

    #[test]
    fn moe_keys_have_the_documented_format_and_expert_keys_parse_back() {
        assert_eq!(moe_keys::expert(2, 13), "moe/layer2/expert13");
        assert_eq!(moe_keys::expert_prefix(2), "moe/layer2/expert");
        assert_eq!(moe_keys::dropped(0), "moe/layer0/dropped");
        assert_eq!(moe_keys::entropy(7), "moe/layer7/entropy");
        assert_eq!(
            moe_keys::parse_expert(&moe_keys::expert(2, 13)),
            Some((2, 13))
        );
        assert_eq!(moe_keys::parse_expert("moe/layer0/expert0"), Some((0, 0)));
    }

    #[test]
    fn keys_that_are_not_expert_keys_parse_to_nothing() {
        for key in [
            moe_keys::AUX_LOSS,
            moe_keys::Z_LOSS,
            "moe/layer1/dropped",
            "moe/layer1/entropy",
            "moe/layer2/expertx",
            "moe/layer2/expert",
            "moe/layer/expert3",
            "moe/layer+1/expert3",
            "moe/layer1/expert-3",
            "moe/layer1/expert3/extra",
            "moe/layer1/expert4294967296",
            "train/loss",
            "xmoe/layer1/expert3",
        ] {
            assert_eq!(moe_keys::parse_expert(key), None, "{key}");
        }
    }

    #[test]
    fn a_refusal_names_its_field_once() {
        let refusal = |field: Option<&str>, message: &str| Refusal {
            code: "invalid_field".into(),
            message: message.into(),
            field: field.map(str::to_string),
        };
        assert_eq!(
            refusal(Some("name"), "too long").to_string(),
            "name: too long"
        );
        assert_eq!(
            refusal(
                Some("training.max_steps"),
                "training.max_steps: not a number"
            )
            .to_string(),
            "training.max_steps: not a number"
        );
        assert_eq!(refusal(None, "no such run").to_string(), "no such run");
    }
}
