//! Revocation reaches what is already open: a revoked token, a disabled user or a removed grant
//! ends the event streams it opened (or, for the stream of every run, leaves out the runs no
//! longer readable), and a disabled user's sweeps are paused and launch nothing more.
//!
//! None of these waits for time to pass: a stream that should end is read until the server ends
//! it (a stream still open after 10 s of silence fails the test), and an event that must not
//! arrive is followed by one that must, published after it on the same ordered channel.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use trainyard::app::Settings;

use super::{accounts, add_user, admin, send, sign_in, Auth, ADMIN_TOKEN, PASSWORD};
use crate::helpers::{SseClient, TestApp};

crate::on_both_backends_with!(accounts;
    streams_opened_with_a_token_end_when_the_token_is_revoked,
    a_run_stream_ends_when_its_user_is_disabled,
    a_removed_grant_stops_the_runs_events_on_open_streams_at_once,
);
crate::on_both_backends_with!(accounts_and_commands;
    a_disabled_users_sweep_is_paused_with_the_reason_and_launches_no_more_trials,
);

fn accounts_and_commands(s: &mut Settings) {
    accounts(s);
    s.allow_command_launch = true;
}

/// Opens an event stream as `auth` (the stream may stay open far longer than a request).
async fn open(app: &TestApp, auth: &Auth, path: &str) -> SseClient {
    let client = reqwest::Client::new();
    let request = client
        .get(app.url(path))
        .header("accept", "text/event-stream")
        .timeout(Duration::from_secs(3600));
    let response = auth.apply(request).send().await.expect("open a stream");
    assert_eq!(response.status(), StatusCode::OK, "opening {path}");
    SseClient::from_response(response)
}

