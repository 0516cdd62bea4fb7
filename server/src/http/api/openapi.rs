//! The OpenAPI 3 document, generated from the handlers' `#[utoipa::path]` attributes.

use std::collections::BTreeMap;

use axum::routing::get;
use axum::{Json, Router};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::app::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "Trainyard API", version = "1", description = "Tracking server REST API v1"),
    paths(
        super::health::healthz,
        super::experiments::create_experiment,
        super::experiments::list_experiments,
        super::runs::create_run,
        super::runs::search_runs,
        super::runs::get_run,
        super::runs::patch_run,
        super::metrics::post_metrics,
        super::metrics::read_series,
        super::metrics::metric_keys,
        super::experts::expert_utilization,
        super::events::run_events,
        super::events::all_events,
        super::launch::stop_run,
        super::logs::get_logs,
        openapi_json,
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "experiments"), (name = "runs"), (name = "metrics"),
        (name = "events", description = "Server-sent events"), (name = "health"),
        (name = "launcher", description = "Launched runs: stop, logs"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

pub fn router() -> Router<AppState> {
    Router::new().route("/openapi.json", get(openapi_json))
}

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "health",
    responses((status = 200, description = "OpenAPI 3 document", body = Object)))]
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

// The wire types live in the trainer crate, which does not depend on utoipa; these mirrors only
// describe them in the document. A unit test below keeps the field names in step.

/// One metric observation.
#[derive(ToSchema)]
#[schema(as = MetricPoint)]
#[allow(dead_code)]
pub struct MetricPointDoc {
    /// e.g. `train/loss`; letters, digits, space and `_-./:@`, at most 250 bytes.
    key: String,
    /// >= 0; writes are idempotent on (run, key, step): the first value wins.
    step: i64,
    /// Must be finite.
    value: f64,
    /// Unix milliseconds; the server's clock when absent.
    time: Option<i64>,
}

/// Body of `POST /api/v1/runs/{id}/metrics`.
#[derive(ToSchema)]
#[schema(as = MetricBatch)]
#[allow(dead_code)]
pub struct MetricBatchDoc {
    /// At most 10,000 points.
    points: Vec<MetricPointDoc>,
}

/// Body of `PATCH /api/v1/runs/{id}`; absent fields are left unchanged.
#[derive(ToSchema)]
#[schema(as = RunPatch)]
#[allow(dead_code)]
pub struct RunPatchDoc {
    name: Option<String>,
    /// Merged into the run's tags.
    tags: Option<BTreeMap<String, String>>,
    notes: Option<String>,
    /// created, queued, running, finished, failed or stopped.
    status: Option<String>,
    /// Why the status changed (needs `status`).
    reason: Option<String>,
    /// Resolved config; write-once.
    #[schema(value_type = Option<Object>)]
    config: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainer::wire::{MetricBatch, MetricPoint, RunPatch, RunStatus};

    fn schema_fields(name: &str) -> Vec<String> {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
        let mut fields: Vec<String> = doc["components"]["schemas"][name]["properties"]
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        fields.sort();
        fields
    }

    fn json_fields(value: serde_json::Value) -> Vec<String> {
        let mut fields: Vec<String> = value
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        fields.sort();
        fields
    }

    #[test]
    fn the_documented_wire_types_have_the_fields_the_real_ones_serialize() {
        let point = MetricPoint {
            key: "k".into(),
            step: 1,
            value: 1.0,
            time: Some(1),
        };
        assert_eq!(
            schema_fields("MetricPoint"),
            json_fields(serde_json::json!(point))
        );
        let batch = MetricBatch { points: vec![] };
        assert_eq!(
            schema_fields("MetricBatch"),
            json_fields(serde_json::json!(batch))
        );
        let patch = RunPatch {
            name: Some("n".into()),
            tags: Some(Default::default()),
            notes: Some("x".into()),
            status: Some(RunStatus::Running),
            reason: Some("r".into()),
            config: Some(serde_json::json!({})),
        };
        assert_eq!(
            schema_fields("RunPatch"),
            json_fields(serde_json::json!(patch))
        );
    }
}
