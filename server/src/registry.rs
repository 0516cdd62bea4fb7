//! The model registry's rules, below HTTP: what a version's source may be and which run it
//! names, where a version is downloaded from, and `model:NAME@ALIAS` references. The store
//! keeps the rows (`store::models`); the MLflow registry API (`http::mlflow::registry`) calls
//! these.

use std::path::Path;

use crate::store::models::{NewModel, NewVersion, VersionRow};
use crate::store::{DynStore, Run, StoreError};
use crate::validate::Invalid;

/// Why a registry use case did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// What the request names does not exist (a checkpoint of the run).
    #[error("{0}")]
    NotFound(String),
    #[error("{}: {}", .0.field, .0.message)]
    Invalid(Invalid),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<Invalid> for RegistryError {
    fn from(e: Invalid) -> Self {
        RegistryError::Invalid(e)
    }
}

/// Registers the checkpoint `checkpoint` (a listed name: `step-000300`, `best`, `latest`) of
/// `run`, whose directory is `run_dir`, as the next version of the model `model`, creating the
/// model in the run's experiment when it does not exist. The version's source is the
/// checkpoint's own directory name, so `best` registers the checkpoint that is best now. The
/// caller has checked the access (EDIT on the model, or on the experiment for a new one).
pub async fn register_checkpoint(
    store: &DynStore,
    run: &Run,
    run_dir: &Path,
    checkpoint: &str,
    model: &str,
    description: &str,
    created_by: Option<&str>,
) -> Result<VersionRow, RegistryError> {
    let dir = run_dir.to_path_buf();
    let wanted = checkpoint.to_string();
    let found = tokio::task::spawn_blocking(move || crate::checkpoints::find(&dir, &wanted))
        .await
        .ok()
        .flatten();
    let Some(name) =
        found.and_then(|(_, path)| path.file_name().map(|n| n.to_string_lossy().into_owned()))
    else {
        return Err(RegistryError::NotFound(format!(
            "checkpoint `{checkpoint}` of run `{}` not found",
            run.id
        )));
    };
    match store.get_model(model).await {
        Ok(_) => {}
        Err(StoreError::NotFound { .. }) => {
            let new = NewModel {
                name: model.to_string(),
                experiment_id: run.experiment_id.clone(),
                created_by: created_by.map(str::to_owned),
                ..NewModel::default()
            };
            // Created meanwhile by someone else: a conflict, since the caller's access was
            // checked for a new model, not for that one.
            store.create_model(new).await?;
        }
        Err(e) => return Err(e.into()),
    }
    let version = NewVersion {
        run_id: Some(run.id.clone()),
        source: format!("checkpoint:{name}"),
        description: description.to_string(),
        created_by: created_by.map(str::to_owned),
        ..NewVersion::default()
    };
    Ok(store.create_version(model, version).await?)
}

/// What a version points at, parsed from its `source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Files under a run's artifacts: `mlflow-artifacts:/<experiment>/<run>/artifacts/<path>`
    /// (what the MLflow client sends) or `runs:/<run>/<path>`.
    RunArtifacts { run_id: String, path: String },
    /// A checkpoint directory of the version's run: `checkpoint:<name>` (`step-1200`).
    Checkpoint { name: String },
}

/// Longest `source` a version may have.
pub const MAX_SOURCE_BYTES: usize = 4096;

/// Why a source is refused, in the words the field's error gives.
const SOURCES: &str = "a version's source is the run's artifacts \
     (mlflow-artifacts:/<experiment>/<run>/artifacts/<path> or runs:/<run>/<path>) or one of its \
     checkpoints (checkpoint:<name>); this server registers only what it keeps";

