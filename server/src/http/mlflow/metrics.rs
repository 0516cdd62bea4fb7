//! `runs/log-metric` and `runs/log-batch` (through the same ingest path as the native API, so
//! points stream live and are idempotent), and metric history reads.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::runs::{
    apply_tags, check_key, check_param, check_tag, log_params, loggable, run_for, RunRef,
};
use super::wire::{self, KeyValue, Metric};
use super::{Caller, Fields, MlflowError, MlflowResult};
use crate::app::AppState;
use crate::ingest::ingest_points;
use crate::store::{MetricPoint, StoreError};

/// `log-batch` limits, as MLflow documents and answers them.
pub const MAX_BATCH_METRICS: usize = 1_000;
pub const MAX_BATCH_PARAMS: usize = 100;
pub const MAX_BATCH_TAGS: usize = 100;
pub const MAX_BATCH_ENTITIES: usize = 1_000;
/// Most points one history page holds (the client asks for 25,000 and follows the token).
const HISTORY_PAGE: usize = 25_000;
/// Runs one bulk-interval read may name, and its points per run (default and most).
const BULK_MAX_RUNS: usize = 100;
const BULK_DEFAULT_POINTS: usize = 320;
const BULK_MAX_POINTS: usize = 1_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/runs/log-metric", post(log_metric))
        .route("/runs/log-batch", post(log_batch))
        .route("/metrics/get-history", get(get_history))
        .route("/metrics/get-history-bulk-interval", get(get_history_bulk))
        // The 3.x client asks this when listing a run's artifact folder; this server has no
        // logged models, so the answer is an empty list.
        .route("/logged-models/search", post(no_logged_models))
}

async fn no_logged_models() -> Json<Value> {
    Json(json!({"models": []}))
}

/// Checks every metric's key (before anything of a request is written).
fn check_metrics(metrics: &[Metric]) -> MlflowResult<()> {
    for (i, metric) in metrics.iter().enumerate() {
        check_key(&format!("metrics[{i}].key"), &metric.key)?;
    }
    Ok(())
}

/// Stores checked metrics. A NaN is stored as NaN (read back as `"NaN"`); an infinity is stored
/// as the largest finite number of its sign, as MLflow's own SQL store does.
async fn store_metrics(state: &AppState, run_id: &str, metrics: &[Metric]) -> MlflowResult<()> {
    let now = crate::store::now_ms();
    let points: Vec<MetricPoint> = metrics
        .iter()
        .map(|m| MetricPoint {
            key: m.key.clone(),
            step: m.step.unwrap_or(0),
            // `clamp` keeps NaN as it is.
            value: m.value.clamp(f64::MIN, f64::MAX),
            time: Some(m.timestamp.unwrap_or(now)),
        })
        .collect();
    ingest_points(state.store.as_ref(), &state.live, run_id, &points)
        .await
        .map_err(|e| match e {
            StoreError::Rejected(mut invalid) => {
                invalid.field = invalid.field.replacen("points", "metrics", 1);
                MlflowError::from(invalid)
            }
            other => other.into(),
        })?;
    crate::liveness::seen(state, run_id).await?;
    Ok(())
}

#[derive(Deserialize)]
struct LogMetric {
    #[serde(flatten)]
    run: RunRef,
    #[serde(flatten)]
    metric: Metric,
}

