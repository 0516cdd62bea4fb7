//! Server-sent events: `GET /api/v1/runs/{id}/events` (one run's new points and status changes)
//! and `GET /api/v1/events` (status changes of every run).
//!
//! A run stream subscribes to the live hub *first*, then replays from the store everything after
//! the client's position, then forwards live messages, dropping any whose seq it already sent.
//! So a point stored while the replay runs arrives exactly once. The event id carries both
//! positions (`p{point seq}.e{event seq}`), so a client reconnecting with `Last-Event-ID` resumes
//! where it stopped.
//!
//! Each stream holds a [`StreamAccess`]: when a token is revoked, a user disabled or a grant
//! removed while it is open, a run stream ends and the all-runs stream leaves out the runs the
//! caller may no longer read (`access::revocation`).
//!
//! Each stream (these two, a sweep's and a followed log alike) also holds a [`StreamSlot`]: one
//! principal and one client address hold at most their share of open streams
//! (`--max-streams-per-principal`, `--max-streams-per-address`); one more is answered 429 with
//! `Retry-After`, and a slot is given back when its stream ends.

use std::convert::Infallible;
use std::net::IpAddr;
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use axum::{Extension, Router};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tracing::instrument;

use crate::access::revocation::{Scope, StreamAccess};
use crate::access::Principal;
use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiQuery;
use crate::live::names;
use crate::live::{RunMessage, RunSubscription, StreamRefusal, StreamSlot};
use crate::store::{RunEvent, StoreError, StoredPoint};

/// Points per SSE `points` event (and per store read during catch-up).
const CHUNK: usize = 1000;
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Seconds a client refused a stream is asked to wait: a slot frees when one of its streams
/// ends, which only the client can make happen.
pub const STREAM_RETRY_AFTER_S: u64 = 10;

/// The client's address as the accept loop saw it; `None` for a request that did not come
/// through it (tests that call the router directly). Behind a reverse proxy, the proxy's.
pub struct PeerAddr(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for PeerAddr {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(PeerAddr(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip()),
        ))
    }
}

/// Whose share of streams a principal's stream counts against: a user (whichever token or
/// session it came through), the admin token, a run's token. The local user of a server
/// without accounts and anonymous callers are only counted by their address: they are not
/// one person.
fn principal_key(principal: &Principal) -> Option<String> {
    match principal {
        Principal::User { user, .. } => Some(format!("user:{}", user.id)),
        Principal::AdminToken => Some("admin-token".into()),
        Principal::Run { run_id } => Some(format!("run:{run_id}")),
        Principal::Local | Principal::Anonymous => None,
    }
}

/// A slot for one more event stream of `principal` from `peer`, or a 429 saying whose share
/// is used up.
pub fn stream_slot(
    state: &AppState,
    principal: &Principal,
    peer: &PeerAddr,
) -> Result<StreamSlot, ApiError> {
    let key = principal_key(principal);
    let refusal = match state
        .live
        .open_stream(key.as_deref(), peer.0, state.settings.streams)
    {
        Ok(slot) => return Ok(slot),
        Err(refusal) => refusal,
    };
    let message = match refusal {
        StreamRefusal::Principal { cap } => format!(
            "this caller already holds {cap} open event streams, the most one may; close one \
             (a browser tab, a --follow) and retry"
        ),
        StreamRefusal::Address { cap } => format!(
            "this client address already holds {cap} open event streams, the most one may; \
             close one and retry"
        ),
    };
    tracing::info!(
        actor = principal.actor().as_deref().unwrap_or("anonymous"),
        peer = ?peer.0,
        ?refusal,
        "refused an event stream: its share of streams is used up"
    );
    Err(ApiError::TooManyRequests {
        message,
        retry_after: STREAM_RETRY_AFTER_S,
    })
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/runs/{id}/events", get(run_events))
        .route("/events", get(all_events))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// Replay points with a step greater than this (ignored when `Last-Event-ID` is sent).
    pub after_step: Option<String>,
}

/// Data of a `points` event.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PointsEvent<'a> {
    pub run_id: &'a str,
    pub points: &'a [StoredPoint],
}

/// How far a client has read: the last point seq and last event seq it was sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamPosition {
    pub point_seq: Option<i64>,
    pub event_seq: Option<i64>,
}