/// Parses a version's source (field `field`).
pub fn parse_source(field: &str, source: &str) -> Result<Source, Invalid> {
    if source.len() > MAX_SOURCE_BYTES {
        return Err(Invalid::new(
            field,
            format!(
                "is {} bytes long; at most {MAX_SOURCE_BYTES} are allowed",
                source.len()
            ),
        ));
    }
    let run_path = |rest: &str| -> Option<(String, String)> {
        let (run, path) = rest.split_once('/').unwrap_or((rest, ""));
        let run_ok = !run.is_empty() && run.chars().all(|c| c.is_ascii_alphanumeric());
        let path_ok = !path.split('/').any(|p| p == ".." || p == ".");
        (run_ok && path_ok).then(|| (run.to_string(), path.trim_matches('/').to_string()))
    };
    let parsed = if let Some(rest) = source.strip_prefix("mlflow-artifacts:/") {
        // <experiment>/<run>/artifacts[/<path>]
        let mut parts = rest.trim_start_matches('/').splitn(3, '/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(_experiment), Some(run), Some(rest)) => {
                let rest = rest
                    .strip_prefix("artifacts")
                    .filter(|r| r.is_empty() || r.starts_with('/'));
                rest.and_then(|r| run_path(&format!("{run}{r}")))
            }
            _ => None,
        }
    } else if let Some(rest) = source.strip_prefix("runs:/") {
        run_path(rest.trim_start_matches('/'))
    } else if let Some(name) = source.strip_prefix("checkpoint:") {
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && name != "."
            && name != "..";
        return if ok {
            Ok(Source::Checkpoint {
                name: name.to_string(),
            })
        } else {
            Err(Invalid::new(
                field,
                format!("`{name}` is not a checkpoint name (such as step-1200)"),
            ))
        };
    } else {
        None
    };
    match parsed {
        Some((run_id, path)) => Ok(Source::RunArtifacts { run_id, path }),
        None => Err(Invalid::new(field, format!("`{source}`: {SOURCES}"))),
    }
}

/// Where an MLflow client downloads a version's files: the artifact proxy's URI of the files
/// the source names (`experiment_id` is the source run's experiment). `None` for a checkpoint,
/// which the MLflow artifact protocol does not serve (Trainyard's own API streams it as an
/// archive).
pub fn download_uri(source: &Source, experiment_id: &str) -> Option<String> {
    match source {
        Source::RunArtifacts { run_id, path } => Some(
            format!("mlflow-artifacts:/{experiment_id}/{run_id}/artifacts/{path}")
                .trim_end_matches('/')
                .to_string(),
        ),
        Source::Checkpoint { .. } => None,
    }
}

/// The checkpoint directory version `version` of `model` points at, with the version: found
/// among the checkpoints the run lists (`checkpoints::find`), so what a stored source names
/// never reaches the file system unchecked and the path stays inside the run's directory.
/// `data_dir` is the server's data root. A version of MLflow artifacts, or one whose checkpoint
/// is gone, is `NotFound` in words that say which.
pub async fn version_checkpoint(
    store: &DynStore,
    model: &str,
    version: i64,
    data_dir: &Path,
) -> Result<(VersionRow, std::path::PathBuf), RegistryError> {
    let row = store.get_version(model, version).await?;
    let source = parse_source("source", &row.source)?;
    let (Source::Checkpoint { name }, Some(run_id)) = (&source, row.run_id.as_deref()) else {
        return Err(RegistryError::NotFound(format!(
            "version {version} of model `{model}` is {}, not a checkpoint: download MLflow \
             artifacts with mlflow (models:/{model}/{version})",
            row.source
        )));
    };
    let dir = crate::launcher::run_dir(data_dir, run_id);
    let wanted = name.clone();
    let found = tokio::task::spawn_blocking(move || crate::checkpoints::find(&dir, &wanted))
        .await
        .ok()
        .flatten();
    match found {
        Some((_, path)) => Ok((row, path)),
        None => Err(RegistryError::NotFound(format!(
            "version {version} of model `{model}`: checkpoint `{name}` of run `{run_id}` is no \
             longer on this server"
        ))),
    }
}

/// Which version of a model a reference picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    Alias(String),
    Version(i64),
    /// The highest version number.
    Latest,
}

/// `model:NAME@ALIAS`, `model:NAME/3` or `model:NAME/latest` (`models:` is read the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    pub name: String,
    pub pick: Pick,
}

