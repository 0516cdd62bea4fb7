//! Aliases: a model's names for one of its versions (`champion`), set, removed and resolved.

use super::*;

#[derive(Deserialize)]
pub(super) struct Alias {
    #[serde(default)]
    name: String,
    #[serde(default)]
    alias: String,
    #[serde(default, deserialize_with = "wire::opt_int")]
    version: Option<i64>,
}

pub(super) fn alias_name(alias: &str) -> MlflowResult<String> {
    let parsed = Name::parse("alias", alias)?;
    // `latest` and `v<number>` read as versions in `models:/` URIs; MLflow refuses them too.
    let reserved = parsed.as_str().eq_ignore_ascii_case("latest")
        || parsed
            .as_str()
            .strip_prefix(['v', 'V'])
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    if reserved {
        return Err(MlflowError::invalid(
            "alias",
            format!("`{alias}` is reserved: `latest` and v<number> name versions"),
        ));
    }
    Ok(parsed.into_string())
}

pub(super) async fn set_alias(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<Alias>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    let alias = alias_name(&body.alias)?;
    let version = version_number(body.version)?;
    state
        .store
        .set_alias(&model.name, &alias, version)
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelAlias,
            Some(&model.name),
            Some(format!("{alias} -> version {version}")),
        )
        .await;
    Ok(Json(json!({})))
}

pub(super) async fn delete_alias(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<Alias>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    state
        .store
        .delete_alias(&model.name, &body.alias)
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelUnalias,
            Some(&model.name),
            Some(body.alias.clone()),
        )
        .await;
    Ok(Json(json!({})))
}

pub(super) async fn version_by_alias(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<Alias>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &q.name).await?;
    let version = state
        .store
        .version_by_alias(&model.name, &q.alias)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({"model_version": version_json(&version)})))
}
