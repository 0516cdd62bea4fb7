//! The OpenAPI 3 document, generated from the handlers' `#[utoipa::path]` attributes.

use std::collections::BTreeMap;

use axum::routing::get;
use axum::{Json, Router};
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, Response};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::app::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "Trainyard API", version = "1", description = "Tracking server REST API v1"),
    paths(
        super::health::healthz,
        super::account::whoami,
        super::account::sign_in,
        super::account::sign_out,
        super::account::list_tokens,
        super::account::create_token,
        super::account::revoke_token,
        super::admin::list_users,
        super::admin::add_user,
        super::admin::change_user,
        super::admin::list_teams,
        super::admin::add_team,
        super::admin::add_member,
        super::admin::remove_member,
        super::admin::list_audit,
        super::experiments::create_experiment,
        super::experiments::list_experiments,
        super::experiments::get_experiment,
        super::experiments::change_experiment,
        super::experiments::list_grants,
        super::experiments::set_grant,
        super::runs::create_run,
        super::runs::search_runs,
        super::runs::get_run,
        super::runs::patch_run,
        super::runs::delete_run,
        super::runs::heartbeat,
        super::metrics::post_metrics,
        super::metrics::read_series,
        super::metrics::metric_keys,
        super::experts::expert_utilization,
        super::events::run_events,
        super::events::all_events,
        super::launch::stop_run,
        super::launch::mark_ended,
        super::checkpoints::list_checkpoints,
        super::checkpoints::download,
        super::export::export_hf,
        super::checkpoints::sample,
        super::checkpoints::resume,
        super::logs::get_logs,
        super::charts::run_chart_layout,
        super::charts::run_chart,
        super::charts::compare_chart,
        super::sweeps::submit_sweep,
        super::sweeps::list_sweeps,
        super::sweeps::get_sweep,
        super::sweeps::change_sweep,
        super::sweeps::pause_sweep,
        super::sweeps::resume_sweep,
        super::sweeps::stop_sweep,
        super::sweeps::sweep_events,
        super::models::list_models,
        super::models::get_model,
        super::models::set_alias,
        super::models::delete_alias,
        super::models::register_checkpoint,
        super::model_files::download_version,
        super::model_files::export_version,
        openapi_json,
    ),
    components(schemas(ServerSentEventDoc)),
    modifiers(&BearerAuth, &StandardResponses),
    tags(
        (name = "account", description = "Signing in and out; personal access tokens"),
        (name = "admin", description = "Users, teams and the audit log"),
        (name = "experiments"), (name = "runs"), (name = "metrics"),
        (name = "events", description = "Server-sent events"), (name = "health"),
        (name = "launcher", description = "Launched runs: stop, resume, logs"),
        (name = "checkpoints", description = "A launched run's checkpoints"),
        (name = "models", description = "The model registry: registered models, versions, aliases"),
        (name = "charts", description = "Chart layout of a run, and charts rendered as SVG or PNG"),
        (name = "sweeps", description = "Hyperparameter sweeps: submit, follow, change, pause, resume, stop"),
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

/// Documents the error responses every route shares, from the shape of its operation, so no
/// route can forget one: 401 under `/api/v1` (a server with an admin token), 400 and 404 for a
/// path with an id, 400 for query parameters, 400/413/415/422 for a JSON body, and 500. A
/// route's own codes (409, 403...) are in its `#[utoipa::path]`.
struct StandardResponses;

impl Modify for StandardResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            let api = path.starts_with("/api/v1/");
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for operation in operations.into_iter().flatten() {
                add_standard_responses(operation, api);
                describe_event_streams(operation);
            }
        }
    }
}

fn add_standard_responses(operation: &mut Operation, api: bool) {
    let has_param = |place: ParameterIn| {
        operation
            .parameters
            .iter()
            .flatten()
            .any(|p| p.parameter_in == place)
    };
    let (in_path, in_query) = (has_param(ParameterIn::Path), has_param(ParameterIn::Query));
    let has_body = operation.request_body.is_some();
    let mut codes: Vec<(&str, &str)> = Vec::new();
    if api {
        codes.push((
            "401",
            "Not signed in, or a bearer token that is wrong, expired or revoked (a server with \
             accounts or an admin token)",
        ));
        codes.push((
            "403",
            "Signed in, but the caller's level on the experiment (or its token's scope) does \
             not allow this",
        ));
    }
    if in_path {
        codes.push(("400", "A path parameter that does not decode"));
        codes.push(("404", "No run with that id"));
    }
    if in_query {
        codes.push((
            "400",
            "A query parameter that does not parse (`field` names it)",
        ));
    }
    if has_body {
        codes.push(("400", "A body that is not JSON"));
        codes.push(("413", "A body larger than the server accepts"));
        codes.push(("415", "A body whose Content-Type is not application/json"));
        codes.push((
            "422",
            "JSON with a wrong or over-long field (`field` names it)",
        ));
    }
    codes.push((
        "500",
        "Internal error: logged by the server, never detailed in the response",
    ));
    for (code, description) in codes {
        operation
            .responses
            .responses
            .entry(code.to_string())
            .or_insert_with(|| error_response(description));
    }
}

/// In OpenAPI 3.1 the schema of a `text/event-stream` response describes one event, not the
/// stream's text: every stream of this API is documented with [`ServerSentEventDoc`].
fn describe_event_streams(operation: &mut Operation) {
    for response in operation.responses.responses.values_mut() {
        let RefOr::T(response) = response else {
            continue;
        };
        if let Some(stream) = response.content.get_mut("text/event-stream") {
            stream.schema = Some(Ref::from_schema_name("ServerSentEvent").into());
        }
    }
}

fn error_response(description: &str) -> RefOr<Response> {
    let content = Content::new(Some(Ref::from_schema_name("ErrorBody")));
    RefOr::T(
        utoipa::openapi::ResponseBuilder::new()
            .description(description)
            .content("application/json", content)
            .build(),
    )
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

/// One event of a `text/event-stream` response.
#[derive(ToSchema)]
#[schema(as = ServerSentEvent)]
#[allow(dead_code)]
pub struct ServerSentEventDoc {
    /// The event's name: `points`, `status`, `log` or `end` (see the operation).
    event: String,
    /// A JSON document.
    data: String,
    /// Where a reconnecting client resumes (`Last-Event-ID`), on streams that can resume.
    id: Option<String>,
}

/// One metric observation.
#[derive(ToSchema)]
#[schema(as = MetricPoint)]
#[allow(dead_code)]
pub struct MetricPointDoc {
    /// e.g. `train/loss`; letters, digits, space and `_-./:@`, at most 250 bytes.
    key: String,
    /// >= 0; writes are idempotent on (run, key, step): the first value wins.
    step: i64,
    /// A finite number, or `null` for NaN (a diverged loss; it is stored and read back as
    /// `null`, drawn as a gap, and found by `metrics.<key> IS NAN`). Infinities are refused.
    #[schema(nullable)]
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
    /// At most 200 bytes, one line.
    name: Option<String>,
    /// Merged into the run's tags (keys like names, values at most 4 KiB, 256 tags a run).
    tags: Option<BTreeMap<String, String>>,
    /// At most 64 KiB.
    notes: Option<String>,
    /// created, queued, running, finished, failed or stopped; only changes the run lifecycle
    /// allows (409 otherwise).
    status: Option<String>,
    /// Why the status changed (needs `status`); at most 4 KiB.
    reason: Option<String>,
    /// Resolved config; write-once; at most 256 KiB as JSON and 32 levels deep.
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
