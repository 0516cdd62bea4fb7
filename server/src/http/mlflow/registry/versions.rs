//! Model versions: create from a run's artifacts or checkpoint, get, describe, delete,
//! search, their download URI and tags.

use super::*;

#[derive(Deserialize)]
pub(super) struct CreateVersion {
    #[serde(default)]
    name: String,
    #[serde(default)]
    source: String,
    #[serde(default)]
    run_id: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tags: Vec<KeyValue>,
}

/// A version's source, and the run it comes from, after the caller's check: READ on that run.
/// A source naming a run's artifacts names the run; `run_id`, when given too, must be the same.
pub(super) async fn checked_source(
    state: &AppState,
    principal: &Principal,
    source: &str,
    run_id: Option<&str>,
) -> MlflowResult<(Source, String)> {
    let parsed = rules::parse_source("source", source)?;
    let run_id = match (&parsed, run_id.filter(|r| !r.is_empty())) {
        (Source::RunArtifacts { run_id: named, .. }, Some(given)) if named != given => {
            return Err(MlflowError::invalid(
                "run_id",
                format!("`{given}` is not the run the source names (`{named}`)"),
            ))
        }
        (Source::RunArtifacts { run_id, .. }, _) => run_id.clone(),
        (Source::Checkpoint { .. }, Some(given)) => given.to_string(),
        (Source::Checkpoint { .. }, None) => {
            return Err(MlflowError::invalid(
                "run_id",
                "a checkpoint source needs the run it belongs to",
            ))
        }
    };
    access::require_run(state, principal, &run_id, Level::Read).await?;
    Ok((parsed, run_id))
}

pub(super) async fn create_version(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<CreateVersion>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    check_description(&body.description)?;
    for tag in &body.tags {
        check_tag(&tag.key, &tag.value)?;
    }
    let (_, run_id) = checked_source(
        &state,
        &actor.principal,
        &body.source,
        body.run_id.as_deref(),
    )
    .await?;
    let version = state
        .store
        .create_version(
            &model.name,
            NewVersion {
                run_id: Some(run_id.clone()),
                source: body.source,
                description: body.description,
                tags: body.tags.into_iter().map(|t| (t.key, t.value)).collect(),
                created_by: actor.principal.user_id().map(str::to_owned),
            },
        )
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelVersionCreate,
            Some(&format!("{}/{}", version.model, version.version)),
            Some(format!("from run {run_id}")),
        )
        .await;
    Ok(Json(json!({"model_version": version_json(&version)})))
}

pub(super) async fn version_for(
    state: &AppState,
    caller: &Caller,
    name: &str,
    version: Option<i64>,
) -> MlflowResult<VersionRow> {
    let model = model_for(state, caller, name).await?;
    let number = version_number(version)?;
    state
        .store
        .get_version(&model.name, number)
        .await
        .map_err(store_error)
}

pub(super) async fn get_version(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ByVersion>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &q.name, q.version).await?;
    Ok(Json(json!({"model_version": version_json(&version)})))
}

pub(super) async fn update_version(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Describe>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &body.name, body.version).await?;
    check_description(&body.description)?;
    state
        .store
        .set_version_description(&version.model, version.version, &body.description)
        .await
        .map_err(store_error)?;
    let version = state
        .store
        .get_version(&version.model, version.version)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({"model_version": version_json(&version)})))
}

pub(super) async fn delete_version(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<ByVersion>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &body.name, body.version).await?;
    state
        .store
        .delete_version(&version.model, version.version)
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelVersionDelete,
            Some(&format!("{}/{}", version.model, version.version)),
            None,
        )
        .await;
    Ok(Json(json!({})))
}

pub(super) async fn search_versions(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<Search>,
) -> MlflowResult<Json<Value>> {
    let filter = RegistryFilter::versions(&q.filter)?;
    check_order(&q.order_by, &["name", "version_number"])?;
    let query = VersionQuery {
        experiments: readable(&state, &caller.principal).await?,
        model: filter.exact_name(),
        run_id: None,
    };
    let versions: Vec<VersionRow> = state
        .store
        .list_versions(&query)
        .await
        .map_err(store_error)?
        .into_iter()
        .filter(|v| filter.matches_version(v))
        .collect();
    let (versions, next) = page(versions, q.max_results, q.page_token.as_deref())?;
    let out = versions.iter().map(version_json).collect();
    Ok(paged("model_versions", out, next))
}

pub(super) async fn download_uri(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ByVersion>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &q.name, q.version).await?;
    let source = rules::parse_source("source", &version.source)?;
    let experiment_id = match &source {
        Source::RunArtifacts { run_id, .. } => {
            state
                .store
                .get_run(run_id)
                .await
                .map_err(store_error)?
                .experiment_id
        }
        Source::Checkpoint { .. } => String::new(),
    };
    let uri = rules::download_uri(&source, &experiment_id).ok_or_else(|| {
        MlflowError::invalid(
            "version",
            format!(
                "version {} of `{}` is a checkpoint ({}): download it from Trainyard's API \
                 (GET /api/v1/runs/<run>/checkpoints/<name>/archive), not as MLflow artifacts",
                version.version, version.model, version.source
            ),
        )
    })?;
    Ok(Json(json!({"artifact_uri": uri})))
}

pub(super) async fn set_version_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Tag>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &body.name, body.version).await?;
    check_tag(&body.key, &body.value)?;
    state
        .store
        .set_version_tag(&version.model, version.version, &body.key, &body.value)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({})))
}

pub(super) async fn delete_version_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Tag>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &body.name, body.version).await?;
    state
        .store
        .delete_version_tag(&version.model, version.version, &body.key)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({})))
}
