//! A registered model version's files: the checkpoint it points at as a tar archive, and the
//! same checkpoint as a Hugging Face `transformers` directory (the run export's exporter, on
//! that one checkpoint). The version's source names the checkpoint; it is found among the
//! checkpoints its run lists (`registry::version_checkpoint`), so no request or stored text
//! reaches the file system unchecked. Both need READ on the model (its experiment).

use std::path::PathBuf;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};

use super::export::{expected_size, export, principal_key, EXPORTS_DIR};
use crate::access::Principal;
use crate::app::AppState;
use crate::checkpoints::archive;
use crate::checkpoints::exports::Made;
use crate::http::access::Client;
use crate::http::error::{ApiError, ErrorBody};
use crate::store::models::VersionRow;
use crate::validate::Invalid;

pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/models/{id}/versions/{version}/archive",
            get(download_version),
        )
        .route(
            "/models/{id}/versions/{version}/export/hf",
            get(export_version),
        )
}

/// The version number in the path.
fn version_number(text: &str) -> Result<i64, ApiError> {
    text.parse::<i64>().ok().filter(|v| *v >= 1).ok_or_else(|| {
        Invalid::new(
            "version",
            format!("version must be a version number (1, 2, ...), got `{text}`"),
        )
        .into()
    })
}

/// A file name part made of the model's name: letters, digits, `-`, `_` and `.`; others `_`.
fn file_stem(model: &str, version: i64) -> String {
    let name: String = model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{}-v{version}", name.trim_start_matches('.'))
}

/// The version and its checkpoint directory.
async fn checkpoint_of(
    state: &AppState,
    model: &str,
    version: &str,
) -> Result<(VersionRow, PathBuf), ApiError> {
    let version = version_number(version)?;
    let data_dir = &state.settings.data_dir;
    Ok(crate::registry::version_checkpoint(&state.store, model, version, data_dir).await?)
}

/// Streams `files` as a tar archive holding one folder, `root`; `hold` is dropped once the
/// last byte is sent or the client is gone.
fn tar_response<H: Send + 'static>(
    root: String,
    files: Vec<(String, PathBuf, u64)>,
    hold: H,
) -> Response {
    let len = archive::archive_len(&files);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let disposition = format!("attachment; filename=\"{root}.tar\"");
    tokio::task::spawn_blocking(move || {
        if let Err(e) = archive::write(&root, &files, &tx) {
            // The client sees a short body; the length header tells it the download broke.
            tracing::warn!(error = %e, "a model version download ended early");
        }
        drop(hold);
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    (
        [
            (header::CONTENT_TYPE, "application/x-tar".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        body,
    )
        .into_response()
}

/// The checkpoint a version points at, as an uncompressed tar archive holding one folder,
/// `<model>-v<version>` (the checkpoint's files, as the run's checkpoint download has them).
#[utoipa::path(get, path = "/api/v1/models/{id}/versions/{version}/archive", tag = "models",
    params(("id" = String, Path, description = "Model name"),
           ("version" = i64, Path, description = "Version number")),
    responses(
        (status = 200, description = "A tar archive", content_type = "application/x-tar"),
        (status = 404, description = "No such model or version, a version of MLflow \
            artifacts, or a checkpoint no longer here (the message says which)", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn download_version(
    State(state): State<AppState>,
    Path((model, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (row, dir) = checkpoint_of(&state, &model, &version).await?;
    let files = tokio::task::spawn_blocking(move || archive::files(&dir))
        .await
        .map_err(|e| ApiError::Internal(e.into()))?
        .map_err(|e| ApiError::Internal(anyhow::Error::from(e).context("listing a checkpoint")))?;
    Ok(tar_response(file_stem(&row.model, row.version), files, ()))
}

/// The checkpoint a version points at as a Hugging Face directory (`config.json`,
/// `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`, LoRA adapters merged) in an
/// uncompressed tar archive holding one folder, `<model>-v<version>-hf`. Bounded as the run
/// export is: overlapping downloads of a version share one export, a credential has at most
/// two open, and an export the disk has no room for is refused.
#[utoipa::path(get, path = "/api/v1/models/{id}/versions/{version}/export/hf", tag = "models",
    params(("id" = String, Path, description = "Model name"),
           ("version" = i64, Path, description = "Version number")),
    responses(
        (status = 200, description = "A tar archive", content_type = "application/x-tar"),
        (status = 404, body = ErrorBody),
        (status = 422, description = "The version is not a number", body = ErrorBody),
        (status = 409, description = "The checkpoint's model fits no transformers \
            architecture (the message names the keys)", body = ErrorBody),
        (status = 429, description = "This credential already has two exports downloading",
            body = ErrorBody),
        (status = 507, description = "The disk has no room for the export", body = ErrorBody),
    ))]
pub async fn export_version(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    client: Client,
    Path((model, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (row, dir) = checkpoint_of(&state, &model, &version).await?;
    let run_id = row.run_id.clone().unwrap_or_default();
    let run_dir = state.launcher.run_dir(&run_id);
    // Held until the download's last byte is sent or the client is gone.
    let turn = state.exports.admit(&principal_key(&principal, &client))?;
    let shared = state.exports.shared_by(&dir, &run_dir.join(EXPORTS_DIR));
    let params = match state.store.get_run(&run_id).await {
        Ok(run) => run.latest_metrics.get("model/params").map(|m| m.value),
        Err(_) => None,
    };
    let source = dir.clone();
    let made = state
        .exports
        .made(
            &shared,
            move || expected_size(&source, params),
            move |out| export(&dir, out),
        )
        .await?;
    let files = match made {
        Made::Files(files) => files,
        Made::Refused(message) => {
            return Err(ApiError::Conflict {
                field: None,
                message,
            })
        }
    };
    let root = format!("{}-hf", file_stem(&row.model, row.version));
    Ok(tar_response(root, files, (shared, turn)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_models_name_becomes_a_safe_file_name() {
        assert_eq!(file_stem("tiny-lm", 3), "tiny-lm-v3");
        assert_eq!(file_stem("team a/b \"x\"", 1), "team_a_b__x_-v1");
        assert_eq!(file_stem("..hidden", 2), "hidden-v2");
    }

    #[test]
    fn a_version_in_the_path_is_a_positive_number() {
        assert_eq!(version_number("7").ok(), Some(7));
        for bad in ["0", "-1", "latest", ""] {
            assert!(version_number(bad).is_err(), "{bad}");
        }
    }
}