impl StreamPosition {
    /// `p{seq}.e{seq}`, with an empty number for "nothing yet" (`p.e`).
    pub fn to_event_id(self) -> String {
        let fmt = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_default();
        format!("p{}.e{}", fmt(self.point_seq), fmt(self.event_seq))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("Last-Event-ID `{text}` is not of the form p<seq>.e<seq>");
        let (p, e) = text.trim().split_once('.').ok_or_else(bad)?;
        let p = p.strip_prefix('p').ok_or_else(bad)?;
        let e = e.strip_prefix('e').ok_or_else(bad)?;
        let num = |s: &str| -> Result<Option<i64>, String> {
            if s.is_empty() {
                Ok(None)
            } else {
                s.parse::<i64>().map(Some).map_err(|_| bad())
            }
        };
        Ok(StreamPosition {
            point_seq: num(p)?,
            event_seq: num(e)?,
        })
    }

    fn is_new_point(&self, point: &StoredPoint) -> bool {
        self.point_seq.is_none_or(|seen| point.seq > seen)
    }

    fn is_new_event(&self, event: &RunEvent) -> bool {
        self.event_seq.is_none_or(|seen| event.seq > seen)
    }
}

/// Live points (`event: points`) and status changes (`event: status`) of one run. A stream the
/// server has to end on its own failure sends `event: stream_error` last; the client reconnects
/// with `Last-Event-ID` and resumes.
#[utoipa::path(get, path = "/api/v1/runs/{id}/events", tag = "events",
    params(
        ("id" = String, Path, description = "Run id"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id"),
        EventParams,
    ),
    responses(
        (status = 200, description = "text/event-stream of `points` and `status` events, and `stream_error` before the server ends a stream on its own failure", content_type = "text/event-stream", body = String),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 429, description = "The caller or its address holds its share of open streams; `Retry-After` says when to try again", body = ErrorBody),
    ))]
