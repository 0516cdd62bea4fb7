//! Registered models as a launch's weights: `training.init_from: model:NAME@ALIAS` (or
//! `model:NAME/VERSION`, `model:NAME/latest`, and the same in `training.dpo.reference`) is
//! resolved, at admission, to the checkpoint directory the version points at, which the launch's
//! path checks then treat like any other run's checkpoint (READ on that run). The config stores
//! the resolved path, so a later move of the alias does not change what the run started from;
//! the run's tag `trainyard.init_model` keeps the reference and the version it resolved to.

use std::path::Path;

use trainer::config::Config;

use crate::access::{self, Principal};
use crate::error::Error;
use crate::registry::{ModelRef, RegistryError, Source};
use crate::state::AppState;
use crate::store::accounts::Level;
use crate::store::StoreError;
use crate::validate::Invalid;

/// The tag a launched run carries when it started from a registered model.
pub const INIT_MODEL_TAG: &str = "trainyard.init_model";

/// Resolves the model references of `cfg` in place (see the module comment); returns what
/// `training.init_from` resolved to (`NAME@ALIAS -> version N`), for the run's tag.
pub async fn resolve_model_weights(
    state: &AppState,
    principal: &Principal,
    cfg: &mut Config,
    data_dir: &Path,
) -> Result<Option<String>, RegistryError> {
    let mut described = None;
    if let Some(written) = cfg.training.init_from.clone() {
        if let Some(path) =
            resolve_one(state, principal, "training.init_from", &written, data_dir).await?
        {
            described = Some(format!("{written} -> version {}", path.1));
            cfg.training.init_from = Some(path.0);
        }
    }
    let reference = cfg.training.dpo.reference.clone();
    if let Some(path) = resolve_one(
        state,
        principal,
        "training.dpo.reference",
        &reference,
        data_dir,
    )
    .await?
    {
        cfg.training.dpo.reference = path.0;
    }
    Ok(described)
}

/// The checkpoint directory and version number a reference names; `None` when `written` is not
/// a model reference.
async fn resolve_one(
    state: &AppState,
    principal: &Principal,
    key: &str,
    written: &str,
    data_dir: &Path,
) -> Result<Option<(String, i64)>, RegistryError> {
    let Some(parsed) = ModelRef::parse(key, written.trim()) else {
        return Ok(None);
    };
    let reference = parsed?;
    // A model the caller may not read is "not found", in the same words as one that is not.
    let missing = |what: String| Invalid::new(key, format!("{key}: `{written}`: {what}"));
    match access::require_model(state, principal, &reference.name, Level::Read).await {
        Ok(()) => {}
        Err(Error::Store(e)) => return Err(e.into()),
        Err(_) => return Err(missing(format!("no registered model `{}`", reference.name)).into()),
    }
    let version = match reference.resolve(&state.store).await {
        Ok(v) => v,
        Err(StoreError::NotFound { entity, id }) => {
            return Err(missing(format!("no {entity} `{id}`")).into())
        }
        Err(e) => return Err(e.into()),
    };
    let source = crate::registry::parse_source(key, &version.source)?;
    let (Source::Checkpoint { name }, Some(run_id)) = (&source, version.run_id.as_deref()) else {
        return Err(missing(format!(
            "version {} is {}, not a checkpoint a run can start from (register a run's \
             checkpoint from its page, or POST /api/v1/runs/<run>/checkpoints/<name>/register)",
            version.version, version.source
        ))
        .into());
    };
    let dir = trainer::checkpoint::checkpoints_dir(&crate::launcher::run_dir(data_dir, run_id))
        .join(name);
    Ok(Some((dir.display().to_string(), version.version)))
}
