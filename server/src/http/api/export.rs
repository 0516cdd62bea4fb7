//! A finished run's model as a Hugging Face `transformers` directory, downloaded as a tar
//! archive. The trainer's exporter (what `trainyard export --format hf RUN_DIR OUT_DIR` runs)
//! writes the run's best, else latest, checkpoint, LoRA adapters merged, into a directory of
//! its own inside the run directory; the archive is streamed from there like a checkpoint's.
//! Nothing in the request names a path: the run id picks the run directory, the trainer's
//! layout picks the checkpoint.
//!
//! What a client can make the server hold is bounded (`checkpoints::exports`): downloads of a
//! run that overlap share one export directory, removed when the last of them ends; a
//! principal has at most a few downloads open (429); an export the disk has no room for is
//! refused (507).

use std::path::Path as FsPath;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use tracing::instrument;

use crate::access::Principal;
use crate::app::AppState;
use crate::checkpoints::exports::{ExportError, Made, EXPORT_RETRY_AFTER_S};
use crate::checkpoints::{self, archive};
use crate::http::access::Client;
use crate::http::error::{ApiError, ErrorBody};
use crate::store::RunStatus;

/// Where exports are written while they download, inside the run directory (a hidden name:
/// never listed as a checkpoint, never in an archive).
pub(super) const EXPORTS_DIR: &str = ".exports";

pub fn router() -> Router<AppState> {
    Router::new().route("/runs/{id}/export/hf", get(export_hf))
}

/// Why a run has no export to offer, in words for the client; `None` when it has one.
fn refusal(id: &str, status: RunStatus, has_checkpoint: bool) -> Option<String> {
    if status != RunStatus::Finished {
        return Some(format!(
            "run `{id}` has status {}: the Hugging Face export is offered once a run has finished",
            status.as_str()
        ));
    }
    if !has_checkpoint {
        return Some(format!(
            "run `{id}` has no checkpoint on this server to export (checkpoints are kept for \
             runs launched here)"
        ));
    }
    None
}

/// Who the bound on open exports counts against: a user (all their sessions and tokens
/// together), the admin token, the local user, a run's token, or an anonymous client address.
pub(super) fn principal_key(principal: &Principal, client: &Client) -> String {
    match principal {
        Principal::Local => "local".to_string(),
        Principal::AdminToken => "admin-token".to_string(),
        Principal::User { user, .. } => format!("user:{}", user.id),
        Principal::Run { run_id } => format!("run:{run_id}"),
        Principal::Anonymous => format!("anonymous:{}", client.0.as_deref().unwrap_or("?")),
    }
}

/// Bytes the export of the checkpoint the run in `run_dir` exports will take, at most: its
/// weights as f32 (four bytes per parameter the run reported, and at least twice the
/// checkpoint's weights file, which may hold 16-bit floats) and its tokenizer twice (the
/// tokenizer files), plus 64 KiB for `config.json`.
pub(super) fn expected_size(run_dir: &FsPath, params: Option<f64>) -> anyhow::Result<u64> {
    use trainer::checkpoint::{MODEL_FILE, TOKENIZER_FILE};
    let source = trainer::checkpoint::resolve_for_reading(run_dir)?;
    let len = |name: &str| std::fs::metadata(source.join(name)).map_or(0, |m| m.len());
    let reported = params
        .filter(|p| p.is_finite() && *p > 0.0)
        .map_or(0, |p| (p * 4.0).min(u64::MAX as f64) as u64);
    let weights = len(MODEL_FILE).saturating_mul(2).max(reported);
    Ok(weights
        .saturating_add(len(TOKENIZER_FILE).saturating_mul(2))
        .saturating_add(64 * 1024))
}

/// Why the model of the checkpoint the run in `run_dir` exports fits no `transformers`
/// architecture, in words naming the config keys; `None` when it fits one (blocking).
fn model_refusal(source: &FsPath) -> anyhow::Result<Option<String>> {
    let config = trainer::checkpoint::read_config(source)?;
    Ok(trainer::hf::arch_for(&config.model)
        .err()
        .map(|why| format!("this run's model cannot be exported to Hugging Face format: {why}")))
}

/// Why the run has no Hugging Face export to offer (not finished, no checkpoint here, a model
/// no `transformers` architecture fits), in words for a person; `None` when the download
/// works. The one check behind the API's 409 and the run page's download (blocking: it reads
/// the run directory).
pub fn unavailable(id: &str, status: RunStatus, run_dir: &FsPath) -> Option<String> {
    let has_checkpoint = !checkpoints::list(run_dir).is_empty();
    if let Some(why) = refusal(id, status, has_checkpoint) {
        return Some(why);
    }
    let source = trainer::checkpoint::resolve_for_reading(run_dir).ok()?;
    // An unreadable config is the export's own failure (a 500 with its cause), not a refusal.
    model_refusal(&source).unwrap_or_default()
}

