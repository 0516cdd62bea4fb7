use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, State};
use axum::http::HeaderMap;
use axum::routing::{patch, post};
use axum::{Json, Router};

use super::*;

fn line(step: i64) -> MetricsLine {
    let mut metrics = BTreeMap::new();
    metrics.insert("train/loss".to_string(), 5.0 - step as f64 * 0.01);
    metrics.insert("lr".to_string(), 1e-3);
    MetricsLine {
        step,
        time: unix_ms(),
        metrics,
    }
}

fn read_lines(dir: &Path) -> Vec<MetricsLine> {
    fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<MetricsLine>(l).unwrap())
        .collect()
}

#[test]
fn every_logged_step_is_one_parsable_line_in_metrics_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Reporter::open(dir.path(), None, None).unwrap();
    for step in 0..5 {
        r.log(&line(step)).unwrap();
    }
    let mut nan = line(5);
    nan.metrics.insert("grad_norm".into(), f64::NAN);
    r.log(&nan).unwrap();
    r.finish(RunStatus::Finished, None);
    let lines = read_lines(dir.path());
    assert_eq!(
        lines.iter().map(|l| l.step).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4, 5]
    );
    assert_eq!(lines[2].metrics["train/loss"], 4.98);
    assert!(
        !lines[5].metrics.contains_key("grad_norm"),
        "NaN is not JSON"
    );
}

#[test]
fn resuming_drops_lines_after_the_checkpoint_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Reporter::open(dir.path(), None, None).unwrap();
    for step in 1..=8 {
        r.log(&line(step)).unwrap();
    }
    drop(r);
    let mut r = Reporter::open(dir.path(), Some(5), None).unwrap();
    r.log(&line(6)).unwrap();
    let steps: Vec<i64> = read_lines(dir.path()).iter().map(|l| l.step).collect();
    assert_eq!(steps, vec![1, 2, 3, 4, 5, 6]);
}

#[derive(Default)]
struct Received {
    batches: Vec<MetricBatch>,
    patches: Vec<RunPatch>,
    auth: Vec<String>,
    /// "metrics" or "patch", in the order the requests arrived.
    order: Vec<&'static str>,
}

type Shared = Arc<Mutex<Received>>;

async fn take_metrics(
    State(s): State<Shared>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    Json(batch): Json<MetricBatch>,
) -> Json<serde_json::Value> {
    assert_eq!(id, "run42");
    let mut s = s.lock().unwrap();
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    s.auth.push(auth);
    s.batches.push(batch);
    s.order.push("metrics");
    Json(serde_json::json!({}))
}

async fn take_patch(State(s): State<Shared>, Json(p): Json<RunPatch>) -> Json<serde_json::Value> {
    let mut s = s.lock().unwrap();
    s.patches.push(p);
    s.order.push("patch");
    Json(serde_json::json!({}))
}