#[instrument(skip(state, headers, principal, peer))]
pub async fn run_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    peer: PeerAddr,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiQuery(params): ApiQuery<EventParams>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let position = match headers.get("last-event-id") {
        Some(value) => {
            let text = value.to_str().map_err(|_| {
                ApiError::bad_request("Last-Event-ID", "Last-Event-ID is not valid text")
            })?;
            StreamPosition::parse(text).map_err(|m| ApiError::bad_request("Last-Event-ID", m))?
        }
        None => StreamPosition::default(),
    };
    let after_step = match params.after_step.as_deref() {
        None | Some("") => None,
        Some(t) => Some(t.parse::<i64>().map_err(|_| {
            ApiError::bad_request(
                "after_step",
                format!("after_step must be an integer, got `{t}`"),
            )
        })?),
    };
    state.store.get_run(&id).await?;
    let slot = stream_slot(&state, &principal, &peer)?;
    // Subscribe before reading the store, so nothing stored in between is missed.
    let subscription = state.live.subscribe_run(&id);
    let mut access = StreamAccess::new(&state, principal, Scope::Run(id.clone()));
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        // Held for as long as the stream runs.
        let _slot = slot;
        let run_id = id.clone();
        let end = stream_run(
            &state,
            &id,
            position,
            after_step,
            subscription,
            &mut access,
            &tx,
        )
        .await;
        match end {
            Ok(()) | Err(StreamEnd::ClientGone) | Err(StreamEnd::Revoked) => {}
            Err(StreamEnd::Store(e)) => {
                tracing::error!(run_id, error = %e, "SSE stream failed reading the store");
                let _ = tx.send(stream_error()).await;
            }
            Err(StreamEnd::Encode(e)) => {
                tracing::error!(run_id, error = %e, "SSE stream failed encoding an event");
                let _ = tx.send(stream_error()).await;
            }
        }
    });
    Ok(Sse::new(ReceiverStream::new(rx).map(Ok)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

pub use crate::live::names::STREAM_ERROR;

/// The last event of a run stream the server had to end (the cause is logged, never sent).
fn stream_error() -> Event {
    Event::default().event(STREAM_ERROR).data("internal error")
}

enum StreamEnd {
    ClientGone,
    /// The caller may no longer read the run (`StreamAccess` logged why).
    Revoked,
    Store(StoreError),
    /// An event could not be encoded as JSON (a bug, not a client's fault).
    Encode(axum::Error),
}

impl From<StoreError> for StreamEnd {
    fn from(e: StoreError) -> Self {
        StreamEnd::Store(e)
    }
}

async fn stream_run(
    state: &AppState,
    run_id: &str,
    mut position: StreamPosition,
    after_step: Option<i64>,
    mut subscription: RunSubscription,
    access: &mut StreamAccess,
    tx: &mpsc::Sender<Event>,
) -> Result<(), StreamEnd> {
    if !access.allowed().await {
        return Err(StreamEnd::Revoked);
    }
    catch_up(state, run_id, &mut position, after_step, tx).await?;
    loop {
        let message = tokio::select! {
            _ = state.live.closed() => return Ok(()),
            _ = tx.closed() => return Err(StreamEnd::ClientGone),
            () = access.changed() => None,
            message = subscription.recv() => Some(message),
        };
        // Checked before anything more is sent: a revocation stored before this message was
        // published is seen here, whichever branch above was picked first.
        if !access.allowed().await {
            return Err(StreamEnd::Revoked);
        }
        let Some(message) = message else { continue };
        match message {
            Ok(RunMessage::Points(points)) => {
                let fresh: Vec<StoredPoint> = points
                    .iter()
                    .filter(|p| position.is_new_point(p))
                    .cloned()
                    .collect();
                send_points(run_id, &fresh, &mut position, tx).await?;
            }
            Ok(RunMessage::Status(event)) => {
                if position.is_new_event(&event) {
                    send_status(&event, &mut position, tx).await?;
                }
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                // The hub only carries stored data: read the gap back from the store.
                tracing::debug!(
                    run_id,
                    missed,
                    "SSE subscriber lagged; catching up from the store"
                );
                catch_up(state, run_id, &mut position, after_step, tx).await?;
            }
            Err(broadcast::error::RecvError::Closed) => return Ok(()),
        }
    }
}

/// Sends everything the store holds after `position` (points, then status events).
async fn catch_up(
    state: &AppState,
    run_id: &str,
    position: &mut StreamPosition,
    after_step: Option<i64>,
    tx: &mpsc::Sender<Event>,
) -> Result<(), StreamEnd> {
    loop {
        // `after_step` only applies until the first point has been sent.
        let step_bound = position.point_seq.is_none().then_some(after_step).flatten();
        let points = state
            .store
            .points_since(run_id, position.point_seq, step_bound, CHUNK)
            .await?;
        let done = points.len() < CHUNK;
        send_points(run_id, &points, position, tx).await?;
        if done {
            break;
        }
    }
    for event in state.store.run_events(run_id, position.event_seq).await? {
        send_status(&event, position, tx).await?;
    }
    Ok(())
}

async fn send_points(
    run_id: &str,
    points: &[StoredPoint],
    position: &mut StreamPosition,
    tx: &mpsc::Sender<Event>,
) -> Result<(), StreamEnd> {
    for chunk in points.chunks(CHUNK) {
        let Some(last) = chunk.last() else { continue };
        position.point_seq = Some(position.point_seq.map_or(last.seq, |s| s.max(last.seq)));
        let data = PointsEvent {
            run_id,
            points: chunk,
        };
        send(tx, names::POINTS, &data, *position).await?;
    }
    Ok(())
}

async fn send_status(
    event: &RunEvent,
    position: &mut StreamPosition,
    tx: &mpsc::Sender<Event>,
) -> Result<(), StreamEnd> {
    position.event_seq = Some(position.event_seq.map_or(event.seq, |s| s.max(event.seq)));
    send(tx, names::STATUS, event, *position).await
}

async fn send<T: Serialize>(
    tx: &mpsc::Sender<Event>,
    name: &str,
    data: &T,
    position: StreamPosition,
) -> Result<(), StreamEnd> {
    let event = Event::default()
        .event(name)
        .id(position.to_event_id())
        .json_data(data)
        .map_err(StreamEnd::Encode)?;
    tx.send(event).await.map_err(|_| StreamEnd::ClientGone)
}

/// Status changes of every run the caller may read (`event: status`), for the runs table. A
/// client that fell too far behind gets `event: lagged` and should reload the table.
#[utoipa::path(get, path = "/api/v1/events", tag = "events",
    responses(
        (status = 200, description = "text/event-stream of `status` events, and `lagged` when the client fell behind", content_type = "text/event-stream", body = String),
        (status = 429, description = "The caller or its address holds its share of open streams; `Retry-After` says when to try again", body = ErrorBody),
    ))]
