//! `/api/v1/sweeps`: submit a sweep, list and read sweeps, change a running one, pause, resume
//! and stop it, and follow it live (server-sent events). A sweep belongs to an experiment: the
//! access check asks for the caller's level there (`Rule::Sweep`); submitting needs EDIT on the
//! experiment, like launching a run.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tracing::instrument;

use crate::access::audit::Actor;
use crate::access::revocation::{Scope, StreamAccess};
use crate::access::Principal;
use crate::app::AppState;
use crate::http::api::events::{stream_slot, PeerAddr};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiJson;
use crate::sweeps::change::{Control, SweepChange};
use crate::sweeps::view::{SweepDetail, SweepSummary};
use crate::sweeps::{admit, change, view};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/sweeps", get(list_sweeps).post(submit_sweep))
        .route("/sweeps/{id}", get(get_sweep).patch(change_sweep))
        .route("/sweeps/{id}/pause", post(pause_sweep))
        .route("/sweeps/{id}/resume", post(resume_sweep))
        .route("/sweeps/{id}/stop", post(stop_sweep))
        .route("/sweeps/{id}/events", get(sweep_events))
}

/// `POST /api/v1/sweeps`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitSweep {
    /// The sweep spec: YAML text, or a JSON object (see docs/sweeps.md).
    #[schema(value_type = Object)]
    pub spec: serde_json::Value,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SweepList {
    pub sweeps: Vec<SweepSummary>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListParams {
    /// Only the sweeps of this experiment (id or name).
    pub experiment: Option<String>,
}

/// Starts a sweep.
#[utoipa::path(post, path = "/api/v1/sweeps", tag = "sweeps",
    request_body = SubmitSweep,
    responses(
        (status = 201, description = "Admitted and started", body = SweepDetail),
        (status = 400, description = "The spec cannot run; `field` names the key or parameter", body = ErrorBody),
        (status = 403, description = "A command sweep on a server that does not allow commands", body = ErrorBody),
        (status = 404, description = "An experiment the caller may not add runs to", body = ErrorBody),
    ))]
#[instrument(skip(state, actor, body))]
pub async fn submit_sweep(
    State(state): State<AppState>,
    actor: Actor,
    ApiJson(body): ApiJson<SubmitSweep>,
) -> Result<(StatusCode, Json<SweepDetail>), ApiError> {
    let detail = admit::submit(&state, &actor, &body.spec).await?;
    Ok((StatusCode::CREATED, Json(detail)))
}

/// The sweeps the caller may read, newest first.
#[utoipa::path(get, path = "/api/v1/sweeps", tag = "sweeps",
    params(ListParams),
    responses((status = 200, body = SweepList), (status = 404, body = ErrorBody)))]
#[instrument(skip(state))]
pub async fn list_sweeps(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Query(params): Query<ListParams>,
) -> Result<Json<SweepList>, ApiError> {
    Ok(Json(SweepList {
        sweeps: view::list(&state, &principal, params.experiment.as_deref()).await?,
    }))
}

/// One sweep: spec, state, best trial, every trial (params, objective, step, next rung,
/// status, metric curve), parameter importance and the spec's versions.
#[utoipa::path(get, path = "/api/v1/sweeps/{id}", tag = "sweeps",
    params(("id" = String, Path, description = "Sweep id")),
    responses((status = 200, body = SweepDetail), (status = 404, body = ErrorBody)))]
#[instrument(skip(state))]
pub async fn get_sweep(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<SweepDetail>, ApiError> {
    Ok(Json(view::detail(&state, &id).await?))
}

/// Changes a running or paused sweep: `max_trials`, `parallel`, a parameter's range. The
/// change is a new version of the spec.
#[utoipa::path(patch, path = "/api/v1/sweeps/{id}", tag = "sweeps",
    params(("id" = String, Path, description = "Sweep id")),
    request_body = SweepChange,
    responses(
        (status = 200, body = SweepDetail),
        (status = 400, description = "The changed spec cannot run; `field` names it", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The sweep ended, or changed since `version`", body = ErrorBody),
    ))]
#[instrument(skip(state, actor, body))]
pub async fn change_sweep(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<SweepChange>,
) -> Result<Json<SweepDetail>, ApiError> {
    change::change(&state, &actor, &id, body).await?;
    Ok(Json(view::detail(&state, &id).await?))
}

