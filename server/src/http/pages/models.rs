//! The Models pages: every registered model the caller may read, and one model with its
//! versions (each linked back to the run and checkpoint it came from), its aliases, a form to
//! point an alias, and a launch that fine-tunes from `model:NAME@ALIAS`. The run page's
//! checkpoints panel registers a checkpoint through [`register`].

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Form, Path, State};
use axum::response::{IntoResponse, Redirect};
use axum::Extension;
use serde::Deserialize;

use super::views::{enc, fmt_time};
use super::{check_run_id, html, PageResult};
use crate::access::audit::Actor;
use crate::access::{self, Principal};
use crate::app::AppState;
use crate::store::accounts::Level;
use crate::store::models::{ModelQuery, VersionQuery};

pub struct ModelListRow {
    pub name: String,
    pub href: String,
    pub experiment: String,
    pub versions: i64,
    pub aliases: String,
    pub updated: String,
    pub description: String,
}

#[derive(Template)]
#[template(path = "models.html")]
pub struct ModelsPage {
    pub nav: &'static str,
    pub rows: Vec<ModelListRow>,
}

pub struct VersionView {
    pub version: i64,
    pub source: String,
    pub run_id: String,
    pub run_href: String,
    pub aliases: String,
    pub created: String,
    pub creator: String,
    pub description: String,
    /// The launch form with `training.init_from` set to this version (a checkpoint only).
    pub launch_href: String,
    /// The checkpoint as a tar archive, and as a Hugging Face directory (a checkpoint only).
    pub archive_href: String,
    pub hf_href: String,
}

pub struct AliasView {
    pub alias: String,
    pub version: i64,
    pub launch_href: String,
}

#[derive(Template)]
#[template(path = "model.html")]
pub struct ModelPage {
    pub nav: &'static str,
    pub name: String,
    pub description: String,
    pub experiment: String,
    pub experiment_href: String,
    pub versions: Vec<VersionView>,
    pub aliases: Vec<AliasView>,
    /// Whether the caller may point aliases (EDIT on the model); why not otherwise.
    pub may_edit: bool,
    pub alias_action: String,
}

/// The launch form of a LoRA fine-tune that starts from `reference` (`NAME@ALIAS` or
/// `NAME/VERSION`): the checkpoint's training keys, `training.init_from: model:<reference>`.
fn launch_href(reference: &str) -> String {
    format!("/launch?model={}", enc(reference))
}

async fn experiment_name(state: &AppState, id: &str) -> String {
    match state.store.get_experiment(id).await {
        Ok(e) => e.name,
        Err(_) => id.to_string(),
    }
}

pub async fn models_page(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> PageResult {
    let experiments = access::experiments_at(state.store.as_ref(), &principal, Level::Read).await?;
    let models = state
        .store
        .list_models(&ModelQuery {
            experiments,
            name: None,
        })
        .await?;
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut rows = Vec::with_capacity(models.len());
    for m in models {
        if !names.contains_key(&m.experiment_id) {
            let name = experiment_name(&state, &m.experiment_id).await;
            names.insert(m.experiment_id.clone(), name);
        }
        rows.push(ModelListRow {
            href: format!("/models/{}", enc(&m.name)),
            experiment: names.get(&m.experiment_id).cloned().unwrap_or_default(),
            versions: m.last_version,
            aliases: m
                .aliases
                .iter()
                .map(|(a, v)| format!("{a} → v{v}"))
                .collect::<Vec<_>>()
                .join(", "),
            updated: fmt_time(m.updated_at),
            description: m.description,
            name: m.name,
        });
    }
    html(ModelsPage {
        nav: "models",
        rows,
    })
}

pub async fn model_page(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> PageResult {
    let model = state.store.get_model(&name).await?;
    let versions = state
        .store
        .list_versions(&VersionQuery {
            model: Some(name.clone()),
            ..VersionQuery::default()
        })
        .await?;
    let may_edit = access::level_on_model(&state, &principal, &model).await? >= Level::Edit
        && principal.may_write();
    let versions = versions
        .into_iter()
        .map(|v| {
            let checkpoint = v.source.starts_with("checkpoint:");
            let files = format!("/api/v1/models/{}/versions/{}", enc(&v.model), v.version);
            VersionView {
                archive_href: if checkpoint {
                    format!("{files}/archive")
                } else {
                    String::new()
                },
                hf_href: if checkpoint {
                    format!("{files}/export/hf")
                } else {
                    String::new()
                },
                launch_href: if checkpoint {
                    launch_href(&format!("{}/{}", v.model, v.version))
                } else {
                    String::new()
                },
                run_href: v
                    .run_id
                    .as_deref()
                    .map(|r| format!("/runs/{r}"))
                    .unwrap_or_default(),
                run_id: v.run_id.unwrap_or_default(),
                aliases: v.aliases.join(", "),
                created: fmt_time(v.created_at),
                creator: v.creator.unwrap_or_default(),
                description: v.description,
                source: v.source,
                version: v.version,
            }
        })
        .collect();
    let aliases = model
        .aliases
        .iter()
        .map(|(alias, version)| AliasView {
            launch_href: launch_href(&format!("{}@{alias}", model.name)),
            alias: alias.clone(),
            version: *version,
        })
        .collect();
    html(ModelPage {
        nav: "models",
        experiment: experiment_name(&state, &model.experiment_id).await,
        experiment_href: format!("/experiments/{}", model.experiment_id),
        alias_action: format!("/models/{}/aliases", enc(&model.name)),
        description: model.description,
        name: model.name,
        versions,
        aliases,
        may_edit,
    })
}

#[derive(Deserialize)]
pub struct AliasForm {
    #[serde(default)]
    alias: String,
    #[serde(default)]
    version: String,
}

/// The model page's "Set alias" form.
pub async fn set_alias(
    State(state): State<AppState>,
    actor: Actor,
    Path(name): Path<String>,
    Form(f): Form<AliasForm>,
) -> PageResult {
    let version = f.version.trim().parse::<i64>().map_err(|_| {
        crate::validate::Invalid::new(
            "version",
            format!("version must be a version number, got `{}`", f.version),
        )
    })?;
    crate::http::api::models::point_alias(&state, &actor, &name, &f.alias, version).await?;
    Ok(Redirect::to(&format!("/models/{}", enc(&name))).into_response())
}

#[derive(Deserialize)]
pub struct RegisterForm {
    #[serde(default)]
    model: String,
}

/// The checkpoints panel's "Register" form: the next version of the model named, then the
/// model's page.
pub async fn register(
    State(state): State<AppState>,
    actor: Actor,
    Path((id, checkpoint)): Path<(String, String)>,
    Form(f): Form<RegisterForm>,
) -> PageResult {
    check_run_id(&id)?;
    let version =
        crate::http::api::models::register(&state, &actor, &id, &checkpoint, &f.model, "").await?;
    Ok(Redirect::to(&format!("/models/{}", enc(&version.model))).into_response())
}
