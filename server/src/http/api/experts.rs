//! `GET /api/v1/runs/{id}/expert-utilization`: MoE telemetry served as one matrix per layer.
//!
//! The trainer reports the share of routed tokens per expert as ordinary metric keys,
//! `moe/layer{L}/expert{E}` (plus `moe/layer{L}/dropped` and `moe/layer{L}/entropy`; the format
//! lives in `trainer::wire::moe_keys`), so they go through the one ingest path and are
//! idempotent like every point. This endpoint regroups them into a steps × experts matrix per
//! layer, the shape a heatmap draws.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tracing::instrument;
use trainer::wire::moe_keys;

use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiQuery;
use crate::store::SeriesPoint;

/// Matrix rows returned when `max_steps` is absent, and the most allowed.
pub const DEFAULT_MAX_STEPS: usize = 500;
pub const MAX_MAX_STEPS: usize = 10_000;

pub fn router() -> Router<AppState> {
    Router::new().route("/runs/{id}/expert-utilization", get(expert_utilization))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UtilizationParams {
    /// 1..=10000, default 500: most rows (steps) per layer; longer histories are subsampled
    /// evenly, always keeping the latest step.
    pub max_steps: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LayerUtilization {
    pub layer: u32,
    /// Number of experts (columns).
    pub experts: u32,
    /// Row labels, ascending.
    pub steps: Vec<i64>,
    /// `fractions[row][expert]`: share of the layer's routed tokens sent to that expert at
    /// `steps[row]` (rows sum to 1); null where the expert has no point at or before that step.
    pub fractions: Vec<Vec<Option<f64>>>,
    /// Share of tokens dropped for capacity at each step (null when not reported).
    pub dropped: Vec<Option<f64>>,
    /// Router entropy at each step (null when not reported).
    pub entropy: Vec<Option<f64>>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExpertUtilization {
    /// One entry per MoE layer, by layer index; empty for a dense run.
    pub layers: Vec<LayerUtilization>,
}

/// Per-layer, per-expert routing shares over time, as matrices for heatmaps.
#[utoipa::path(get, path = "/api/v1/runs/{id}/expert-utilization", tag = "metrics",
    params(("id" = String, Path, description = "Run id"), UtilizationParams),
    responses(
        (status = 200, body = ExpertUtilization),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ))]
#[instrument(skip(state))]
pub async fn expert_utilization(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(params): ApiQuery<UtilizationParams>,
) -> Result<Json<ExpertUtilization>, ApiError> {
    let max_steps = match params.max_steps.as_deref() {
        None | Some("") => DEFAULT_MAX_STEPS,
        Some(t) => match t.parse::<usize>() {
            Ok(n) if (1..=MAX_MAX_STEPS).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(
                    "max_steps",
                    format!("max_steps must be an integer from 1 to {MAX_MAX_STEPS}, got `{t}`"),
                ))
            }
        },
    };
    let keys = state.store.metric_keys(&id).await?; // NotFound for a missing run
    let mut experts_per_layer: BTreeMap<u32, u32> = BTreeMap::new();
    for k in &keys {
        if let Some((layer, expert)) = moe_keys::parse_expert(&k.key) {
            let n = experts_per_layer.entry(layer).or_insert(0);
            *n = (*n).max(expert + 1);
        }
    }
    // Each key is read at a resolution a little above the matrix's, so every kept row can be
    // filled from a real point at or just before its step.
    let read_points = (max_steps * 2).clamp(2, super::metrics::MAX_MAX_POINTS);
    let mut layers = Vec::with_capacity(experts_per_layer.len());
    for (layer, experts) in experts_per_layer {
        let mut columns = Vec::with_capacity(experts as usize);
        for e in 0..experts {
            let key = moe_keys::expert(layer as usize, e as usize);
            let series = state
                .store
                .read_series(&id, &key, None, None, read_points)
                .await?;
            columns.push(series.points);
        }
        let mut extra = Vec::with_capacity(2);
        for key in [
            moe_keys::dropped(layer as usize),
            moe_keys::entropy(layer as usize),
        ] {
            let series = state
                .store
                .read_series(&id, &key, None, None, read_points)
                .await?;
            extra.push(series.points);
        }
        let steps = row_steps(&columns, max_steps);
        let fractions = steps
            .iter()
            .map(|&s| columns.iter().map(|c| value_at(c, s)).collect())
            .collect();
        let dropped = steps.iter().map(|&s| value_at(&extra[0], s)).collect();
        let entropy = steps.iter().map(|&s| value_at(&extra[1], s)).collect();
        layers.push(LayerUtilization {
            layer,
            experts,
            steps,
            fractions,
            dropped,
            entropy,
        });
    }
    Ok(Json(ExpertUtilization { layers }))
}

/// The union of the columns' steps, thinned evenly to at most `max` rows, keeping the last.
fn row_steps(columns: &[Vec<SeriesPoint>], max: usize) -> Vec<i64> {
    let all: Vec<i64> = columns
        .iter()
        .flat_map(|c| c.iter().map(|p| p.step))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if all.len() <= max {
        return all;
    }
    // Evenly spaced indices from 0 to len-1 inclusive.
    (0..max)
        .map(|i| all[i * (all.len() - 1) / (max - 1).max(1)])
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The value of the latest point at or before `step` (points are in step order).
fn value_at(points: &[SeriesPoint], step: i64) -> Option<f64> {
    let idx = points.partition_point(|p| p.step <= step);
    idx.checked_sub(1).map(|i| points[i].value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(steps: &[i64]) -> Vec<SeriesPoint> {
        steps
            .iter()
            .map(|&step| SeriesPoint {
                step,
                value: step as f64,
                time: 0,
            })
            .collect()
    }

    #[test]
    fn rows_are_the_union_of_steps_when_they_fit() {
        let rows = row_steps(&[pts(&[0, 10, 20]), pts(&[10, 30])], 10);
        assert_eq!(rows, vec![0, 10, 20, 30]);
    }

    #[test]
    fn thinned_rows_keep_the_first_and_last_step_and_respect_the_limit() {
        let steps: Vec<i64> = (0..1000).map(|s| s * 10).collect();
        let rows = row_steps(&[pts(&steps)], 50);
        assert!(rows.len() <= 50);
        assert_eq!(rows.first(), Some(&0));
        assert_eq!(rows.last(), Some(&9990));
        assert!(rows.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_cell_takes_the_latest_value_at_or_before_its_step() {
        let column = pts(&[10, 20]);
        assert_eq!(value_at(&column, 5), None);
        assert_eq!(value_at(&column, 10), Some(10.0));
        assert_eq!(value_at(&column, 19), Some(10.0));
        assert_eq!(value_at(&column, 25), Some(20.0));
    }
}