async fn control(
    state: AppState,
    actor: Actor,
    id: String,
    what: Control,
) -> Result<Json<SweepDetail>, ApiError> {
    change::control(&state, &actor, &id, what).await?;
    Ok(Json(view::detail(&state, &id).await?))
}

/// Launches no new trials; running ones go on and are still judged.
#[utoipa::path(post, path = "/api/v1/sweeps/{id}/pause", tag = "sweeps",
    params(("id" = String, Path, description = "Sweep id")),
    responses((status = 200, body = SweepDetail), (status = 404, body = ErrorBody),
        (status = 409, description = "Not running", body = ErrorBody)))]
pub async fn pause_sweep(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
) -> Result<Json<SweepDetail>, ApiError> {
    control(state, actor, id, Control::Pause).await
}

/// Continues a paused sweep.
#[utoipa::path(post, path = "/api/v1/sweeps/{id}/resume", tag = "sweeps",
    params(("id" = String, Path, description = "Sweep id")),
    responses((status = 200, body = SweepDetail), (status = 404, body = ErrorBody),
        (status = 409, description = "Not paused", body = ErrorBody)))]
pub async fn resume_sweep(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
) -> Result<Json<SweepDetail>, ApiError> {
    control(state, actor, id, Control::Resume).await
}

/// Ends the sweep and stops its running trials.
#[utoipa::path(post, path = "/api/v1/sweeps/{id}/stop", tag = "sweeps",
    params(("id" = String, Path, description = "Sweep id")),
    responses((status = 200, body = SweepDetail), (status = 404, body = ErrorBody),
        (status = 409, description = "Already ended", body = ErrorBody)))]
pub async fn stop_sweep(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
) -> Result<Json<SweepDetail>, ApiError> {
    control(state, actor, id, Control::Stop).await
}

const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The sweep as it changes: `event: sweep` with the whole view (as `GET /api/v1/sweeps/{id}`)
/// at once and after every change (a trial launched, a metric value, a prune, an end, a
/// change of the spec); the stream ends after the sweep ended, or once the caller may no longer
/// read it (a revoked token, a disabled user, a removed grant). It counts against its caller's
/// share of open event streams (`events::stream_slot`).
#[utoipa::path(get, path = "/api/v1/sweeps/{id}/events", tag = "events",
    params(("id" = String, Path, description = "Sweep id")),
    responses(
        (status = 200, description = "text/event-stream of `sweep` events", content_type = "text/event-stream", body = String),
        (status = 404, body = ErrorBody),
        (status = 429, description = "The caller or its address holds its share of open streams; `Retry-After` says when to try again", body = ErrorBody),
    ))]
#[instrument(skip(state, principal, peer))]
pub async fn sweep_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    peer: PeerAddr,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    state.store.get_sweep(&id).await?;
    let slot = stream_slot(&state, &principal, &peer)?;
    // Subscribed before the first read, so no change falls between the two.
    let mut changes = state.sweeps.subscribe(&id);
    let mut access = StreamAccess::new(&state, principal, Scope::Sweep(id.clone()));
    let first = view::detail(&state, &id).await?;
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        // Held for as long as the stream runs.
        let _slot = slot;
        let mut detail = first;
        loop {
            if !access.allowed().await {
                return;
            }
            let over = detail.summary.state.is_over();
            let event = match Event::default()
                .event(crate::live::names::SWEEP)
                .json_data(&detail)
            {
                Ok(event) => event,
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode a sweep event");
                    return;
                }
            };
            if tx.send(event).await.is_err() || over {
                return;
            }
            // Until the sweep changes; a change of access that leaves it readable sends nothing.
            loop {
                tokio::select! {
                    _ = state.live.closed() => return,
                    _ = tx.closed() => return,
                    () = access.changed() => if !access.allowed().await { return },
                    changed = changes.changed() => if changed.is_err() { return } else { break },
                }
            }
            detail = match view::detail(&state, &id).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!(error = %e, "sweep stream failed reading the store");
                    return;
                }
            };
        }
    });
    Ok(Sse::new(ReceiverStream::new(rx).map(Ok)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}
