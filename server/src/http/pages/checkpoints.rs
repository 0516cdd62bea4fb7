//! Checkpoint files of a run: listed on its page, downloadable one by one. Only plain file names
//! inside `<run dir>/checkpoints/` are served (no separators, no dot files, no temp files, no
//! symlinks leading out of the directory).

use super::views::{enc, fmt_bytes, fmt_time, CheckpointRow};
use super::{check_run_id, Dashboard, PageError, PageResult};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, Request};
use tower::ServiceExt;

pub async fn list(d: &Dashboard, run_id: &str) -> Vec<CheckpointRow> {
    let dir = d.run_dir(run_id).join("checkpoints");
    let run_id = run_id.to_string();
    tokio::task::spawn_blocking(move || {
        let mut rows = Vec::new();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return rows;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() || !safe_file_name(&name) {
                continue;
            }
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| fmt_time(d.as_millis() as i64))
                .unwrap_or_default();
            rows.push(CheckpointRow {
                href: format!("/runs/{run_id}/checkpoints/{}", enc(&name)),
                size: fmt_bytes(meta.len()),
                modified,
                name,
            });
        }
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        rows
    })
    .await
    .unwrap_or_default()
}

/// A plain file name: no separators, no parent references, no hidden files, no temp files.
pub fn safe_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.ends_with(".tmp")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

pub async fn download(
    State(d): State<Dashboard>,
    Path((id, name)): Path<(String, String)>,
    req: Request<Body>,
) -> PageResult {
    check_run_id(&id)?;
    if !safe_file_name(&name) {
        return Err(PageError::NotFound(format!(
            "checkpoint `{name}` not found"
        )));
    }
    let dir = d.run_dir(&id).join("checkpoints");
    let path = dir.join(&name);
    // Refuse symlinks that lead outside the run's checkpoint directory.
    let inside = match (
        tokio::fs::canonicalize(&dir).await,
        tokio::fs::canonicalize(&path).await,
    ) {
        (Ok(d), Ok(p)) => p.starts_with(&d),
        _ => false,
    };
    if !inside {
        return Err(PageError::NotFound(format!(
            "checkpoint `{name}` not found"
        )));
    }
    let res = match tower_http::services::ServeFile::new(&path)
        .oneshot(req)
        .await
    {
        Ok(res) => res,
        Err(e) => return Err(PageError::Internal(e.to_string())),
    };
    let mut res = res.map(Body::new);
    if let Ok(v) = format!("attachment; filename=\"{name}\"").parse() {
        res.headers_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(res)
}
