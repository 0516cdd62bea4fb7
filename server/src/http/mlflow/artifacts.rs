//! Artifacts: files a client logs to a run (`log_artifact`, `log_dict`, `log_figure`, a
//! model's files), kept in the run's directory under `artifacts/`, through MLflow's artifact
//! proxy (`mlflow-artifacts/artifacts/<experiment>/<run>/artifacts/<path>`: upload with PUT,
//! download with GET, list with `?path=`) and `mlflow/artifacts/list`. The run page lists and
//! serves the same files.

use std::path::{Component, Path, PathBuf};

use axum::body::Body;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use super::runs::{active, run_for};
use super::wire;
use super::{Caller, Fields, MlflowError, MlflowResult};
use crate::app::AppState;
use crate::http::error::ApiError;
use crate::store::Run;

/// Largest artifact one upload may carry.
pub const MAX_ARTIFACT_BYTES: u64 = 16 * 1024 * 1024 * 1024;

pub fn list_router() -> Router<AppState> {
    Router::new().route("/artifacts/list", get(list))
}

pub fn proxy_router() -> Router<AppState> {
    Router::new().route("/artifacts", get(proxy_list)).route(
        "/artifacts/{*path}",
        get(download).put(upload).delete(remove),
    )
}

/// A file system failure of the server's own (a logged 500).
fn io_error(e: std::io::Error) -> MlflowError {
    MlflowError::from(ApiError::Internal(e.into()))
}

/// Where a run's artifacts are kept.
pub fn artifact_root(state: &AppState, run_id: &str) -> PathBuf {
    crate::launcher::run_dir(&state.settings.data_dir, run_id).join("artifacts")
}

/// Longest name of one file or folder in an artifact path, in bytes (Linux's `NAME_MAX`).
pub const MAX_ARTIFACT_NAME_BYTES: usize = 255;
/// Longest artifact path below the run's artifact folder, in bytes (well under `PATH_MAX`,
/// which also has to hold the data directory and the run's folder).
pub const MAX_ARTIFACT_PATH_BYTES: usize = 2048;

/// A path inside the artifact root: relative, no `..`, `.`, empty or odd components, no name
/// longer than the file system takes. Anything else is refused, so a request never reaches
/// outside its run's folder and never asks the file system for what it cannot do.
pub fn relative_path(field: &str, raw: &str) -> MlflowResult<PathBuf> {
    if raw.len() > MAX_ARTIFACT_PATH_BYTES {
        return Err(MlflowError::invalid(
            field,
            format!(
                "the artifact path is {} bytes long; at most {MAX_ARTIFACT_PATH_BYTES} are allowed",
                raw.len()
            ),
        ));
    }
    let mut out = PathBuf::new();
    for part in raw.split('/') {
        if part.is_empty() {
            continue;
        }
        if part.len() > MAX_ARTIFACT_NAME_BYTES {
            return Err(MlflowError::invalid(
                field,
                format!(
                    "the artifact name `{}…` is {} bytes long; a file or folder name may have at \
                     most {MAX_ARTIFACT_NAME_BYTES}",
                    part.chars().take(32).collect::<String>(),
                    part.len()
                ),
            ));
        }
        let bad = part == "."
            || part == ".."
            || part.contains('\\')
            || part.contains('\0')
            || part.chars().any(char::is_control);
        if bad
            || !matches!(
                Path::new(part).components().next(),
                Some(Component::Normal(_))
            )
        {
            return Err(MlflowError::invalid(
                field,
                format!("`{raw}` is not a path inside the run's artifacts"),
            ));
        }
        out.push(part);
    }
    Ok(out)
}

