//! The requests the client sends and the replies it reads that the server has no serde type for
//! on both sides. Where the server's own type deserializes (`store::Run`, the sweep and trial
//! states) the client uses it; the rest mirror the server's types field for field, and the
//! launcher suite's `client.rs` tests send each through the server's own type, so a rename
//! on either side fails to compile or fails a test.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::store::sweeps::{SweepState, TrialState};
use crate::store::RunStatus;

/// `POST /api/v1/runs`: a tracked run, or with `launch` one this server starts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CreateRun {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A JSON object, or (launching) YAML text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    pub launch: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Dotted config keys to their values.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: BTreeMap<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<Command>,
    /// The directory relative config paths resolve against (the submitter's current one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
}

/// `resources` of a launch or resume: whole GPUs (0 = a CPU slot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Resources {
    pub gpus: usize,
}

/// A launch's own entrypoint instead of the trainer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Command {
    Shell(String),
    Argv(Vec<String>),
}

/// The checkpoint a resumed run continues from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ResumeFrom {
    #[default]
    Latest,
    Best,
    Step(u64),
}

impl ResumeFrom {
    /// `latest`, `best` or a step number.
    pub fn parse(text: &str) -> Option<ResumeFrom> {
        match text {
            "latest" => Some(ResumeFrom::Latest),
            "best" => Some(ResumeFrom::Best),
            step => step.parse().ok().map(ResumeFrom::Step),
        }
    }
}

impl Serialize for ResumeFrom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ResumeFrom::Latest => s.serialize_str("latest"),
            ResumeFrom::Best => s.serialize_str("best"),
            ResumeFrom::Step(step) => s.serialize_u64(*step),
        }
    }
}

/// `POST /api/v1/runs/{id}/resume`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ResumeRun {
    pub from: ResumeFrom,
    /// GPUs of the resumed attempt; unset: as the run had.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

/// `POST /api/v1/sweeps`: the spec as a JSON object (a YAML file's document).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubmitSweep {
    pub spec: Value,
}

/// `POST /api/v1/runs/{id}/stop`'s reply.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct StopReply {
    pub id: String,
    pub status: StopOutcome,
}

/// What a stop did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StopOutcome {
    /// It was queued: out of the queue and stopped.
    Stopped,
    /// It was running: SIGTERM sent, `stopped` once it exits.
    Stopping,
}

/// A `log` event of a followed log.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LogChunk {
    /// Byte offset of `text` in the log.
    pub offset: u64,
    pub text: String,
}

/// The `end` event of a followed log: how the run ended (`unknown` when the server could not
/// tell, which is no `RunStatus`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LogEnd {
    pub status: String,
}

impl LogEnd {
    pub fn status(&self) -> Option<RunStatus> {
        self.status.parse().ok()
    }
}

/// A sweep as `GET /api/v1/sweeps/{id}`, the sweep commands and its `sweep` events show it
/// (the parts this client reads of the server's `sweeps::view::SweepDetail`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Sweep {
    pub id: String,
    pub name: String,
    pub experiment_id: String,
    pub state: SweepState,
    /// Why it is in its state.
    pub message: Option<String>,
    pub version: i64,
    pub method: String,
    /// The objective's metric key.
    pub metric: String,
    pub goal: String,
    pub max_trials: u32,
    pub parallel: u32,
    pub best: Option<BestTrial>,
    pub trials: Vec<Trial>,
}

/// The complete trial with the best objective.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BestTrial {
    pub number: i64,
    pub run_id: Option<String>,
    pub value: f64,
    pub params: Map<String, Value>,
}

