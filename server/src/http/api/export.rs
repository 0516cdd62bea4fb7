//! A finished run's model as a Hugging Face `transformers` directory, downloaded as a tar
//! archive. The trainer's exporter (what `trainyard export --format hf RUN_DIR OUT_DIR` runs)
//! writes the run's best, else latest, checkpoint, LoRA adapters merged, into a directory of
//! its own inside the run directory; the archive is streamed from there like a checkpoint's, and
//! the directory is removed when the download ends. Nothing in the request names a path: the run
//! id picks the run directory, the trainer's layout picks the checkpoint.

use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, LazyLock};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::Semaphore;
use tracing::instrument;

use crate::app::AppState;
use crate::checkpoints::{self, archive};
use crate::http::error::{ApiError, ErrorBody};
use crate::store::RunStatus;

/// Where exports are written while they download, inside the run directory (a hidden name:
/// never listed as a checkpoint, never in an archive).
const EXPORTS_DIR: &str = ".exports";

pub fn router() -> Router<AppState> {
    Router::new().route("/runs/{id}/export/hf", get(export_hf))
}

/// One export at a time: it loads the whole model on the server's CPU and writes it out again.
static EXPORTING: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(1)));

/// Removes an export's directory once its download is over (finished, cancelled or failed).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.0.display(), error = %e, "could not remove an export");
            }
        }
    }
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

/// What the export of the checkpoint in `dir` gave.
enum Exported {
    Files(Vec<(String, PathBuf, u64)>),
    /// The model fits no `transformers` architecture: the reason.
    Refused(String),
}

/// Exports the run's best (else latest) checkpoint into `out` (blocking).
fn export(run_dir: &FsPath, out: &FsPath) -> anyhow::Result<Exported> {
    let source = trainer::checkpoint::resolve_for_reading(run_dir)?;
    let config = trainer::checkpoint::read_config(&source)?;
    if let Err(why) = trainer::hf::arch_for(&config.model) {
        return Ok(Exported::Refused(format!(
            "this run's model cannot be exported to Hugging Face format: {why}"
        )));
    }
    trainer::hf::export::export(&source, out, true)?;
    Ok(Exported::Files(archive::files(out)?))
}

/// The run's model as a Hugging Face directory (`config.json`, `model.safetensors`,
/// `tokenizer.json`, `tokenizer_config.json`) in an uncompressed tar archive holding one folder,
/// `<id>-hf`. Exported from the run's best checkpoint, else its latest, with LoRA adapters
/// merged into the base weights. Only for finished runs with a checkpoint on this server.
#[utoipa::path(get, path = "/api/v1/runs/{id}/export/hf", tag = "checkpoints",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "A tar archive", content_type = "application/x-tar"),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The run has not finished, has no checkpoint here, or its \
            model fits no transformers architecture (the message says which)", body = ErrorBody),
    ))]
#[instrument(skip(state))]
pub async fn export_hf(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let run = state.store.get_run(&id).await?;
    let run_dir = state.launcher.run_dir(&run.id);
    let listed = run_dir.clone();
    let has_checkpoint =
        tokio::task::spawn_blocking(move || !checkpoints::list(&listed).is_empty())
            .await
            .map_err(|e| ApiError::Internal(e.into()))?;
    if let Some(message) = refusal(&id, run.status, has_checkpoint) {
        return Err(ApiError::Conflict {
            field: None,
            message,
        });
    }
    let turn = EXPORTING
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    let out = run_dir
        .join(EXPORTS_DIR)
        .join(format!("hf-{}", uuid::Uuid::new_v4().simple()));
    let scratch = Scratch(out.clone());
    let (scratch, exported) = tokio::task::spawn_blocking(move || {
        let exported = export(&run_dir, &out);
        drop(turn);
        (scratch, exported)
    })
    .await
    .map_err(|e| ApiError::Internal(e.into()))?;
    let files = match exported.map_err(|e| ApiError::Internal(e.context("exporting a run")))? {
        Exported::Files(files) => files,
        Exported::Refused(message) => {
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
        drop(scratch);
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