/// Sends a request as `auth` and asserts it succeeded; the JSON answer.
async fn ok(app: &TestApp, auth: &Auth, method: Method, path: &str, body: Value) -> Value {
    let response = send(app, auth, method, path, Some(&body)).await;
    let status = response.status();
    let text = response.text().await.expect("body");
    assert!(status.is_success(), "{path}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

async fn new_run(app: &TestApp, auth: &Auth, experiment: &str) -> String {
    let run = ok(
        app,
        auth,
        Method::POST,
        "/api/v1/runs",
        json!({"experiment": experiment}),
    )
    .await;
    run["id"].as_str().expect("run id").to_owned()
}

async fn set_status(app: &TestApp, auth: &Auth, run: &str, status: &str) {
    ok(
        app,
        auth,
        Method::PATCH,
        &format!("/api/v1/runs/{run}"),
        json!({"status": status}),
    )
    .await;
}

/// The next `status` event of the stream to `to_status` (other events skipped).
async fn next_status(stream: &mut SseClient, to_status: &str) -> Value {
    loop {
        let event = stream.next_event().await;
        if event.event == "status" && event.data["to_status"] == to_status {
            return event.data;
        }
    }
}

async fn streams_opened_with_a_token_end_when_the_token_is_revoked(app: &TestApp) {
    add_user(app, "alice", false).await;
    let session = sign_in(app, "alice", PASSWORD).await;
    let created = ok(
        app,
        &session,
        Method::POST,
        "/api/v1/tokens",
        json!({"name": "laptop", "scope": "read"}),
    )
    .await;
    let token_id = created["token"]["id"]
        .as_str()
        .expect("token id")
        .to_owned();
    let token = Auth::Bearer(created["secret"].as_str().expect("secret").to_owned());
    let run = new_run(app, &session, "alices").await;

    let mut all_by_token = open(app, &token, "/api/v1/events").await;
    let mut run_by_token = open(app, &token, &format!("/api/v1/runs/{run}/events")).await;
    let mut all_by_session = open(app, &session, "/api/v1/events").await;
    set_status(app, &session, &run, "running").await;
    assert_eq!(
        next_status(&mut all_by_token, "running").await["run_id"],
        run.as_str()
    );
    assert_eq!(
        next_status(&mut all_by_session, "running").await["run_id"],
        run.as_str()
    );

    let revoked = send(
        app,
        &session,
        Method::DELETE,
        &format!("/api/v1/tokens/{token_id}"),
        None,
    )
    .await;
    assert_eq!(revoked.status(), StatusCode::NO_CONTENT);
    set_status(app, &session, &run, "finished").await;

    let after = all_by_token.until_end().await;
    assert!(after.is_empty(), "nothing after the revocation: {after:?}");
    let after = run_by_token.until_end().await;
    assert!(
        after
            .iter()
            .all(|e| e.event != "status" || e.data["to_status"] != "finished"),
        "no event stored after the revocation: {after:?}"
    );
    // The same user's session still holds: its stream goes on.
    let still = next_status(&mut all_by_session, "finished").await;
    assert_eq!(still["run_id"], run.as_str());
    // And the token is refused when it tries again.
    let again = send(app, &token, Method::GET, "/api/v1/events", None).await;
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
}

async fn a_run_stream_ends_when_its_user_is_disabled(app: &TestApp) {
    add_user(app, "alice", false).await;
    let session = sign_in(app, "alice", PASSWORD).await;
    let run = new_run(app, &session, "alices").await;
    let mut stream = open(app, &session, &format!("/api/v1/runs/{run}/events")).await;
    let mut all = open(app, &session, "/api/v1/events").await;
    let mut log = open(
        app,
        &session,
        &format!("/api/v1/runs/{run}/logs?follow=true"),
    )
    .await;
    set_status(app, &session, &run, "running").await;
    next_status(&mut stream, "running").await;

    admin(
        app,
        Method::PATCH,
        "/api/v1/users/alice",
        json!({"disabled": true}),
    )
    .await;
    let root = Auth::Bearer(ADMIN_TOKEN.into());
    set_status(app, &root, &run, "finished").await;

    for (name, stream) in [
        ("run", &mut stream),
        ("all runs", &mut all),
        ("log", &mut log),
    ] {
        let after = stream.until_end().await;
        assert!(
            after
                .iter()
                .all(|e| e.event != "status" || e.data["to_status"] != "finished"),
            "the {name} stream sent an event stored after alice was disabled: {after:?}"
        );
    }
    let again = send(app, &session, Method::GET, "/api/v1/events", None).await;
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
}

async fn a_removed_grant_stops_the_runs_events_on_open_streams_at_once(app: &TestApp) {
    let root = Auth::Bearer(ADMIN_TOKEN.into());
    add_user(app, "bob", false).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    let shared = new_run(app, &root, "shared").await;
    let grants = "/api/v1/experiments/shared/grants";
    admin(
        app,
        Method::PUT,
        grants,
        json!({"user": "bob", "level": "read"}),
    )
    .await;
    let own = new_run(app, &bob, "bobs").await;

    let mut all = open(app, &bob, "/api/v1/events").await;
    let mut run_stream = open(app, &bob, &format!("/api/v1/runs/{shared}/events")).await;
    let mut log = open(
        app,
        &bob,
        &format!("/api/v1/runs/{shared}/logs?follow=true"),
    )
    .await;
    // Readable while the grant holds.
    set_status(app, &root, &shared, "running").await;
    assert_eq!(
        next_status(&mut all, "running").await["run_id"],
        shared.as_str()
    );
    next_status(&mut run_stream, "running").await;

    admin(
        app,
        Method::PUT,
        grants,
        json!({"user": "bob", "level": "none"}),
    )
    .await;
    let hidden = send(
        app,
        &bob,
        Method::GET,
        &format!("/api/v1/runs/{shared}"),
        None,
    )
    .await;
    assert_eq!(hidden.status(), StatusCode::NOT_FOUND);

    // Written after the removal: a point and a status change of the hidden run, then a status
    // change of bob's own run. The stream of every run carries status changes in the order they
    // were published, so bob's arriving first means the hidden one was left out.
    ok(
        app,
        &root,
        Method::POST,
        &format!("/api/v1/runs/{shared}/metrics"),
        json!({"points": [{"key": "loss", "step": 1, "value": 0.5}]}),
    )
    .await;
    set_status(app, &root, &shared, "finished").await;
    set_status(app, &bob, &own, "running").await;
    let next = next_status(&mut all, "running").await;
    assert_eq!(next["run_id"], own.as_str(), "{next}");

    // The run's own streams end without sending what was written after the removal.
    let after = run_stream.until_end().await;
    assert!(
        after
            .iter()
            .all(|e| e.event != "points" && e.data["to_status"] != "finished"),
        "{after:?}"
    );
    let after = log.until_end().await;
    assert!(after.is_empty(), "{after:?}");
}

/// A command sweep whose trials sleep (they never report): two at once, four in all.
async fn sleeping_sweep(app: &TestApp, auth: &Auth) -> String {
    let spec = json!({
        "name": "sleepers", "experiment": "alices-sweeps",
        "base": {"command": ["sh", "-c", "sleep 60", "trial"]},
        "metric": {"name": "loss"}, "method": "grid", "parallel": 2,
        "parameters": {"x": {"values": [1, 2, 3, 4]}}
    });
    let sweep = ok(
        app,
        auth,
        Method::POST,
        "/api/v1/sweeps",
        json!({"spec": spec}),
    )
    .await;
    sweep["id"].as_str().expect("sweep id").to_owned()
}

async fn sweep_until(app: &TestApp, id: &str, what: impl Fn(&Value) -> bool) -> Value {
    let root = Auth::Bearer(ADMIN_TOKEN.into());
    let path = format!("/api/v1/sweeps/{id}");
    for _ in 0..300 {
        let sweep = ok(app, &root, Method::GET, &path, Value::Null).await;
        if what(&sweep) {
            return sweep;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("sweep {id} did not get there");
}

async fn a_disabled_users_sweep_is_paused_with_the_reason_and_launches_no_more_trials(
    app: &TestApp,
) {
    let root = Auth::Bearer(ADMIN_TOKEN.into());
    add_user(app, "alice", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let id = sleeping_sweep(app, &alice).await;
    sweep_until(app, &id, |s| s["counts"]["running"] == 2).await;
    let mut events = open(app, &alice, &format!("/api/v1/sweeps/{id}/events")).await;
    assert_eq!(events.next_event().await.event, "sweep");

    admin(
        app,
        Method::PATCH,
        "/api/v1/users/alice",
        json!({"disabled": true}),
    )
    .await;
    let reason = "paused: its creator alice was disabled";
    let path = format!("/api/v1/sweeps/{id}");
    let sweep = ok(app, &root, Method::GET, &path, Value::Null).await;
    assert_eq!(sweep["state"], "paused", "{sweep:#}");
    assert_eq!(sweep["message"], reason, "{sweep:#}");
    // The sweep's page says why.
    let page = send(app, &root, Method::GET, &format!("/sweeps/{id}"), None).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.expect("page").contains(reason));
    // Alice's open stream of it ended with her account.
    events.until_end().await;

    // Room for two more trials, and resumed by an administrator: the controller checks the
    // creator before launching and pauses the sweep again instead.
    ok(app, &root, Method::PATCH, &path, json!({"parallel": 4})).await;
    let resumed = ok(
        app,
        &root,
        Method::POST,
        &format!("{path}/resume"),
        json!({}),
    )
    .await;
    // The resume is accepted; the controller, woken by it, may pause the sweep again before
    // the handler reads it back. The controller's own audited pause below proves it did.
    assert!(
        matches!(resumed["state"].as_str(), Some("running" | "paused")),
        "{resumed:#}"
    );
    let paused = sweep_until(app, &id, |s| s["state"] == "paused").await;
    assert_eq!(paused["message"], reason, "{paused:#}");
    assert_eq!(
        paused["trials"].as_array().expect("trials").len(),
        2,
        "no trial after alice was disabled: {paused:#}"
    );
    // The controller audits its pause right after storing it: wait for the entry.
    let mut audit = Value::Null;
    for _ in 0..300 {
        audit = ok(
            app,
            &root,
            Method::GET,
            "/api/v1/audit?limit=1000",
            Value::Null,
        )
        .await;
        let pauses = audit["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["action"] == "sweep_pause" && e["target"] == id.as_str())
            .count();
        if pauses >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let entries = audit["entries"].as_array().expect("entries");
    let pauses: Vec<&Value> = entries
        .iter()
        .filter(|e| e["action"] == "sweep_pause" && e["target"] == id.as_str())
        .collect();
    assert!(
        pauses.iter().any(|e| e["actor"] == "admin-token"),
        "the disable paused it: {audit:#}"
    );
    assert!(
        pauses.iter().any(|e| e["actor"] == "server"),
        "the controller refused to launch: {audit:#}"
    );
    assert!(pauses.iter().all(|e| e["detail"] == reason), "{audit:#}");
    let launches: Vec<&Value> = entries
        .iter()
        .filter(|e| e["action"] == "run_launch")
        .collect();
    assert_eq!(launches.len(), 2, "{audit:#}");
    assert!(launches.iter().all(|e| e["actor"] == "alice"), "{audit:#}");
    ok(app, &root, Method::POST, &format!("{path}/stop"), json!({})).await;
}