/// A proxy path `<experiment>/<run>/artifacts[/<path>]`: the run (after the caller's access
/// check) and the path inside its artifacts.
async fn proxy_target(
    state: &AppState,
    caller: &Caller,
    raw: &str,
) -> MlflowResult<(Run, PathBuf)> {
    let not_ours = || {
        MlflowError::invalid(
            "path",
            format!("`{raw}` is not <experiment id>/<run id>/artifacts/<path>"),
        )
    };
    let mut parts = raw.trim_start_matches('/').splitn(4, '/');
    let (Some(experiment), Some(run_id), Some("artifacts")) =
        (parts.next(), parts.next(), parts.next())
    else {
        return Err(not_ours());
    };
    let run = run_for(state, caller, run_id).await?;
    if run.experiment_id != experiment {
        return Err(MlflowError::not_found(format!("run `{run_id}` not found")));
    }
    let rest = relative_path("path", parts.next().unwrap_or(""))?;
    Ok((run, rest))
}

/// The file or folder on disk, refusing one that a link leads outside the root.
async fn on_disk(root: &Path, rel: &Path) -> MlflowResult<Option<PathBuf>> {
    let path = root.join(rel);
    let (Ok(real_root), Ok(real)) = (
        tokio::fs::canonicalize(root).await,
        tokio::fs::canonicalize(&path).await,
    ) else {
        return Ok(None);
    };
    if !real.starts_with(&real_root) {
        return Err(MlflowError::invalid(
            "path",
            "the path leads outside the run's artifacts",
        ));
    }
    Ok(Some(real))
}

/// The entries of a folder (names relative to `prefix`), sorted; a file or a missing path has
/// none.
async fn entries(dir: Option<PathBuf>, prefix: &Path) -> MlflowResult<Vec<Value>> {
    let Some(dir) = dir else {
        return Ok(Vec::new());
    };
    let Ok(mut read) = tokio::fs::read_dir(&dir).await else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    while let Some(entry) = read.next_entry().await.map_err(io_error)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(".upload-") {
            continue;
        }
        let meta = entry.metadata().await.map_err(io_error)?;
        let path = prefix.join(&name).to_string_lossy().into_owned();
        out.push(if meta.is_dir() {
            json!({"path": path, "is_dir": true})
        } else {
            json!({"path": path, "is_dir": false, "file_size": meta.len()})
        });
    }
    out.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
    Ok(out)
}

/// A run's artifacts as the run page lists them: every file, relative path and size.
pub async fn list_files(state: &AppState, run_id: &str) -> Vec<(String, u64)> {
    let root = artifact_root(state, run_id);
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let Ok(read) = std::fs::read_dir(root.join(&rel)) else {
                continue;
            };
            for entry in read.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                if name.starts_with(".upload-") || kind.is_symlink() {
                    continue;
                }
                if kind.is_dir() {
                    stack.push(rel.join(&name));
                } else if let Ok(meta) = entry.metadata() {
                    out.push((rel.join(&name).to_string_lossy().into_owned(), meta.len()));
                }
            }
        }
        out.sort();
        out
    })
    .await
    .unwrap_or_default()
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(flatten)]
    run: super::runs::RunRef,
    #[serde(default)]
    path: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ListQuery>,
) -> MlflowResult<Json<Value>> {
    let run = run_for(&state, &caller, q.run.id()?).await?;
    let rel = relative_path("path", q.path.as_deref().unwrap_or(""))?;
    let root = artifact_root(&state, &run.id);
    let files = entries(on_disk(&root, &rel).await?, &rel).await?;
    Ok(Json(
        json!({"root_uri": wire::run_artifacts(&run), "files": files}),
    ))
}

#[derive(Deserialize)]
struct ProxyList {
    #[serde(default)]
    path: String,
}

async fn proxy_list(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ProxyList>,
) -> MlflowResult<Json<Value>> {
    let (run, rel) = proxy_target(&state, &caller, &q.path).await?;
    let root = artifact_root(&state, &run.id);
    let target = on_disk(&root, &rel).await?;
    // MLflow answers `{}` for a file or a missing path: the client takes that as "not a folder".
    let files = match &target {
        Some(p) if p.is_dir() => entries(target, Path::new("")).await?,
        _ => Vec::new(),
    };
    if files.is_empty() {
        return Ok(Json(json!({})));
    }
    Ok(Json(json!({"files": files})))
}