impl ModelRef {
    /// `None` when `text` is not a model reference at all (no `model:` prefix).
    pub fn parse(field: &str, text: &str) -> Option<Result<ModelRef, Invalid>> {
        let rest = text
            .strip_prefix("model:")
            .or_else(|| text.strip_prefix("models:/"))?;
        let bad = || {
            Invalid::new(
                field,
                format!(
                    "`{text}` is not a model reference: write model:NAME@ALIAS, model:NAME/VERSION \
                     or model:NAME/latest"
                ),
            )
        };
        let parsed = if let Some((name, alias)) = rest.split_once('@') {
            (!name.is_empty() && !alias.is_empty()).then(|| ModelRef {
                name: name.to_string(),
                pick: Pick::Alias(alias.to_string()),
            })
        } else if let Some((name, version)) = rest.rsplit_once('/') {
            let pick = if version == "latest" {
                Some(Pick::Latest)
            } else {
                version
                    .parse::<i64>()
                    .ok()
                    .filter(|v| *v > 0)
                    .map(Pick::Version)
            };
            pick.filter(|_| !name.is_empty()).map(|pick| ModelRef {
                name: name.to_string(),
                pick,
            })
        } else {
            None
        };
        Some(parsed.ok_or_else(bad))
    }

    /// The version the reference picks now.
    pub async fn resolve(&self, store: &DynStore) -> Result<VersionRow, StoreError> {
        match &self.pick {
            Pick::Alias(alias) => store.version_by_alias(&self.name, alias).await,
            Pick::Version(v) => store.get_version(&self.name, *v).await,
            Pick::Latest => {
                let model = store.get_model(&self.name).await?;
                let query = crate::store::models::VersionQuery {
                    model: Some(model.name.clone()),
                    ..Default::default()
                };
                store
                    .list_versions(&query)
                    .await?
                    .into_iter()
                    .next()
                    .ok_or_else(|| StoreError::NotFound {
                        entity: "model version",
                        id: format!("{}/latest", self.name),
                    })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_name_a_run_and_a_path_inside_it_or_a_checkpoint() {
        let run = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            parse_source(
                "source",
                &format!("mlflow-artifacts:/3/{run}/artifacts/model")
            ),
            Ok(Source::RunArtifacts {
                run_id: run.into(),
                path: "model".into()
            })
        );
        assert_eq!(
            parse_source("source", &format!("runs:/{run}/model/")),
            Ok(Source::RunArtifacts {
                run_id: run.into(),
                path: "model".into()
            })
        );
        assert_eq!(
            parse_source("source", "checkpoint:step-100"),
            Ok(Source::Checkpoint {
                name: "step-100".into()
            })
        );
        for bad in [
            "/etc/passwd",
            "s3://bucket/model",
            "checkpoint:../x",
            &format!("runs:/{run}/../other"),
            &format!("mlflow-artifacts:/3/{run}/elsewhere/model"),
        ] {
            let refused = parse_source("source", bad).expect_err(bad);
            assert_eq!(refused.field, "source");
        }
        let source = parse_source("source", &format!("runs:/{run}/model")).expect("parse");
        assert_eq!(
            download_uri(&source, "3").as_deref(),
            Some(format!("mlflow-artifacts:/3/{run}/artifacts/model").as_str())
        );
    }

    #[test]
    fn model_references_pick_an_alias_a_number_or_the_latest() {
        let parse = |t: &str| ModelRef::parse("training.init_from", t);
        assert_eq!(parse("/data/ckpt"), None);
        assert_eq!(
            parse("model:gpt@champion"),
            Some(Ok(ModelRef {
                name: "gpt".into(),
                pick: Pick::Alias("champion".into())
            }))
        );
        assert_eq!(
            parse("model:gpt/3").and_then(Result::ok).map(|r| r.pick),
            Some(Pick::Version(3))
        );
        assert_eq!(
            parse("model:gpt/latest")
                .and_then(Result::ok)
                .map(|r| r.pick),
            Some(Pick::Latest)
        );
        for bad in [
            "model:",
            "model:gpt",
            "model:@x",
            "model:gpt/zero",
            "model:gpt/0",
        ] {
            assert!(matches!(parse(bad), Some(Err(_))), "{bad}");
        }
    }
}
