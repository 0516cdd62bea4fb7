//! The MLflow protocol's JSON, and how its entities map onto Trainyard's: a run is a run, its
//! name and notes are the tags `mlflow.runName` and `mlflow.note.content`, statuses map both
//! ways, experiments keep their numeric ids, artifacts live under the run's directory.

use serde::de::{self, DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{MlflowError, MlflowResult};
use crate::store::{Experiment, Run, RunInput, RunStatus};

/// Tag holding the run's name (MLflow keeps it in a tag too); here it *is* the run's name.
pub const RUN_NAME_TAG: &str = "mlflow.runName";
/// Tag holding the run's description; here it is the run's notes.
pub const NOTE_TAG: &str = "mlflow.note.content";
/// Tag naming the user who started the run, as the client reports it.
pub const USER_TAG: &str = "mlflow.user";

/// MLflow's run statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlflowStatus {
    Running,
    Scheduled,
    Finished,
    Failed,
    Killed,
}

impl MlflowStatus {
    pub fn parse(text: &str) -> Option<MlflowStatus> {
        Some(match text {
            "RUNNING" => MlflowStatus::Running,
            "SCHEDULED" => MlflowStatus::Scheduled,
            "FINISHED" => MlflowStatus::Finished,
            "FAILED" => MlflowStatus::Failed,
            "KILLED" => MlflowStatus::Killed,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MlflowStatus::Running => "RUNNING",
            MlflowStatus::Scheduled => "SCHEDULED",
            MlflowStatus::Finished => "FINISHED",
            MlflowStatus::Failed => "FAILED",
            MlflowStatus::Killed => "KILLED",
        }
    }

    /// How a Trainyard status reads in MLflow. `lost` (silent for too long) reads as FAILED, as
    /// MLflow has no such state; it becomes RUNNING again if the client speaks. A sweep's
    /// `pruned` trial was stopped early on purpose: KILLED.
    pub fn of(status: RunStatus) -> MlflowStatus {
        match status {
            RunStatus::Created | RunStatus::Queued => MlflowStatus::Scheduled,
            RunStatus::Running => MlflowStatus::Running,
            RunStatus::Finished => MlflowStatus::Finished,
            RunStatus::Failed | RunStatus::Lost => MlflowStatus::Failed,
            RunStatus::Stopped | RunStatus::Pruned => MlflowStatus::Killed,
        }
    }

    /// The Trainyard statuses that read as this one (for searches).
    pub fn statuses(self) -> &'static [RunStatus] {
        match self {
            MlflowStatus::Scheduled => &[RunStatus::Created, RunStatus::Queued],
            MlflowStatus::Running => &[RunStatus::Running],
            MlflowStatus::Finished => &[RunStatus::Finished],
            MlflowStatus::Failed => &[RunStatus::Failed, RunStatus::Lost],
            MlflowStatus::Killed => &[RunStatus::Stopped, RunStatus::Pruned],
        }
    }

    /// The status a client's update asks for (`None`: SCHEDULED, which only this server's
    /// launcher sets; a run that has not started stays as it is).
    pub fn target(self) -> Option<RunStatus> {
        match self {
            MlflowStatus::Scheduled => None,
            MlflowStatus::Running => Some(RunStatus::Running),
            MlflowStatus::Finished => Some(RunStatus::Finished),
            MlflowStatus::Failed => Some(RunStatus::Failed),
            MlflowStatus::Killed => Some(RunStatus::Stopped),
        }
    }
}

/// The artifact location of an experiment: served by this server's artifact proxy.
pub fn experiment_artifacts(experiment_id: &str) -> String {
    format!("mlflow-artifacts:/{experiment_id}")
}

/// The artifact root of a run (`<experiment>/<run>/artifacts` under the proxy).
pub fn run_artifacts(run: &Run) -> String {
    format!(
        "mlflow-artifacts:/{}/{}/artifacts",
        run.experiment_id, run.id
    )
}

fn key_values<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> Vec<Value> {
    pairs
        .into_iter()
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect()
}

fn lifecycle(deleted_at: Option<i64>) -> &'static str {
    if deleted_at.is_some() {
        "deleted"
    } else {
        "active"
    }
}