async fn download(
    State(state): State<AppState>,
    caller: Caller,
    UrlPath(path): UrlPath<String>,
) -> MlflowResult<Response> {
    let (run, rel) = proxy_target(&state, &caller, &path).await?;
    serve_file(&artifact_root(&state, &run.id), &rel).await
}

/// Streams one artifact file (`application/octet-stream`, as an attachment).
pub async fn serve_file(root: &Path, rel: &Path) -> MlflowResult<Response> {
    let missing = || MlflowError::not_found(format!("artifact `{}` not found", rel.display()));
    let path = on_disk(root, rel).await?.ok_or_else(missing)?;
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(_) => return Err(missing()),
    };
    let meta = file.metadata().await.map_err(io_error)?;
    if !meta.is_file() {
        return Err(missing());
    }
    let stream = tokio_stream::wrappers::ReceiverStream::new(spawn_reader(file));
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy().replace(['"', '\\'], "_"))
        .unwrap_or_default();
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, meta.len().to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

fn spawn_reader(
    mut file: tokio::fs::File,
) -> tokio::sync::mpsc::Receiver<std::io::Result<axum::body::Bytes>> {
    use tokio::io::AsyncReadExt;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match file.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => {
                    let chunk = axum::body::Bytes::copy_from_slice(&buf[..n]);
                    if tx.send(Ok(chunk)).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    break;
                }
            }
        }
    });
    rx
}

/// Uploads one file: written to a temporary name beside it and renamed when complete, so a
/// reader never sees half a file and a broken upload leaves nothing behind.
async fn upload(
    State(state): State<AppState>,
    caller: Caller,
    UrlPath(path): UrlPath<String>,
    request: Request,
) -> MlflowResult<Json<Value>> {
    let (run, rel) = proxy_target(&state, &caller, &path).await?;
    active(&run)?;
    if rel.as_os_str().is_empty() {
        return Err(MlflowError::invalid("path", "name the file to upload"));
    }
    let root = artifact_root(&state, &run.id);
    let parent = make_folders(&root, rel.parent().unwrap_or(Path::new(""))).await?;
    let target = parent.join(rel.file_name().unwrap_or_default());
    if tokio::fs::metadata(&target).await.is_ok_and(|m| m.is_dir()) {
        return Err(MlflowError::invalid(
            "path",
            format!("`{}` is a folder", rel.display()),
        ));
    }
    let temp = parent.join(format!(".upload-{}", uuid::Uuid::new_v4().simple()));
    let written = write_body(&temp, request.into_body()).await;
    let result = match written {
        Ok(()) => tokio::fs::rename(&temp, &target).await.map_err(io_error),
        Err(e) => Err(e),
    };
    if result.is_err() {
        let _ = tokio::fs::remove_file(&temp).await;
    }
    result?;
    Ok(Json(json!({})))
}