async fn log_metric(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<LogMetric>,
) -> MlflowResult<Json<Value>> {
    let id = body.run.id()?;
    loggable(&state, &caller, id).await?;
    let metrics = [body.metric];
    check_metrics(&metrics)?;
    store_metrics(&state, id, &metrics).await?;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
struct LogBatch {
    #[serde(flatten)]
    run: RunRef,
    #[serde(default)]
    metrics: Vec<Metric>,
    #[serde(default)]
    params: Vec<KeyValue>,
    #[serde(default)]
    tags: Vec<KeyValue>,
}

fn too_many(what: &str, max: usize, got: usize) -> MlflowError {
    MlflowError::invalid(
        what,
        format!("a batch logging request can contain at most {max} {what}; got {got}"),
    )
}

async fn log_batch(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<LogBatch>,
) -> MlflowResult<Json<Value>> {
    let id = body.run.id()?;
    loggable(&state, &caller, id).await?;
    let (m, p, t) = (body.metrics.len(), body.params.len(), body.tags.len());
    if m > MAX_BATCH_METRICS {
        return Err(too_many("metrics", MAX_BATCH_METRICS, m));
    }
    if p > MAX_BATCH_PARAMS {
        return Err(too_many("params", MAX_BATCH_PARAMS, p));
    }
    if t > MAX_BATCH_TAGS {
        return Err(too_many("tags", MAX_BATCH_TAGS, t));
    }
    if m + p + t > MAX_BATCH_ENTITIES {
        return Err(too_many(
            "metrics, params and tags",
            MAX_BATCH_ENTITIES,
            m + p + t,
        ));
    }
    // Everything is checked before anything is written.
    check_metrics(&body.metrics)?;
    for param in &body.params {
        check_param(param)?;
    }
    for tag in &body.tags {
        check_tag(tag)?;
    }
    log_params(&state, id, &body.params).await?;
    apply_tags(&state, id, &body.tags).await?;
    if !body.metrics.is_empty() {
        store_metrics(&state, id, &body.metrics).await?;
    }
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
struct History {
    #[serde(flatten)]
    run: RunRef,
    #[serde(default)]
    metric_key: String,
    #[serde(default)]
    page_token: Option<String>,
    #[serde(default, deserialize_with = "wire::opt_usize")]
    max_results: Option<usize>,
}

/// A page of history, serialized straight from the points (pages hold up to 25,000).
#[derive(Serialize)]
struct HistoryPage<'a> {
    metrics: Vec<HistoryPoint<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_page_token: Option<String>,
}

#[derive(Serialize)]
struct HistoryPoint<'a> {
    key: &'a str,
    #[serde(serialize_with = "wire::write_double")]
    value: f64,
    timestamp: i64,
    step: i64,
}

async fn get_history(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<History>,
) -> MlflowResult<axum::response::Response> {
    let id = q.run.id()?;
    caller.may(&state, id).await?;
    if q.metric_key.is_empty() {
        return Err(MlflowError::invalid("metric_key", "must be given"));
    }
    let size = match q.max_results {
        None => HISTORY_PAGE,
        Some(0) => return Err(MlflowError::invalid("max_results", "must be at least 1")),
        Some(n) => n.min(HISTORY_PAGE),
    };
    // The token is the last step of the previous page.
    let after = match q.page_token.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => Some(
            t.parse::<i64>()
                .map_err(|_| MlflowError::invalid("page_token", "not a token this server gave"))?,
        ),
    };
    let mut points = state
        .store
        .metric_history(id, &q.metric_key, after, size + 1)
        .await?;
    let more = points.len() > size;
    points.truncate(size);
    let next_page_token = more
        .then(|| points.last().map(|p| p.step.to_string()))
        .flatten();
    let metrics = points
        .iter()
        .map(|p| HistoryPoint {
            key: &q.metric_key,
            value: p.value,
            timestamp: p.time,
            step: p.step,
        })
        .collect();
    Ok(Json(HistoryPage {
        metrics,
        next_page_token,
    })
    .into_response())
}

#[derive(Deserialize)]
struct Bulk {
    #[serde(default, deserialize_with = "wire::strings")]
    run_ids: Vec<String>,
    #[serde(default)]
    metric_key: String,
    #[serde(default, deserialize_with = "wire::opt_int")]
    start_step: Option<i64>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    end_step: Option<i64>,
    #[serde(default, deserialize_with = "wire::opt_usize")]
    max_results: Option<usize>,
}

/// Each run's points of one key, downsampled as the dashboard's charts are (every bucket keeps
/// its lowest and highest point).
async fn get_history_bulk(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<Bulk>,
) -> MlflowResult<Json<Value>> {
    if q.run_ids.is_empty() || q.run_ids.len() > BULK_MAX_RUNS {
        return Err(MlflowError::invalid(
            "run_ids",
            format!("name 1 to {BULK_MAX_RUNS} runs"),
        ));
    }
    if q.metric_key.is_empty() {
        return Err(MlflowError::invalid("metric_key", "must be given"));
    }
    let per_run = match q.max_results {
        None => BULK_DEFAULT_POINTS,
        Some(n) if (1..=BULK_MAX_POINTS).contains(&n) => n,
        Some(n) => {
            return Err(MlflowError::invalid(
                "max_results",
                format!("{n} is not between 1 and {BULK_MAX_POINTS}"),
            ))
        }
    };
    let mut metrics = Vec::new();
    for id in &q.run_ids {
        let run = run_for(&state, &caller, id).await?;
        let series = state
            .store
            .read_series(
                &run.id,
                &q.metric_key,
                q.start_step,
                q.end_step,
                per_run.max(2),
            )
            .await?;
        metrics.extend(series.points.iter().take(per_run).map(|p| {
            json!({"key": q.metric_key, "value": wire::double_json(p.value), "timestamp": p.time,
                   "step": p.step, "run_id": run.id})
        }));
    }
    Ok(Json(json!({"metrics": metrics})))
}
