//! `GET /api/v1/runs/{id}/logs`: a launched run's output, by offset or tail (text, or JSON with
//! `format=json`), or followed live (`follow=true`) as server-sent events: the existing content
//! first, then new output as it is written, then an `end` event with the final status. A
//! followed log ends early, without `end`, once the caller may no longer read the run (a revoked
//! token, a disabled user, a removed grant: `access::revocation`). A followed log counts
//! against its caller's share of open event streams (`events::stream_slot`).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use futures::Stream;
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;
use tracing::instrument;

use crate::access::revocation::{Scope, StreamAccess};
use crate::access::Principal;
use crate::app::AppState;
use crate::http::api::events::{stream_slot, PeerAddr};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiQuery;
use crate::launcher::logs::{read_from, read_tail, LogEvent, LogFollower, LogSlice};
use crate::live::names;
use crate::live::StreamSlot;

/// How often a follower re-checks whether the run has ended (covers runs stopped while queued).
const STATUS_POLL: Duration = Duration::from_secs(1);

pub fn router() -> Router<AppState> {
    Router::new().route("/runs/{id}/logs", get(get_logs))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogParams {
    /// Byte offset to read from (default 0).
    pub offset: Option<String>,
    /// Only the last N lines.
    pub tail: Option<String>,
    /// `true`: stream as server-sent events until the run ends.
    pub follow: Option<String>,
    /// `text` (default) or `json`.
    pub format: Option<String>,
}

fn parse_u64(field: &str, text: Option<&str>) -> Result<Option<u64>, ApiError> {
    text.map(|t| {
        t.parse::<u64>().map_err(|_| {
            ApiError::bad_request(field, format!("{field} must be a non-negative integer"))
        })
    })
    .transpose()
}

fn parse_bool(field: &str, text: Option<&str>) -> Result<bool, ApiError> {
    match text {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") | Some("") => Ok(true),
        Some(_) => Err(ApiError::bad_request(
            field,
            format!("{field} must be true or false"),
        )),
    }
}

/// A run's output log.
#[utoipa::path(get, path = "/api/v1/runs/{id}/logs", tag = "launcher",
    params(("id" = String, Path, description = "Run id"), LogParams),
    responses(
        (status = 200, description = "The log as text (`X-Next-Offset` tells where to continue), \
            a JSON slice with format=json, or with follow=true a stream of `log` events and a \
            final `end` event",
            content(
                (String = "text/plain"),
                (LogSlice = "application/json"),
                (String = "text/event-stream"),
            )),
        (status = 400, body = ErrorBody),
        (status = 404, description = "No run with that id", body = ErrorBody),
        (status = 429, description = "follow=true while the caller or its address holds its share of open streams; `Retry-After` says when to try again", body = ErrorBody),
    ))]
#[instrument(skip(state, principal, peer))]
pub async fn get_logs(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    peer: PeerAddr,
    Path(id): Path<String>,
    ApiQuery(params): ApiQuery<LogParams>,
) -> Result<Response, ApiError> {
    let offset = parse_u64("offset", params.offset.as_deref())?;
    let tail = parse_u64("tail", params.tail.as_deref())?;
    let follow = parse_bool("follow", params.follow.as_deref())?;
    let json = match params.format.as_deref() {
        None | Some("text") => false,
        Some("json") => true,
        Some(_) => {
            return Err(ApiError::bad_request(
                "format",
                "format must be text or json",
            ))
        }
    };
    if offset.is_some() && tail.is_some() {
        return Err(ApiError::bad_request(
            "tail",
            "give either offset or tail, not both",
        ));
    }
    // The run must exist before anything is kept for it: a follower of an unknown id would
    // otherwise hold a channel open for a run that never comes.
    state.store.get_run(&id).await?;
    let slot = follow
        .then(|| stream_slot(&state, &principal, &peer))
        .transpose()?;
    // Subscribe before reading so no line falls between the read and the live stream.
    let rx = follow.then(|| state.launcher.logs().subscribe(&id));
    let path = state.launcher.log_path(&id);
    let slice = tokio::task::spawn_blocking(move || match tail {
        Some(n) => read_tail(&path, n as usize),
        None => read_from(&path, offset.unwrap_or(0)),
    })
    .await
    .map_err(|e| ApiError::Internal(e.into()))?
    .map_err(|e| ApiError::Internal(e.into()))?;
    if let (Some(rx), Some(slot)) = (rx, slot) {
        let access = StreamAccess::new(&state, principal, Scope::Run(id.clone()));
        return Ok(follow_stream(state, id, slice, rx, access, slot).into_response());
    }
    if json {
        return Ok(Json(slice).into_response());
    }
    Ok((
        [
            (
                header::CONTENT_TYPE,
                "text/plain; charset=utf-8".to_string(),
            ),
            (
                header::HeaderName::from_static("x-next-offset"),
                slice.next_offset.to_string(),
            ),
        ],
        slice.text,
    )
        .into_response())
}

