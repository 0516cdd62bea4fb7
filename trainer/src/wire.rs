//! Wire types shared by the trainer (client) and the server: defined once, used by both ends.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// Must be finite.
    pub value: f64,
    /// Wall-clock time in unix milliseconds; the server fills in its own clock when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<i64>,
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
}

impl RunStatus {
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Created,
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Finished,
        RunStatus::Failed,
        RunStatus::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Created => "created",
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Finished => "finished",
            RunStatus::Failed => "failed",
            RunStatus::Stopped => "stopped",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Finished | RunStatus::Failed | RunStatus::Stopped
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
                format!("unknown status `{s}`; expected one of created, queued, running, finished, failed, stopped")
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