pub fn experiment(e: &Experiment) -> Value {
    json!({
        "experiment_id": e.id,
        "name": e.name,
        "artifact_location": experiment_artifacts(&e.id),
        "lifecycle_stage": lifecycle(e.deleted_at),
        "creation_time": e.created_at,
        "last_update_time": e.updated_at,
        "tags": key_values(&e.tags),
    })
}

/// The user a run reads as started by: its creator's account, else what the client reported.
fn user_of(run: &Run) -> String {
    run.created_by
        .clone()
        .or_else(|| run.tags.get(USER_TAG).cloned())
        .unwrap_or_default()
}

pub fn run_info(run: &Run) -> Value {
    let mut info = json!({
        "run_id": run.id,
        "run_uuid": run.id,
        "run_name": run.name,
        "experiment_id": run.experiment_id,
        "user_id": user_of(run),
        "status": MlflowStatus::of(run.status).as_str(),
        "start_time": run.started_at.unwrap_or(run.created_at),
        "artifact_uri": run_artifacts(run),
        "lifecycle_stage": lifecycle(run.deleted_at),
    });
    if let Some(end) = run.ended_at.filter(|_| run.status.is_terminal()) {
        info["end_time"] = json!(end);
    }
    info
}

/// A run as MLflow's `Run`: info, data (latest metrics, params, tags) and inputs.
pub fn run(run: &Run, inputs: &[RunInput]) -> Value {
    let metrics: Vec<Value> = run
        .latest_metrics
        .iter()
        .map(|(k, m)| {
            json!({"key": k, "value": double_json(m.value), "timestamp": m.time, "step": m.step})
        })
        .collect();
    let mut tags = run.tags.clone();
    tags.insert(RUN_NAME_TAG.to_string(), run.name.clone());
    if !run.notes.is_empty() {
        tags.insert(NOTE_TAG.to_string(), run.notes.clone());
    }
    let inputs: Vec<Value> = inputs.iter().map(|i| i.body.clone()).collect();
    json!({
        "info": run_info(run),
        "data": {
            "metrics": metrics,
            "params": key_values(&run.params),
            "tags": key_values(&tags),
        },
        "inputs": {"dataset_inputs": inputs},
    })
}

/// `{key, value}` as requests carry params and tags.
#[derive(Debug, Clone, Deserialize)]
pub struct KeyValue {
    pub key: String,
    #[serde(default)]
    pub value: String,
}

/// A metric as requests carry it. `timestamp` and `step` may arrive as numbers or as strings
/// (protobuf's JSON form of int64); `value` as a number or `"NaN"`/`"Infinity"`.
#[derive(Debug, Clone, Deserialize)]
pub struct Metric {
    pub key: String,
    #[serde(deserialize_with = "double")]
    pub value: f64,
    #[serde(default, deserialize_with = "opt_int")]
    pub timestamp: Option<i64>,
    #[serde(default, deserialize_with = "opt_int")]
    pub step: Option<i64>,
}

/// A number as the protocol sends it: a JSON number or a string holding one (protobuf's JSON
/// form of int64, and `"NaN"`/`"Infinity"` for doubles). Read without building a JSON value,
/// since every metric of a batch has three.
struct Number;

#[derive(Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
    Null,
}

