//! Registered models: create, get, rename, describe, delete, search, their latest versions
//! and tags.

use super::*;

#[derive(Deserialize)]
pub(super) struct CreateModel {
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tags: Vec<KeyValue>,
}

/// The experiment a new model goes to (the `trainyard.experiment` tag, else `Default`), after
/// the caller's check: EDIT there.
pub(super) async fn experiment_of_new_model(
    state: &AppState,
    principal: &Principal,
    tags: &[KeyValue],
) -> MlflowResult<String> {
    let asked = tags
        .iter()
        .find(|t| t.key == EXPERIMENT_TAG)
        .map_or(DEFAULT_EXPERIMENT, |t| t.value.as_str());
    let missing = || MlflowError::not_found(format!("experiment `{asked}` not found"));
    let experiment = match state.store.get_experiment(asked).await {
        Err(StoreError::NotFound { .. }) => return Err(missing()),
        other => other?,
    };
    access::require_experiment(state, principal, &experiment.id, asked, Level::Edit).await?;
    Ok(experiment.id)
}

pub(super) async fn create_model(
    State(state): State<AppState>,
    actor: Actor,
    Fields(body): Fields<CreateModel>,
) -> MlflowResult<Json<Value>> {
    let name = model_name(&body.name)?;
    check_description(&body.description)?;
    for tag in &body.tags {
        check_tag(&tag.key, &tag.value)?;
    }
    let experiment_id = experiment_of_new_model(&state, &actor.principal, &body.tags).await?;
    let model = state
        .store
        .create_model(NewModel {
            name,
            experiment_id,
            description: body.description,
            tags: body.tags.into_iter().map(|t| (t.key, t.value)).collect(),
            created_by: actor.principal.user_id().map(str::to_owned),
        })
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelCreate,
            Some(&model.name),
            None,
        )
        .await;
    Ok(Json(json!({"registered_model": model_json(&model, None)})))
}

/// The model named, after the caller's check of the route's rule on it.
pub(super) async fn model_for(
    state: &AppState,
    caller: &Caller,
    name: &str,
) -> MlflowResult<ModelRow> {
    let name = model_name(name)?;
    caller.may(state, &name).await?;
    state.store.get_model(&name).await.map_err(store_error)
}

pub(super) async fn get_model(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ByName>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &q.name).await?;
    let latest = latest_of(&state, &model.name).await?;
    Ok(Json(
        json!({"registered_model": model_json(&model, latest.as_ref())}),
    ))
}

#[derive(Deserialize)]
pub(super) struct Rename {
    #[serde(default)]
    name: String,
    #[serde(default)]
    new_name: String,
}

pub(super) async fn rename_model(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<Rename>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    let new_name = Name::parse("new_name", &body.new_name)?;
    let renamed = if new_name.as_str() == model.name {
        model
    } else {
        let renamed = state
            .store
            .rename_model(&model.name, new_name.as_str())
            .await
            .map_err(store_error)?;
        actor
            .record(
                state.store.as_ref(),
                AuditAction::ModelRename,
                Some(&renamed.name),
                Some(format!("from {}", model.name)),
            )
            .await;
        renamed
    };
    Ok(Json(
        json!({"registered_model": model_json(&renamed, None)}),
    ))
}

pub(super) async fn update_model(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Describe>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    check_description(&body.description)?;
    state
        .store
        .set_model_description(&model.name, &body.description)
        .await
        .map_err(store_error)?;
    let model = state
        .store
        .get_model(&model.name)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({"registered_model": model_json(&model, None)})))
}

pub(super) async fn delete_model(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<ByName>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    state
        .store
        .delete_model(&model.name)
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelDelete,
            Some(&model.name),
            None,
        )
        .await;
    Ok(Json(json!({})))
}

pub(super) async fn search_models(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<Search>,
) -> MlflowResult<Json<Value>> {
    let filter = RegistryFilter::models(&q.filter)?;
    let descending = check_order(&q.order_by, &["name"])?;
    let query = ModelQuery {
        experiments: readable(&state, &caller.principal).await?,
        name: filter.exact_name(),
    };
    let mut models: Vec<ModelRow> = state
        .store
        .list_models(&query)
        .await
        .map_err(store_error)?
        .into_iter()
        .filter(|m| filter.matches_model(m))
        .collect();
    if descending {
        models.reverse();
    }
    let (models, next) = page(models, q.max_results, q.page_token.as_deref())?;
    let mut out = Vec::with_capacity(models.len());
    for m in &models {
        let latest = latest_of(&state, &m.name).await?;
        out.push(model_json(m, latest.as_ref()));
    }
    Ok(paged("registered_models", out, next))
}

pub(super) async fn latest_versions(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ByName>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &q.name).await?;
    let latest = latest_of(&state, &model.name).await?;
    Ok(Json(
        json!({"model_versions": latest.iter().map(version_json).collect::<Vec<_>>()}),
    ))
}

pub(super) async fn set_model_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Tag>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    check_tag(&body.key, &body.value)?;
    state
        .store
        .set_model_tag(&model.name, &body.key, &body.value)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({})))
}

pub(super) async fn delete_model_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Tag>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    state
        .store
        .delete_model_tag(&model.name, &body.key)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({})))
}
