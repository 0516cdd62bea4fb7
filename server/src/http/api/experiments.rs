//! `POST/GET /api/v1/experiments`, one experiment, and who may do what in it (its grants).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use tracing::instrument;

use crate::access::audit::AuditAction;
use crate::access::{audit, Principal};
use crate::actions::sharing::parse_level;
pub use crate::actions::sharing::{apply_grant, GrantChange};
use crate::app::AppState;
use crate::http::access::Client;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiJson;
use crate::store::accounts::{Grant, Level};
use crate::store::Experiment;
use crate::validate::Name;

pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/experiments",
            get(list_experiments).post(create_experiment),
        )
        .route(
            "/experiments/{id}",
            get(get_experiment).patch(change_experiment),
        )
        .route("/experiments/{id}/grants", get(list_grants).put(set_grant))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateExperiment {
    pub name: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ExperimentList {
    pub experiments: Vec<Experiment>,
}

/// Creates an experiment; names are unique.
#[utoipa::path(post, path = "/api/v1/experiments", tag = "experiments",
    request_body = CreateExperiment,
    responses(
        (status = 201, description = "Created", body = Experiment),
        (status = 409, description = "An experiment with that name exists", body = ErrorBody),
        (status = 422, description = "Invalid name", body = ErrorBody),
    ))]
#[instrument(skip(state, body))]
pub async fn create_experiment(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<CreateExperiment>,
) -> Result<(StatusCode, Json<Experiment>), ApiError> {
    let name = Name::parse("name", &body.name)?;
    // The creator owns it (MANAGE); everyone else gets the server's default level.
    let experiment = state
        .store
        .create_experiment_owned(
            name.as_str(),
            principal.user_id(),
            state.settings.default_level,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(experiment)))
}

/// Lists every experiment.
#[utoipa::path(get, path = "/api/v1/experiments", tag = "experiments",
    responses((status = 200, body = ExperimentList)))]
#[instrument(skip(state))]
pub async fn list_experiments(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<ExperimentList>, ApiError> {
    let mut experiments = state
        .store
        .list_experiments(crate::store::Lifecycle::Active)
        .await?;
    crate::access::retain_readable(state.store.as_ref(), &principal, &mut experiments).await?;
    Ok(Json(ExperimentList { experiments }))
}

/// One experiment, by id or name.
#[utoipa::path(get, path = "/api/v1/experiments/{id}", tag = "experiments",
    params(("id" = String, Path, description = "Experiment id or name")),
    responses(
        (status = 200, body = Experiment),
        (status = 404, description = "No such experiment (or not readable)", body = ErrorBody),
    ))]
pub async fn get_experiment(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Experiment>, ApiError> {
    Ok(Json(state.store.get_experiment(&id).await?))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExperimentChange {
    /// A new name (unique).
    #[serde(default)]
    pub name: Option<String>,
    /// The level every signed-in user has on it: `none`, `read` or `edit`.
    #[serde(default)]
    pub default_level: Option<String>,
}

/// Renames an experiment or changes its default level (MANAGE).
#[utoipa::path(patch, path = "/api/v1/experiments/{id}", tag = "experiments",
    params(("id" = String, Path, description = "Experiment id or name")),
    request_body = ExperimentChange,
    responses(
        (status = 200, body = Experiment),
        (status = 404, description = "No such experiment (or not readable)", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, description = "Invalid name or level", body = ErrorBody),
    ))]
pub async fn change_experiment(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ExperimentChange>,
) -> Result<Json<Experiment>, ApiError> {
    let experiment = state.store.get_experiment(&id).await?;
    if let Some(text) = &body.default_level {
        let level = parse_level("default_level", text, Level::Edit)?;
        state
            .store
            .set_experiment_default_level(&experiment.id, level)
            .await?;
        // Open streams of those who lose access stop at once (`access::revocation`).
        state.access_epoch.bump();
        let detail = Some(format!("default level {}", level.as_str()));
        audit::by(
            state.store.as_ref(),
            &principal,
            client.as_deref(),
            AuditAction::GrantSet,
            Some(&experiment.name),
            detail,
        )
        .await;
    }
    if let Some(name) = &body.name {
        let name = Name::parse("name", name)?;
        state
            .store
            .rename_experiment(&experiment.id, name.as_str())
            .await?;
        let detail = Some(format!("renamed to {}", name.as_str()));
        audit::by(
            state.store.as_ref(),
            &principal,
            client.as_deref(),
            AuditAction::ExperimentRename,
            Some(&experiment.name),
            detail,
        )
        .await;
    }
    Ok(Json(state.store.get_experiment(&experiment.id).await?))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GrantList {
    /// The owner's user name (MANAGE), when there is one.
    pub owner: Option<String>,
    /// What every signed-in user has.
    pub default_level: String,
    pub grants: Vec<Grant>,
}

/// Who has which level on an experiment.
#[utoipa::path(get, path = "/api/v1/experiments/{id}/grants", tag = "experiments",
    params(("id" = String, Path, description = "Experiment id or name")),
    responses(
        (status = 200, body = GrantList),
        (status = 404, description = "No such experiment (or not readable)", body = ErrorBody),
    ))]
pub async fn list_grants(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<GrantList>, ApiError> {
    let experiment = state.store.get_experiment(&id).await?;
    let sharing = state.store.experiment_sharing(&experiment.id).await?;
    Ok(Json(GrantList {
        owner: sharing.owner,
        default_level: sharing.default_level.as_str().to_owned(),
        grants: state.store.list_grants(&experiment.id).await?,
    }))
}

/// Grants a user or team a level on the experiment (MANAGE); `none` removes the grant.
#[utoipa::path(put, path = "/api/v1/experiments/{id}/grants", tag = "experiments",
    params(("id" = String, Path, description = "Experiment id or name")),
    request_body = GrantChange,
    responses(
        (status = 200, body = GrantList),
        (status = 404, description = "No such experiment, user or team", body = ErrorBody),
        (status = 422, description = "Neither or both of user and team, or an unknown level", body = ErrorBody),
    ))]
pub async fn set_grant(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<GrantChange>,
) -> Result<Json<GrantList>, ApiError> {
    let experiment = state.store.get_experiment(&id).await?;
    apply_grant(&state, &principal, client.as_deref(), &experiment, &body).await?;
    list_grants(State(state), Path(experiment.id)).await
}
