//! `POST/GET /api/v1/runs/{id}/metrics`, `GET /api/v1/runs/{id}/metric-keys`.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tracing::instrument;
use trainer::wire::MetricBatch;

use super::openapi::MetricBatchDoc;
use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::ingest::ingest_points;
use crate::store::{Conflict, MetricKey, Series};

/// Points returned by a series read when `max_points` is absent, and the most allowed.
pub const DEFAULT_MAX_POINTS: usize = 1000;
pub const MAX_MAX_POINTS: usize = 100_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/runs/{id}/metrics", get(read_series).post(post_metrics))
        .route("/runs/{id}/metric-keys", get(metric_keys))
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Accepted {
    /// Points in the request; all of them are stored now.
    pub accepted: usize,
    /// Points that were new (a re-sent batch stores nothing twice).
    pub stored: usize,
    /// Points whose (key, step) was already stored, or repeated earlier in this request, with
    /// another value. Writes stay idempotent: the stored value is kept and this one ignored.
    pub conflicts: usize,
    /// The first ten conflicting points, in request order, with both values.
    pub first_conflicts: Vec<Conflict>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SeriesParams {
    /// Metric key, e.g. `train/loss`.
    pub key: Option<String>,
    /// 2..=100000, default 1000. Longer series are downsampled keeping each bucket's min and max.
    pub max_points: Option<String>,
    /// Inclusive lower step bound.
    pub start_step: Option<String>,
    /// Inclusive upper step bound.
    pub end_step: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MetricKeyList {
    pub keys: Vec<MetricKey>,
}

fn parse_i64(field: &str, text: Option<&str>) -> Result<Option<i64>, ApiError> {
    text.filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<i64>().map_err(|_| {
                ApiError::bad_request(field, format!("{field} must be an integer, got `{t}`"))
            })
        })
        .transpose()
}

/// Appends up to 10,000 points in one transaction; idempotent on (run, key, step): a point
/// already stored keeps its first value, and one sent again with another value is counted in
/// `conflicts`.
#[utoipa::path(post, path = "/api/v1/runs/{id}/metrics", tag = "metrics",
    params(("id" = String, Path, description = "Run id")),
    request_body = MetricBatchDoc,
    responses(
        (status = 200, body = Accepted),
        (status = 404, description = "Unknown run", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Invalid point (the field names it)", body = ErrorBody),
        (status = 503, description = "The database is unavailable; retry after Retry-After \
            seconds (nothing was stored)", body = ErrorBody),
        (status = 507, description = "The database is out of disk space (nothing was \
            stored)", body = ErrorBody),
    ))]
#[instrument(skip(state, batch), fields(points = batch.points.len()))]
pub async fn post_metrics(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(batch): ApiJson<MetricBatch>,
) -> Result<Json<Accepted>, ApiError> {
    let outcome = ingest_points(state.store.as_ref(), &state.live, &id, &batch.points).await?;
    crate::liveness::seen(&state, &id).await?;
    Ok(Json(Accepted {
        accepted: outcome.accepted,
        stored: outcome.stored,
        conflicts: outcome.conflicts,
        first_conflicts: outcome.first_conflicts,
    }))
}

/// One metric's series, downsampled to at most `max_points` keeping every bucket's extremes.
#[utoipa::path(get, path = "/api/v1/runs/{id}/metrics", tag = "metrics",
    params(("id" = String, Path, description = "Run id"), SeriesParams),
    responses(
        (status = 200, body = Series),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ))]
#[instrument(skip(state))]
pub async fn read_series(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(params): ApiQuery<SeriesParams>,
) -> Result<Json<Series>, ApiError> {
    let key = match params.key.as_deref() {
        Some(k) if !k.is_empty() => k,
        _ => {
            return Err(ApiError::bad_request(
                "key",
                "key is required, e.g. key=train/loss",
            ))
        }
    };
    let max_points = match params.max_points.as_deref() {
        None | Some("") => DEFAULT_MAX_POINTS,
        Some(t) => match t.parse::<usize>() {
            Ok(n) if (2..=MAX_MAX_POINTS).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(
                    "max_points",
                    format!("max_points must be an integer from 2 to {MAX_MAX_POINTS}, got `{t}`"),
                ))
            }
        },
    };
    let start = parse_i64("start_step", params.start_step.as_deref())?;
    let end = parse_i64("end_step", params.end_step.as_deref())?;
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(ApiError::bad_request(
                "start_step",
                format!("start_step ({s}) is after end_step ({e})"),
            ));
        }
    }
    // The store answers a missing run with NotFound (a 404), not an empty series.
    let series = state
        .store
        .read_series(&id, key, start, end, max_points)
        .await?;
    Ok(Json(series))
}

/// Every metric key of the run with its point count and latest value.
#[utoipa::path(get, path = "/api/v1/runs/{id}/metric-keys", tag = "metrics",
    params(("id" = String, Path, description = "Run id")),
    responses((status = 200, body = MetricKeyList), (status = 404, body = ErrorBody)))]
#[instrument(skip(state))]
pub async fn metric_keys(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<MetricKeyList>, ApiError> {
    let keys = state.store.metric_keys(&id).await?; // NotFound for a missing run
    Ok(Json(MetricKeyList { keys }))
}