impl<'de> de::Visitor<'de> for Number {
    type Value = Num;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a number")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Num, E> {
        Ok(Num::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Num, E> {
        i64::try_from(v)
            .map(Num::Int)
            .map_err(|_| E::custom(format!("{v} is too large")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Num, E> {
        Ok(Num::Float(v))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Num, E> {
        let t = s.trim();
        if let Ok(i) = t.parse::<i64>() {
            return Ok(Num::Int(i));
        }
        match t {
            "NaN" | "nan" => Ok(Num::Float(f64::NAN)),
            "Infinity" | "inf" => Ok(Num::Float(f64::INFINITY)),
            "-Infinity" | "-inf" => Ok(Num::Float(f64::NEG_INFINITY)),
            _ => t
                .parse::<f64>()
                .map(Num::Float)
                .map_err(|_| E::custom(format!("`{s}` is not a number"))),
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<Num, E> {
        Ok(Num::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Num, E> {
        Ok(Num::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Num, D::Error> {
        d.deserialize_any(Number)
    }
}

/// An int64 field: a JSON number, or a string holding one.
pub fn opt_int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    match d.deserialize_any(Number)? {
        Num::Null => Ok(None),
        Num::Int(i) => Ok(Some(i)),
        Num::Float(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Ok(Some(f as i64)),
        Num::Float(f) => Err(de::Error::custom(format!("{f} is not a whole number"))),
    }
}

/// A double field: a JSON number, or a string holding one (`NaN` and `Infinity` included).
pub fn double<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match d.deserialize_any(Number)? {
        Num::Null => Err(de::Error::custom("null is not a number")),
        Num::Int(i) => Ok(i as f64),
        Num::Float(f) => Ok(f),
    }
}

/// A double as MLflow's server writes it (protobuf's JSON form): a number, or the string
/// `"NaN"`, `"Infinity"` or `"-Infinity"` (JSON has no such numbers).
pub fn double_json(v: f64) -> Value {
    if v.is_nan() {
        Value::from("NaN")
    } else if v.is_infinite() {
        Value::from(if v > 0.0 { "Infinity" } else { "-Infinity" })
    } else {
        Value::from(v)
    }
}

/// `double_json` for a serialized field.
pub fn write_double<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_finite() {
        s.serialize_f64(*v)
    } else {
        serde::Serialize::serialize(&double_json(*v), s)
    }
}

/// A repeated string field: a list, or (from a query string naming it once) one string.
pub fn strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s]),
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                other => Err(de::Error::custom(format!("{other} is not a string"))),
            })
            .collect(),
        Some(other) => Err(de::Error::custom(format!(
            "{other} is not a list of strings"
        ))),
    }
}

/// The fields of a GET request's query string: a name given once is a string, given several
/// times a list (`run_ids=a&run_ids=b`).
pub fn from_query<T: DeserializeOwned>(query: &str) -> MlflowResult<T> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).map_err(|e| {
        MlflowError::invalid("query", format!("the query string is not valid ({e})"))
    })?;
    let mut object = serde_json::Map::new();
    for (k, v) in pairs {
        match object.get_mut(&k) {
            Some(Value::Array(items)) => items.push(Value::String(v)),
            Some(existing) => {
                let first = existing.take();
                *existing = Value::Array(vec![first, Value::String(v)]);
            }
            None => {
                object.insert(k, Value::String(v));
            }
        }
    }
    serde_json::from_value(Value::Object(object))
        .map_err(|e| MlflowError::invalid("query", plain_serde_message(&e.to_string())))
}

/// serde's message without its position suffix, which means nothing to a client.
pub fn plain_serde_message(message: &str) -> String {
    match message.find(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message.to_string(),
    }
}

/// A numeric query field that arrived as a string is accepted; one that is neither is refused.
pub fn opt_usize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    match opt_int(d)? {
        None => Ok(None),
        Some(n) if n >= 0 => Ok(Some(n as usize)),
        Some(n) => Err(de::Error::custom(format!("{n} is negative"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Q {
        #[serde(default, deserialize_with = "strings")]
        run_ids: Vec<String>,
        #[serde(default, deserialize_with = "opt_int")]
        max_results: Option<i64>,
    }

    #[test]
    fn a_query_string_names_a_list_once_or_several_times() {
        let q: Q = from_query("run_ids=a&run_ids=b&max_results=5").expect("query");
        assert_eq!(q.run_ids, ["a", "b"]);
        assert_eq!(q.max_results, Some(5));
        let q: Q = from_query("run_ids=a").expect("query");
        assert_eq!(q.run_ids, ["a"]);
    }

    #[test]
    fn metrics_accept_int64_strings_and_non_finite_values() {
        let m: Metric = serde_json::from_str(
            r#"{"key": "loss", "value": "NaN", "timestamp": "1700000000000", "step": 3}"#,
        )
        .expect("metric");
        assert!(m.value.is_nan());
        assert_eq!(m.timestamp, Some(1_700_000_000_000));
        assert_eq!(m.step, Some(3));
        assert!(serde_json::from_str::<Metric>(r#"{"key": "x", "value": "high"}"#).is_err());
    }

    #[test]
    fn every_trainyard_status_reads_as_the_mlflow_status_that_searches_find_it_by() {
        for status in RunStatus::ALL {
            assert!(
                MlflowStatus::of(status).statuses().contains(&status),
                "{status}"
            );
        }
    }
}