fn log_event(offset: u64, text: &str) -> Event {
    let body = serde_json::json!({ "offset": offset, "text": text });
    Event::default().event(names::LOG).data(body.to_string())
}

struct Follow {
    state: AppState,
    id: String,
    rx: LogFollower,
    /// Everything before this offset has been sent.
    pos: u64,
    first: Option<LogSlice>,
    done: bool,
    access: StreamAccess,
    /// The stream's place in its caller's share, given back when the stream is dropped.
    _slot: StreamSlot,
}

impl Follow {
    /// Sends what the file holds past `pos` (catch-up after a lag, and the final flush).
    async fn catch_up(&mut self) -> Option<Event> {
        let path = self.state.launcher.log_path(&self.id);
        let pos = self.pos;
        let slice = tokio::task::spawn_blocking(move || read_from(&path, pos))
            .await
            .ok()?
            .ok()?;
        if slice.text.is_empty() {
            return None;
        }
        self.pos = slice.next_offset;
        Some(log_event(slice.offset, &slice.text))
    }

    async fn ended(&self) -> Option<String> {
        match self.state.store.get_run(&self.id).await {
            Ok(run) if run.status.is_terminal() => Some(run.status.to_string()),
            Ok(_) => None,
            Err(_) => Some("unknown".into()),
        }
    }

    async fn finish(&mut self) -> Option<Event> {
        if let Some(ev) = self.catch_up().await {
            return Some(ev);
        }
        self.done = true;
        let status = self.ended().await.unwrap_or_else(|| "unknown".into());
        let body = serde_json::json!({ "status": status });
        Some(Event::default().event(names::END).data(body.to_string()))
    }

    async fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        if !self.access.allowed().await {
            self.done = true;
            return None;
        }
        if let Some(first) = self.first.take() {
            self.pos = first.next_offset;
            if !first.text.is_empty() {
                return Some(log_event(first.offset, &first.text));
            }
        }
        let live = self.state.live.clone();
        loop {
            let recv = tokio::select! {
                recv = tokio::time::timeout(STATUS_POLL, self.rx.recv()) => Some(recv),
                // Server shutting down: end the stream so graceful shutdown is not held up.
                _ = live.closed() => {
                    self.done = true;
                    return None;
                }
                () = self.access.changed() => None,
            };
            // Checked before anything more is sent, whichever branch above was picked first.
            if !self.access.allowed().await {
                self.done = true;
                return None;
            }
            let Some(recv) = recv else { continue };
            match recv {
                Ok(Ok(LogEvent::Chunk { offset, text })) => {
                    let end = offset + text.len() as u64;
                    if end <= self.pos {
                        continue;
                    }
                    if offset > self.pos {
                        return self.catch_up().await;
                    }
                    let skip = (self.pos - offset) as usize;
                    let fresh = String::from_utf8_lossy(&text.as_bytes()[skip..]).into_owned();
                    let at = self.pos;
                    self.pos = end;
                    return Some(log_event(at, &fresh));
                }
                Ok(Ok(LogEvent::End)) | Ok(Err(RecvError::Closed)) => {
                    // The supervisor records the final status before announcing the end.
                    if self.ended().await.is_some() {
                        return self.finish().await;
                    }
                    self.rx = self.state.launcher.logs().subscribe(&self.id);
                }
                Ok(Err(RecvError::Lagged(_))) => {
                    if let Some(ev) = self.catch_up().await {
                        return Some(ev);
                    }
                }
                Err(_) => {
                    if self.ended().await.is_some() {
                        return self.finish().await;
                    }
                    if let Some(ev) = self.catch_up().await {
                        return Some(ev);
                    }
                }
            }
        }
    }
}

fn follow_stream(
    state: AppState,
    id: String,
    first: LogSlice,
    rx: LogFollower,
    access: StreamAccess,
    slot: StreamSlot,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let follow = Follow {
        state,
        id,
        rx,
        pos: first.offset,
        first: Some(first),
        done: false,
        access,
        _slot: slot,
    };
    let stream = futures::stream::unfold(follow, |mut f| async move {
        let ev = f.next().await?;
        Some((Ok(ev), f))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
