//! What the store keeps for hyperparameter sweeps: the sweep (its current spec and state), each
//! version of its spec, and its trials. The search itself (`sweep` crate) is pure; the
//! controller (`crate::sweeps`) reads and writes these rows, so a sweep survives a restart.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreResult;

/// Where a sweep is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SweepState {
    /// Suggesting and launching trials, judging the running ones.
    Running,
    /// Launches nothing new; running trials go on and are still judged.
    Paused,
    /// Its budget is spent (or its grid exhausted) and every trial ended.
    Finished,
    /// Stopped by a user: its running trials were stopped.
    Stopped,
    /// Its controller failed step after step and gave up (its message says why); it
    /// launches nothing more.
    Failed,
}

impl SweepState {
    pub fn as_str(self) -> &'static str {
        match self {
            SweepState::Running => "running",
            SweepState::Paused => "paused",
            SweepState::Finished => "finished",
            SweepState::Stopped => "stopped",
            SweepState::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<SweepState> {
        Some(match text {
            "running" => SweepState::Running,
            "paused" => SweepState::Paused,
            "finished" => SweepState::Finished,
            "stopped" => SweepState::Stopped,
            "failed" => SweepState::Failed,
            _ => return None,
        })
    }

    /// Finished, stopped and failed sweeps do nothing more.
    pub fn is_over(self) -> bool {
        matches!(
            self,
            SweepState::Finished | SweepState::Stopped | SweepState::Failed
        )
    }
}

/// Where a trial is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrialState {
    /// Written with its parameters, its run not launched yet.
    Pending,
    /// Its run is queued or running.
    Running,
    /// Its run finished and reported the metric.
    Complete,
    /// Stopped early by the sweep's early-stopping rule.
    Pruned,
    /// Its run failed, was deleted, or never reported the metric.
    Failed,
    /// Stopped by a user (its run, or the whole sweep).
    Stopped,
}

impl TrialState {
    pub fn as_str(self) -> &'static str {
        match self {
            TrialState::Pending => "pending",
            TrialState::Running => "running",
            TrialState::Complete => "complete",
            TrialState::Pruned => "pruned",
            TrialState::Failed => "failed",
            TrialState::Stopped => "stopped",
        }
    }

    pub fn parse(text: &str) -> Option<TrialState> {
        Some(match text {
            "pending" => TrialState::Pending,
            "running" => TrialState::Running,
            "complete" => TrialState::Complete,
            "pruned" => TrialState::Pruned,
            "failed" => TrialState::Failed,
            "stopped" => TrialState::Stopped,
            _ => return None,
        })
    }

    /// Pending and running trials hold (or are about to hold) a slot of the sweep.
    pub fn is_active(self) -> bool {
        matches!(self, TrialState::Pending | TrialState::Running)
    }
}

/// A sweep row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    pub id: String,
    pub experiment_id: String,
    pub name: String,
    /// The current spec (the `sweep` crate's `SweepSpec` as JSON).
    pub spec: serde_json::Value,
    pub version: i64,
    pub state: SweepState,
    pub message: Option<String>,
    pub created_by: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub ended_at: Option<i64>,
}

/// One version of a sweep's spec and what changed from the one before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SweepVersion {
    pub version: i64,
    #[schema(value_type = Object)]
    pub spec: serde_json::Value,
    /// Sentences such as "max_trials: 12 → 20".
    pub changes: Vec<String>,
    /// The user who made the change (None: the local user or an admin token).
    pub changed_by: Option<String>,
    pub changed_at: i64,
}

/// A trial row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRow {
    pub number: i64,
    pub run_id: Option<String>,
    /// Config key → value.
    pub params: serde_json::Map<String, serde_json::Value>,
    pub state: TrialState,
    pub value: Option<f64>,
    pub step: Option<i64>,
    /// The early-stopping rule's records (the `sweep` crate's `Trial::rungs`).
    pub rungs: std::collections::BTreeMap<u32, f64>,
    pub bracket: Option<i64>,
    pub reason: Option<String>,
    pub created_at: i64,
    pub ended_at: Option<i64>,
}

/// What a controller tick changes on a trial.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialUpdate {
    pub state: TrialState,
    pub value: Option<f64>,
    pub step: Option<i64>,
    pub rungs: std::collections::BTreeMap<u32, f64>,
    pub reason: Option<String>,
    pub ended_at: Option<i64>,
}

#[async_trait]
pub trait Sweeps: Send + Sync {
    /// A new sweep in state `running`, with its spec as version 1.
    async fn create_sweep(
        &self,
        experiment_id: &str,
        name: &str,
        spec: &serde_json::Value,
        created_by: Option<&str>,
    ) -> StoreResult<SweepRow>;
    async fn get_sweep(&self, id: &str) -> StoreResult<SweepRow>;
    /// Newest first; `experiment_ids` None = every experiment.
    async fn list_sweeps(&self, experiment_ids: Option<&[String]>) -> StoreResult<Vec<SweepRow>>;
    /// Running and paused sweeps (a starting server resumes their controllers).
    async fn live_sweeps(&self) -> StoreResult<Vec<SweepRow>>;
    async fn set_sweep_state(
        &self,
        id: &str,
        state: SweepState,
        message: Option<&str>,
    ) -> StoreResult<()>;
    /// Stores `spec` as the next version if the current one is still `expected_version`
    /// (a conflict otherwise: someone changed it meanwhile). Returns the new version.
    async fn change_sweep_spec(
        &self,
        id: &str,
        expected_version: i64,
        spec: &serde_json::Value,
        changes: &[String],
        changed_by: Option<&str>,
    ) -> StoreResult<i64>;
    async fn sweep_versions(&self, id: &str) -> StoreResult<Vec<SweepVersion>>;
    /// Writes trial `number` as pending with its parameters; writing the same number again
    /// changes nothing (a controller that restarted re-asks the same suggestion).
    async fn add_trial(
        &self,
        sweep_id: &str,
        number: i64,
        params: &serde_json::Map<String, serde_json::Value>,
        bracket: Option<i64>,
    ) -> StoreResult<()>;
    /// Links the trial's launched run and marks it running.
    async fn set_trial_run(&self, sweep_id: &str, number: i64, run_id: &str) -> StoreResult<()>;
    async fn update_trial(
        &self,
        sweep_id: &str,
        number: i64,
        update: &TrialUpdate,
    ) -> StoreResult<()>;
    /// In number order.
    async fn trials(&self, sweep_id: &str) -> StoreResult<Vec<TrialRow>>;
    /// The sweep and trial a run belongs to, if any.
    async fn trial_of_run(&self, run_id: &str) -> StoreResult<Option<(String, i64)>>;
}