/// One trial of a sweep.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Trial {
    pub number: i64,
    pub run_id: Option<String>,
    pub params: Map<String, Value>,
    pub state: TrialState,
    /// The objective: the metric's last value.
    pub value: Option<f64>,
    /// The last step the metric was reported at.
    pub step: Option<i64>,
    pub reason: Option<String>,
    /// `[step, value]` pairs of the metric.
    pub curve: Vec<[f64; 2]>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sweeps::SweepVersion;
    use crate::sweeps::view::{self, SweepDetail, SweepSummary, TrialCounts, TrialView};

    /// Built field by field: a field renamed or added on the server fails to compile here.
    fn server_sweep() -> SweepDetail {
        let params: Map<String, Value> = [("x".to_string(), Value::from(2))].into_iter().collect();
        SweepDetail {
            summary: SweepSummary {
                id: "s1".into(),
                name: "cli".into(),
                experiment_id: "e1".into(),
                state: SweepState::Running,
                message: Some("why".into()),
                version: 2,
                method: "grid".into(),
                metric: "loss".into(),
                goal: "minimize".into(),
                early_terminate: "none".into(),
                max_trials: 3,
                parallel: 2,
                trials: TrialCounts {
                    total: 1,
                    pending: 0,
                    running: 0,
                    complete: 1,
                    pruned: 0,
                    failed: 0,
                    stopped: 0,
                },
                best: Some(view::BestTrial {
                    number: 1,
                    run_id: Some("r1".into()),
                    value: 0.5,
                    params: params.clone(),
                }),
                created_by: None,
                created_at: 1,
                updated_at: 2,
                ended_at: None,
            },
            spec: serde_json::json!({"name": "cli"}),
            trials: vec![TrialView {
                number: 1,
                run_id: Some("r1".into()),
                params: params.clone(),
                state: TrialState::Complete,
                value: Some(0.5),
                step: Some(9),
                next_rung: None,
                rungs: BTreeMap::new(),
                bracket: None,
                reason: Some("done".into()),
                created_at: 1,
                ended_at: Some(3),
                curve: vec![[0.0, 1.0], [9.0, 0.5]],
            }],
            importance: BTreeMap::new(),
            versions: Vec::<SweepVersion>::new(),
        }
    }

    #[test]
    fn the_client_reads_every_field_it_knows_of_the_servers_sweep() {
        let sent = serde_json::to_value(server_sweep()).unwrap();
        let read: Sweep = serde_json::from_value(sent).unwrap();
        let params: Map<String, Value> = [("x".to_string(), Value::from(2))].into_iter().collect();
        assert_eq!(
            read,
            Sweep {
                id: "s1".into(),
                name: "cli".into(),
                experiment_id: "e1".into(),
                state: SweepState::Running,
                message: Some("why".into()),
                version: 2,
                method: "grid".into(),
                metric: "loss".into(),
                goal: "minimize".into(),
                max_trials: 3,
                parallel: 2,
                best: Some(BestTrial {
                    number: 1,
                    run_id: Some("r1".into()),
                    value: 0.5,
                    params: params.clone(),
                }),
                trials: vec![Trial {
                    number: 1,
                    run_id: Some("r1".into()),
                    params,
                    state: TrialState::Complete,
                    value: Some(0.5),
                    step: Some(9),
                    reason: Some("done".into()),
                    curve: vec![[0.0, 1.0], [9.0, 0.5]],
                }],
            }
        );
    }

    #[test]
    fn a_resume_names_its_checkpoint_by_word_or_step_number() {
        let body = |from| {
            serde_json::to_value(ResumeRun {
                from,
                resources: None,
            })
            .unwrap()
        };
        assert_eq!(
            body(ResumeFrom::Latest),
            serde_json::json!({"from": "latest"})
        );
        assert_eq!(body(ResumeFrom::Best), serde_json::json!({"from": "best"}));
        assert_eq!(
            body(ResumeFrom::Step(300)),
            serde_json::json!({"from": 300})
        );
        assert_eq!(ResumeFrom::parse("300"), Some(ResumeFrom::Step(300)));
        assert_eq!(ResumeFrom::parse("best"), Some(ResumeFrom::Best));
        assert_eq!(ResumeFrom::parse("newest"), None);
    }
}