/// Makes the folders `rel` below the run's artifact folder `root`, one at a time, and returns
/// the last. Every step is checked before anything is made: an existing one must be a folder,
/// or a link that leads to a folder inside `root`; anything else (a link planted to lead
/// elsewhere, a file) is refused, so no upload makes a folder outside the run. `root` itself
/// may not be a link.
async fn make_folders(root: &Path, rel: &Path) -> MlflowResult<PathBuf> {
    let refused = |why: String| MlflowError::invalid("path", why);
    match tokio::fs::symlink_metadata(root).await {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(refused("the run's artifact folder is not a folder".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tokio::fs::create_dir_all(root).await.map_err(io_error)?;
        }
        Err(e) => return Err(io_error(e)),
    }
    let real_root = tokio::fs::canonicalize(root).await.map_err(io_error)?;
    let mut here = root.to_path_buf();
    for part in rel.components() {
        here.push(part);
        let shown = || {
            here.strip_prefix(root)
                .unwrap_or(&here)
                .display()
                .to_string()
        };
        match tokio::fs::symlink_metadata(&here).await {
            Ok(m) if m.is_dir() => continue,
            Ok(m) if m.file_type().is_symlink() => {
                let inside = match tokio::fs::canonicalize(&here).await {
                    Ok(real) => {
                        real.starts_with(&real_root)
                            && tokio::fs::metadata(&real).await.is_ok_and(|m| m.is_dir())
                    }
                    Err(_) => false,
                };
                if !inside {
                    return Err(refused(format!(
                        "`{}` is a link that leads outside the run's artifacts",
                        shown()
                    )));
                }
            }
            Ok(_) => return Err(refused(format!("`{}` is a file, not a folder", shown()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match tokio::fs::create_dir(&here).await {
                    Ok(()) => {}
                    // Made meanwhile by another upload: a folder is fine, anything else not.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        let m = tokio::fs::symlink_metadata(&here).await.map_err(io_error)?;
                        if !m.is_dir() {
                            return Err(refused(format!("`{}` cannot be made", shown())));
                        }
                    }
                    Err(e) => return Err(io_error(e)),
                }
            }
            Err(e) => return Err(io_error(e)),
        }
    }
    Ok(here)
}

async fn write_body(temp: &Path, body: Body) -> MlflowResult<()> {
    let mut file = tokio::fs::File::create(temp).await.map_err(io_error)?;
    let mut stream = body.into_data_stream();
    let mut total: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            MlflowError::from(ApiError::BadRequest {
                field: None,
                message: format!("the upload broke off: {e}"),
            })
        })?;
        total += chunk.len() as u64;
        if total > MAX_ARTIFACT_BYTES {
            return Err(MlflowError::from(ApiError::PayloadTooLarge(format!(
                "an artifact may have at most {MAX_ARTIFACT_BYTES} bytes"
            ))));
        }
        file.write_all(&chunk).await.map_err(io_error)?;
    }
    file.sync_all().await.map_err(io_error)?;
    Ok(())
}

async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    UrlPath(path): UrlPath<String>,
) -> MlflowResult<Json<Value>> {
    let (run, rel) = proxy_target(&state, &caller, &path).await?;
    let root = artifact_root(&state, &run.id);
    let missing = || MlflowError::not_found(format!("artifact `{}` not found", rel.display()));
    if rel.as_os_str().is_empty() {
        return Err(MlflowError::invalid(
            "path",
            "name the file or folder to delete",
        ));
    }
    let target = on_disk(&root, &rel).await?.ok_or_else(missing)?;
    if target.is_dir() {
        tokio::fs::remove_dir_all(&target).await.map_err(io_error)?;
    } else {
        tokio::fs::remove_file(&target).await.map_err(io_error)?;
    }
    Ok(Json(json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_artifact_name_longer_than_the_file_system_takes_is_refused_naming_the_field() {
        let long = "n".repeat(MAX_ARTIFACT_NAME_BYTES + 1);
        let e = relative_path("path", &format!("model/{long}.bin")).unwrap_err();
        assert!(format!("{e:?}").contains("path"), "{e:?}");
        assert!(format!("{e:?}").contains("at most 255"), "{e:?}");
        let fits = "n".repeat(MAX_ARTIFACT_NAME_BYTES);
        assert!(relative_path("path", &format!("model/{fits}")).is_ok());
        let deep = "a/".repeat(MAX_ARTIFACT_PATH_BYTES);
        assert!(relative_path("path", &deep).is_err());
    }

    #[test]
    fn artifact_paths_stay_inside_the_run() {
        assert_eq!(
            relative_path("path", "sub/dir/f.txt").expect("ok"),
            PathBuf::from("sub/dir/f.txt")
        );
        assert_eq!(relative_path("path", "").expect("ok"), PathBuf::new());
        for bad in ["../x", "a/../../x", "./a", "a\\b", "a/\u{1}b"] {
            assert!(relative_path("path", bad).is_err(), "{bad}");
        }
    }
}