#[instrument(skip(state, principal, peer))]
pub async fn all_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    peer: PeerAddr,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let slot = stream_slot(&state, &principal, &peer)?;
    let mut receiver = state.live.subscribe_all();
    let mut access = StreamAccess::new(&state, principal, Scope::AllRuns);
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        // Held for as long as the stream runs.
        let _slot = slot;
        loop {
            let received = tokio::select! {
                _ = state.live.closed() => return,
                _ = tx.closed() => return,
                () = access.changed() => None,
                received = receiver.recv() => Some(received),
            };
            // A revoked credential ends the stream; a grant given or taken while it is open
            // counts from the next event on (each run's answer is kept until access changes).
            if !access.allowed().await {
                return;
            }
            let event = match received {
                None => continue,
                Some(Ok(run_event)) if !access.may_read_run(&run_event.run_id).await => continue,
                Some(Ok(run_event)) => Event::default()
                    .event(names::STATUS)
                    .id(format!("e{}", run_event.seq))
                    .json_data(run_event.as_ref()),
                Some(Err(broadcast::error::RecvError::Lagged(missed))) => Event::default()
                    .event(names::LAGGED)
                    .json_data(serde_json::json!({ "missed": missed })),
                Some(Err(broadcast::error::RecvError::Closed)) => return,
            };
            match event {
                Ok(event) => {
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot encode a status event"),
            }
        }
    });
    Ok(Sse::new(ReceiverStream::new(rx).map(Ok)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::AppState;
    use crate::ingest::ingest_points;
    use crate::settings::Settings;
    use crate::store::{MetricPoint, NewRun};

    #[tokio::test]
    async fn a_lagging_subscriber_catches_up_from_the_store_without_gaps_or_repeats() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let store = crate::store::connect(&url).await.expect("store");
        let settings = Settings::new(([127, 0, 0, 1], 0).into(), dir.path());
        let state = AppState::new(store, settings);
        let run = state
            .store
            .create_run(NewRun {
                experiment_id: "0".into(),
                ..Default::default()
            })
            .await
            .expect("run");
        let subscription = state.live.subscribe_run(&run.id);
        // A one-slot outbox that nobody drains yet: the stream task blocks, the broadcast
        // channel overflows and the subscriber lags.
        let (tx, mut rx) = mpsc::channel(1);
        let task_state = state.clone();
        let run_id = run.id.clone();
        let task = tokio::spawn(async move {
            let position = StreamPosition::default();
            let mut access = StreamAccess::new(&task_state, Principal::Local, Scope::AllRuns);
            let _ = stream_run(
                &task_state,
                &run_id,
                position,
                None,
                subscription,
                &mut access,
                &tx,
            )
            .await;
        });
        let total = 3 * 256;
        for step in 0..total {
            let point = MetricPoint {
                key: "loss".into(),
                step,
                value: 1.0,
                time: None,
            };
            ingest_points(state.store.as_ref(), &state.live, &run.id, &[point])
                .await
                .expect("ingest");
        }
        let mut steps = Vec::new();
        while steps.len() < total as usize {
            let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("events keep coming")
                .expect("stream open");
            // Events only render to text; read the steps back from the SSE wire form.
            let text = format!("{event:?}");
            steps.extend(extract_steps(&text));
        }
        assert_eq!(steps, (0..total).collect::<Vec<i64>>());
        state.live.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }

    /// Pulls `"step":N` values out of an event's debug text (which holds its JSON data).
    fn extract_steps(text: &str) -> Vec<i64> {
        text.split("\\\"step\\\":")
            .skip(1)
            .filter_map(|rest| {
                let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                digits.parse().ok()
            })
            .collect()
    }

    #[test]
    fn a_failed_stream_ends_with_an_event_not_named_like_the_browsers_connection_error() {
        // Events only render to text: read the name back from the SSE wire form.
        let text = format!("{:?}", stream_error());
        assert!(text.contains("event: stream_error\\n"), "{text}");
        assert!(!text.contains("event: error\\n"), "{text}");
    }

    #[test]
    fn an_event_id_round_trips_through_its_text_form() {
        for pos in [
            StreamPosition::default(),
            StreamPosition {
                point_seq: Some(42),
                event_seq: None,
            },
            StreamPosition {
                point_seq: Some(7),
                event_seq: Some(3),
            },
        ] {
            assert_eq!(StreamPosition::parse(&pos.to_event_id()), Ok(pos));
        }
    }

    #[test]
    fn malformed_event_ids_are_rejected() {
        for bad in ["", "42", "p1", "p1.x2", "px.e1", "p1.e1.e2"] {
            assert!(StreamPosition::parse(bad).is_err(), "{bad}");
        }
    }
}
