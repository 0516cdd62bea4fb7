//! The model registry in Trainyard's own API: registered models with their versions and
//! aliases, and registering a run's checkpoint as a version. The same rows as MLflow's registry
//! API (`http::mlflow`), under the same access rules: a model's levels are its experiment's.

use crate::access::audit::AuditAction;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

use crate::access::audit::Actor;
use crate::access::{self, Principal};
use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiJson;
use crate::registry::{self, RegistryError};
use crate::store::accounts::Level;
use crate::store::models::{ModelQuery, ModelRow, VersionQuery, VersionRow};
use crate::store::StoreError;
use crate::validate::limits::check_len;
use crate::validate::{Invalid, Name};

/// Longest description of a version registered here (as through MLflow's API).
const MAX_DESCRIPTION: usize = 5000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/models", get(list_models))
        .route("/models/{id}", get(get_model))
        .route(
            "/models/{id}/aliases/{alias}",
            put(set_alias).delete(delete_alias),
        )
        .route(
            "/runs/{id}/checkpoints/{name}/register",
            post(register_checkpoint),
        )
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::NotFound(message) => ApiError::NotFound(message),
            RegistryError::Invalid(invalid) => invalid.into(),
            RegistryError::Store(e) => e.into(),
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ModelList {
    pub models: Vec<ModelRow>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ModelDetail {
    pub model: ModelRow,
    /// Newest first, each with the run it came from (`run_id`) and its `source`.
    pub versions: Vec<VersionRow>,
}

/// The registered models the caller may read, by name.
#[utoipa::path(get, path = "/api/v1/models", tag = "models",
    responses((status = 200, body = ModelList)))]
pub async fn list_models(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<ModelList>, ApiError> {
    let experiments = access::experiments_at(state.store.as_ref(), &principal, Level::Read).await?;
    let models = state
        .store
        .list_models(&ModelQuery {
            experiments,
            name: None,
        })
        .await?;
    Ok(Json(ModelList { models }))
}

/// A registered model with its versions and aliases.
#[utoipa::path(get, path = "/api/v1/models/{id}", tag = "models",
    params(("id" = String, Path, description = "The model's name")),
    responses((status = 200, body = ModelDetail), (status = 404, body = ErrorBody)))]
pub async fn get_model(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<ModelDetail>, ApiError> {
    let model = state.store.get_model(&name).await?;
    let versions = state
        .store
        .list_versions(&VersionQuery {
            model: Some(name),
            ..VersionQuery::default()
        })
        .await?;
    Ok(Json(ModelDetail { model, versions }))
}

/// `PUT /models/{id}/aliases/{alias}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AliasRequest {
    /// The version the alias names from now on.
    pub version: i64,
}

/// Points an alias (`champion`) at a version, moving it from the one it named.
#[utoipa::path(put, path = "/api/v1/models/{id}/aliases/{alias}", tag = "models",
    params(("id" = String, Path, description = "The model's name"),
           ("alias" = String, Path, description = "The alias, e.g. `champion`")),
    request_body = AliasRequest,
    responses((status = 200, body = VersionRow), (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody)))]
pub async fn set_alias(
    State(state): State<AppState>,
    actor: Actor,
    Path((name, alias)): Path<(String, String)>,
    ApiJson(body): ApiJson<AliasRequest>,
) -> Result<Json<VersionRow>, ApiError> {
    Ok(Json(
        point_alias(&state, &actor, &name, &alias, body.version).await?,
    ))
}

/// Points `alias` of the model `name` at `version` (the caller's EDIT on the model is checked
/// by the route's rule), recorded in the audit log; the API and the model page call this.
pub async fn point_alias(
    state: &AppState,
    actor: &Actor,
    name: &str,
    alias: &str,
    version: i64,
) -> Result<VersionRow, ApiError> {
    let alias = Name::parse("alias", alias)?.into_string();
    if alias.eq_ignore_ascii_case("latest") {
        return Err(
            Invalid::new("alias", "`latest` is reserved: it names the newest version").into(),
        );
    }
    state.store.set_alias(name, &alias, version).await?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelAlias,
            Some(name),
            Some(format!("{alias} -> version {version}")),
        )
        .await;
    Ok(state.store.version_by_alias(name, &alias).await?)
}

/// Removes an alias.
#[utoipa::path(delete, path = "/api/v1/models/{id}/aliases/{alias}", tag = "models",
    params(("id" = String, Path, description = "The model's name"),
           ("alias" = String, Path, description = "The alias")),
    responses((status = 204, description = "Removed"), (status = 404, body = ErrorBody)))]
pub async fn delete_alias(
    State(state): State<AppState>,
    actor: Actor,
    Path((name, alias)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    state.store.delete_alias(&name, &alias).await?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelUnalias,
            Some(&name),
            Some(alias),
        )
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /runs/{id}/checkpoints/{name}/register`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// The registered model to add a version to; created in the run's experiment when it does
    /// not exist.
    pub model: String,
    #[serde(default)]
    pub description: String,
}

/// Registers a checkpoint of the run as the next version of a model (`best` and `latest`
/// register the checkpoint they name now). Needs EDIT on the model, or on the run's experiment
/// for a new model.
#[utoipa::path(post, path = "/api/v1/runs/{id}/checkpoints/{name}/register", tag = "models",
    params(("id" = String, Path, description = "Run id"),
           ("name" = String, Path, description = "Checkpoint name, e.g. `step-000300` or `best`")),
    request_body = RegisterRequest,
    responses((status = 201, body = VersionRow), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn register_checkpoint(
    State(state): State<AppState>,
    actor: Actor,
    Path((id, checkpoint)): Path<(String, String)>,
    ApiJson(body): ApiJson<RegisterRequest>,
) -> Result<(StatusCode, Json<VersionRow>), ApiError> {
    let version = register(
        &state,
        &actor,
        &id,
        &checkpoint,
        &body.model,
        &body.description,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(version)))
}

/// Registers checkpoint `checkpoint` of run `id` as the next version of `model` after the
/// caller's check (EDIT on the model, or on the run's experiment for a new one; READ on the run
/// is the route's rule), recorded in the audit log; the API and the run page call this.
pub async fn register(
    state: &AppState,
    actor: &Actor,
    id: &str,
    checkpoint: &str,
    model: &str,
    description: &str,
) -> Result<VersionRow, ApiError> {
    let model = Name::parse("model", model)?.into_string();
    if model.contains(['/', '@']) {
        return Err(Invalid::new("model", "a model's name may not contain `/` or `@`").into());
    }
    check_len("description", description, MAX_DESCRIPTION)?;
    let run = state.store.get_run(id).await?;
    let principal = &actor.principal;
    match state.store.get_model(&model).await {
        Ok(_) => access::require_model(state, principal, &model, Level::Edit).await?,
        Err(StoreError::NotFound { .. }) => {
            access::require_experiment(
                state,
                principal,
                &run.experiment_id,
                &run.experiment_id,
                Level::Edit,
            )
            .await?
        }
        Err(e) => return Err(e.into()),
    }
    let version = registry::register_checkpoint(
        &state.store,
        &run,
        &state.launcher.run_dir(&run.id),
        checkpoint,
        &model,
        description,
        principal.user_id(),
    )
    .await?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelVersionCreate,
            Some(&format!("{}/{}", version.model, version.version)),
            Some(format!("from run {} {}", run.id, version.source)),
        )
        .await;
    Ok(version)
}