/// A watcher that sees the final status must find every step: the last points go before it,
/// even when they were all still pending when training ended.
#[test]
fn the_final_status_is_sent_after_the_last_points() {
    let received: Shared = Arc::default();
    let app = Router::new()
        .route("/api/v1/runs/{id}/metrics", post(take_metrics))
        .route("/api/v1/runs/{id}", patch(take_patch))
        .with_state(received.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let target = ServerTarget {
        url,
        run_id: "run42".into(),
        token: None,
        // Longer than the run: every point is still pending at the end.
        flush_interval: Duration::from_secs(3600),
        final_flush_timeout: Duration::from_secs(20),
        heartbeat_interval: Duration::from_secs(3600),
    };
    let mut r = Reporter::open(dir.path(), None, Some(target)).unwrap();
    for step in 0..5 {
        r.log(&line(step)).unwrap();
    }
    r.finish(RunStatus::Finished, None);
    let got = received.lock().unwrap();
    assert_eq!(got.order.last(), Some(&"patch"), "{:?}", got.order);
    assert!(got.order.contains(&"metrics"), "{:?}", got.order);
    let final_status: Vec<_> = got.patches.iter().filter_map(|p| p.status).collect();
    assert_eq!(final_status, vec![RunStatus::Finished]);
}

#[test]
fn points_logged_while_the_server_is_down_arrive_exactly_once_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    // Reserve a port, then free it: connections are refused until the server binds it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let target = ServerTarget {
        url: format!("http://{addr}"),
        run_id: "run42".into(),
        token: Some("secret".into()),
        flush_interval: Duration::from_millis(30),
        final_flush_timeout: Duration::from_secs(20),
        heartbeat_interval: Duration::from_secs(3600),
    };
    let mut r = Reporter::open(dir.path(), None, Some(target)).unwrap();
    r.patch(RunPatch {
        status: Some(RunStatus::Running),
        ..RunPatch::default()
    });
    for step in 0..20 {
        r.log(&line(step)).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    let spooled = fs::read_dir(dir.path().join("spool")).unwrap().count();
    assert!(
        spooled > 0,
        "points logged while the server is down are spooled"
    );

    let received: Shared = Arc::default();
    let app = Router::new()
        .route("/api/v1/runs/{id}/metrics", post(take_metrics))
        .route("/api/v1/runs/{id}", patch(take_patch))
        .with_state(received.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind(addr)).unwrap();
    rt.spawn(async move { axum::serve(listener, app).await });

    for step in 20..40 {
        r.log(&line(step)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    r.finish(RunStatus::Finished, Some("done".into()));

    let got = received.lock().unwrap();
    let points: Vec<&MetricPoint> = got.batches.iter().flat_map(|b| &b.points).collect();
    let mut seen = std::collections::BTreeSet::new();
    for p in &points {
        assert!(
            seen.insert((p.key.clone(), p.step)),
            "{} @ {} sent twice",
            p.key,
            p.step
        );
    }
    assert_eq!(points.len(), 80, "40 steps × 2 keys");
    let steps: Vec<i64> = points.iter().map(|p| p.step).collect();
    assert!(
        steps.windows(2).all(|w| w[0] <= w[1]),
        "in step order: {steps:?}"
    );
    assert!(got.auth.iter().all(|a| a == "Bearer secret"));
    let statuses: Vec<_> = got.patches.iter().filter_map(|p| p.status).collect();
    assert_eq!(statuses, vec![RunStatus::Running, RunStatus::Finished]);
    let left = fs::read_dir(dir.path().join("spool"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "json")
        })
        .count();
    assert_eq!(left, 0, "the spool is drained");
}

/// A metrics endpoint that refuses batches over `limit` points the way the server does (422
/// naming `points`), or with a 413 as a body-size limit in front of it would.
fn limited_server(
    limit: usize,
    refuse_with_413: bool,
) -> (String, Shared, tokio::runtime::Runtime) {
    async fn take(
        State((s, limit, use_413)): State<(Shared, usize, bool)>,
        Json(batch): Json<MetricBatch>,
    ) -> axum::response::Response {
        use axum::response::IntoResponse;
        if batch.points.len() > limit {
            if use_413 {
                return axum::http::StatusCode::PAYLOAD_TOO_LARGE.into_response();
            }
            let body = serde_json::json!({"error": {
                "code": "unprocessable",
                "field": "points",
                "message": format!("a request may carry at most {limit} points"),
            }});
            return (axum::http::StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response();
        }
        s.lock().unwrap().batches.push(batch);
        Json(serde_json::json!({})).into_response()
    }
    async fn ok() -> Json<serde_json::Value> {
        Json(serde_json::json!({}))
    }
    let received: Shared = Arc::default();
    let app = Router::new()
        .route("/api/v1/runs/{id}/metrics", post(take))
        .route("/api/v1/runs/{id}", patch(ok))
        .with_state((received.clone(), limit, refuse_with_413));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    (url, received, rt)
}

/// Logs `steps` steps of `keys` metrics each with a flush interval longer than the run, so
/// everything is pending at the final flush; returns the reporter's directory.
fn log_everything_at_once(url: String, steps: i64, keys: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let target = ServerTarget {
        url,
        run_id: "run42".into(),
        token: None,
        flush_interval: Duration::from_secs(3600),
        final_flush_timeout: Duration::from_secs(60),
        heartbeat_interval: Duration::from_secs(3600),
    };
    let mut r = Reporter::open(dir.path(), None, Some(target)).unwrap();
    for step in 0..steps {
        let metrics = (0..keys)
            .map(|k| (format!("key{k}"), step as f64))
            .collect::<BTreeMap<_, _>>();
        r.log(&MetricsLine {
            step,
            time: unix_ms(),
            metrics,
        })
        .unwrap();
    }
    r.finish(RunStatus::Finished, None);
    dir
}

fn assert_every_point_arrived_once(received: &Shared, steps: i64, keys: usize, max_batch: usize) {
    let got = received.lock().unwrap();
    assert!(
        got.batches.iter().all(|b| b.points.len() <= max_batch),
        "batch sizes {:?}",
        got.batches
            .iter()
            .map(|b| b.points.len())
            .collect::<Vec<_>>()
    );
    let unique: std::collections::BTreeSet<(String, i64)> = got
        .batches
        .iter()
        .flat_map(|b| &b.points)
        .map(|p| (p.key.clone(), p.step))
        .collect();
    assert_eq!(unique.len(), steps as usize * keys);
}

#[test]
fn more_pending_points_than_the_server_takes_in_one_request_are_sent_in_several_batches() {
    // 3,000 steps × 5 keys = 15,000 points, all pending at once.
    let (url, received, _rt) = limited_server(MAX_POINTS_PER_BATCH, false);
    let dir = log_everything_at_once(url, 3000, 5);
    assert_every_point_arrived_once(&received, 3000, 5, MAX_POINTS_PER_BATCH);
    assert!(
        !dir.path().join("spool").join("rejected").exists(),
        "nothing was refused"
    );
}

#[test]
fn a_batch_refused_as_too_large_is_split_and_sent_again_instead_of_dropped() {
    for refuse_with_413 in [true, false] {
        let (url, received, _rt) = limited_server(700, refuse_with_413);
        log_everything_at_once(url, 1500, 2);
        assert_every_point_arrived_once(&received, 1500, 2, 700);
    }
}

#[test]
fn a_reason_longer_than_the_server_takes_is_shortened_at_a_character_boundary() {
    let long = "é".repeat(MAX_REASON_LEN);
    let short = shorten(long, MAX_REASON_LEN);
    assert!(short.len() <= MAX_REASON_LEN);
    assert!(short.ends_with('…'));
    assert_eq!(shorten("fine".into(), MAX_REASON_LEN), "fine");
}

/// What a mock server saw of heartbeats: (run id, authorization header, body) per beat, and
/// whether a beat came after the final status.
#[derive(Default)]
struct Beats {
    beats: Vec<(String, String, String)>,
    final_status_seen: bool,
    beat_after_final_status: bool,
}

type SharedBeats = Arc<Mutex<Beats>>;

/// A server that takes heartbeats (204, or `status` for every beat), status patches and metrics.
fn heartbeat_server(status: u16) -> (String, SharedBeats, tokio::runtime::Runtime) {
    use axum::http::StatusCode;
    async fn beat(
        State((s, status)): State<(SharedBeats, u16)>,
        UrlPath(id): UrlPath<String>,
        headers: HeaderMap,
        body: String,
    ) -> StatusCode {
        let mut s = s.lock().unwrap();
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        s.beat_after_final_status |= s.final_status_seen;
        s.beats.push((id, auth, body));
        StatusCode::from_u16(status).unwrap()
    }
    async fn status_patch(
        State((s, _)): State<(SharedBeats, u16)>,
        Json(p): Json<RunPatch>,
    ) -> Json<serde_json::Value> {
        if p.status.is_some_and(RunStatus::is_terminal) {
            s.lock().unwrap().final_status_seen = true;
        }
        Json(serde_json::json!({}))
    }
    async fn ok() -> Json<serde_json::Value> {
        Json(serde_json::json!({}))
    }
    let beats: SharedBeats = Arc::default();
    let app = Router::new()
        .route("/api/v1/runs/{id}/heartbeat", post(beat))
        .route("/api/v1/runs/{id}/metrics", post(ok))
        .route("/api/v1/runs/{id}", patch(status_patch))
        .with_state((beats.clone(), status));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    (url, beats, rt)
}

fn beating_reporter(url: String, dir: &Path) -> Reporter {
    let target = ServerTarget {
        url,
        run_id: "run42".into(),
        token: Some("secret".into()),
        flush_interval: Duration::from_millis(20),
        final_flush_timeout: Duration::from_secs(20),
        heartbeat_interval: Duration::from_millis(20),
    };
    Reporter::open(dir, None, Some(target)).unwrap()
}

fn wait_for_beats(beats: &SharedBeats, n: usize) {
    for _ in 0..500 {
        if beats.lock().unwrap().beats.len() >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("fewer than {n} heartbeats arrived");
}

#[test]
fn a_reporting_run_sends_heartbeats_with_its_token_and_none_after_its_final_status() {
    let (url, beats, _rt) = heartbeat_server(204);
    let dir = tempfile::tempdir().unwrap();
    let mut r = beating_reporter(url, dir.path());
    r.log(&line(1)).unwrap();
    wait_for_beats(&beats, 3);
    r.finish(RunStatus::Finished, None);
    let seen = beats.lock().unwrap().beats.len();
    std::thread::sleep(Duration::from_millis(200));
    let b = beats.lock().unwrap();
    assert_eq!(b.beats.len(), seen, "no beat after finish");
    assert!(b.final_status_seen);
    assert!(!b.beat_after_final_status);
    for (id, auth, body) in &b.beats {
        assert_eq!(
            (id.as_str(), auth.as_str(), body.as_str()),
            ("run42", "Bearer secret", "{}")
        );
    }
}

#[test]
fn a_server_without_heartbeats_gets_one_and_training_reports_on() {
    let (url, beats, _rt) = heartbeat_server(404);
    let dir = tempfile::tempdir().unwrap();
    let mut r = beating_reporter(url, dir.path());
    wait_for_beats(&beats, 1);
    // Ten more intervals: a heartbeat thread that kept going would have sent more by now.
    for step in 0..10 {
        r.log(&line(step)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    r.finish(RunStatus::Finished, None);
    let b = beats.lock().unwrap();
    assert_eq!(b.beats.len(), 1);
    assert!(b.final_status_seen, "the run still reported its status");
}