/// Exports the run's best (else latest) checkpoint into `out` (blocking); `run_dir` may also be
/// one checkpoint's directory, which is then the one exported.
pub(super) fn export(run_dir: &FsPath, out: &FsPath) -> anyhow::Result<Made> {
    let source = trainer::checkpoint::resolve_for_reading(run_dir)?;
    // Checked again: the checkpoint may have changed since the request was admitted.
    if let Some(why) = model_refusal(&source)? {
        return Ok(Made::Refused(why));
    }
    trainer::hf::export::export(&source, out, true)?;
    Ok(Made::Files(archive::files(out)?))
}

impl From<ExportError> for ApiError {
    fn from(e: ExportError) -> Self {
        match e {
            ExportError::Busy { .. } => ApiError::TooManyRequests {
                message: e.to_string(),
                retry_after: EXPORT_RETRY_AFTER_S,
            },
            ExportError::DiskShort { .. } => {
                tracing::warn!(error = %e, "a Hugging Face export was refused");
                ApiError::InsufficientStorage(e.to_string())
            }
            ExportError::Failed(cause) => ApiError::Internal(cause.context("exporting a run")),
        }
    }
}

/// The run's model as a Hugging Face directory (`config.json`, `model.safetensors`,
/// `tokenizer.json`, `tokenizer_config.json`) in an uncompressed tar archive holding one folder,
/// `<id>-hf`. Exported from the run's best checkpoint, else its latest, with LoRA adapters
/// merged into the base weights. Only for finished runs with a checkpoint on this server.
/// Downloads of a run that overlap share one export; a credential has at most two downloads
/// open at once.
#[utoipa::path(get, path = "/api/v1/runs/{id}/export/hf", tag = "checkpoints",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "A tar archive", content_type = "application/x-tar"),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The run has not finished, has no checkpoint here, or its \
            model fits no transformers architecture (the message says which)", body = ErrorBody),
        (status = 429, description = "This credential already has two exports downloading; \
            retry after `Retry-After` seconds", body = ErrorBody),
        (status = 507, description = "The disk has no room for the export besides the 1 GiB \
            the server keeps free; nothing was written", body = ErrorBody),
    ))]
#[instrument(skip(state, principal, client))]
pub async fn export_hf(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    client: Client,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let run = state.store.get_run(&id).await?;
    let run_dir = state.launcher.run_dir(&run.id);
    let (listed, status, run_id) = (run_dir.clone(), run.status, run.id.clone());
    let refused = tokio::task::spawn_blocking(move || unavailable(&run_id, status, &listed))
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    if let Some(message) = refused {
        return Err(ApiError::Conflict {
            field: None,
            message,
        });
    }
    // Held until the download's last byte is sent or the client is gone.
    let turn = state.exports.admit(&principal_key(&principal, &client))?;
    let shared = state.exports.shared(&run_dir, EXPORTS_DIR);
    let params = run.latest_metrics.get("model/params").map(|m| m.value);
    let source = run_dir.clone();
    let made = state
        .exports
        .made(
            &shared,
            move || expected_size(&source, params),
            move |out| export(&run_dir, out),
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
    let len = archive::archive_len(&files);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let root = format!("{}-hf", run.id);
    let disposition = format!("attachment; filename=\"{root}.tar\"");
    tokio::task::spawn_blocking(move || {
        if let Err(e) = archive::write(&root, &files, &tx) {
            // The client sees a short body; the length header tells it the download broke.
            tracing::warn!(error = %e, "Hugging Face export download ended early");
        }
        // The last download of this export removes its directory.
        drop(shared);
        drop(turn);
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-tar".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_finished_run_with_a_checkpoint_is_offered_and_a_refusal_names_the_reason() {
        let cases = [
            (RunStatus::Finished, true, None),
            (RunStatus::Running, true, Some("has status running")),
            (RunStatus::Queued, true, Some("has status queued")),
            (RunStatus::Stopped, true, Some("has status stopped")),
            (RunStatus::Finished, false, Some("no checkpoint")),
        ];
        for (status, has_checkpoint, want) in cases {
            let got = refusal("abc", status, has_checkpoint);
            match want {
                None => assert_eq!(got, None, "{status:?}"),
                Some(needle) => {
                    let message = got.unwrap_or_default();
                    assert!(message.contains(needle), "{status:?}: {message}");
                }
            }
        }
    }
}
