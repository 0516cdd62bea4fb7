//! Runs reporting from elsewhere: heartbeats, `lost`, and coming back.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{assert_error, TestApp};
use crate::on_both_backends;
use trainyard::liveness::mark_silent_runs_lost;
use trainyard::store::now_ms;

on_both_backends!(
    a_silent_running_run_is_marked_lost_and_a_heartbeat_brings_it_back,
    a_run_that_keeps_reporting_is_never_marked_lost,
    a_heartbeat_for_an_unknown_run_is_a_404,
);

/// A moment past the watchdog's limit, seen from now.
fn after_the_limit(app: &TestApp) -> i64 {
    now_ms() + app.state.settings.lost_after.as_millis() as i64 + 1_000
}

async fn running_run(app: &TestApp) -> String {
    let id = app.create_run("liveness").await;
    let res = app
        .patch_json(&format!("/api/v1/runs/{id}"), &json!({"status": "running"}))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    id
}

async fn a_silent_running_run_is_marked_lost_and_a_heartbeat_brings_it_back(app: &TestApp) {
    let id = running_run(app).await;
    let created = app.create_run("liveness").await; // never started: never lost
                                                    // Within the limit nothing happens.
    let marked = mark_silent_runs_lost(&app.state, now_ms()).await.unwrap();
    assert!(marked.is_empty(), "{marked:?}");
    let marked = mark_silent_runs_lost(&app.state, after_the_limit(app))
        .await
        .unwrap();
    assert_eq!(marked, vec![id.clone()]);
    let run = app.get_json(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(run["status"], "lost");
    let created = app.get_json(&format!("/api/v1/runs/{created}")).await;
    assert_eq!(created["status"], "created");
    let events = app.state.store.run_events(&id, None).await.unwrap();
    let reason = events
        .last()
        .and_then(|e| e.reason.clone())
        .unwrap_or_default();
    assert!(reason.contains("no heartbeat"), "{reason}");
    // Lost runs are found by status like any other.
    let lost = app.get_query("/api/v1/runs", &[("status", "lost")]).await;
    assert_eq!(lost["runs"].as_array().map(Vec::len), Some(1));
    // The client speaks again.
    let res = app
        .post_json(&format!("/api/v1/runs/{id}/heartbeat"), &json!({}))
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let run = app.get_json(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(run["status"], "running");
    // Nobody but the server declares a run lost.
    let res = app
        .patch_json(&format!("/api/v1/runs/{id}"), &json!({"status": "lost"}))
        .await;
    assert_error(res, StatusCode::CONFLICT, "conflict", Some("status")).await;
}

async fn a_run_that_keeps_reporting_is_never_marked_lost(app: &TestApp) {
    let id = running_run(app).await;
    let limit = app.state.settings.lost_after.as_millis() as i64;
    // Its heartbeat is noted now; a sweep one limit later (minus a margin) spares it.
    let res = app
        .post_json(&format!("/api/v1/runs/{id}/heartbeat"), &json!({}))
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let marked = mark_silent_runs_lost(&app.state, now_ms() + limit - 5_000)
        .await
        .unwrap();
    assert!(marked.is_empty(), "{marked:?}");
    // Metrics count as a sign of life too: a lost run that posts metrics is running again.
    mark_silent_runs_lost(&app.state, after_the_limit(app) + limit)
        .await
        .unwrap();
    assert_eq!(
        app.get_json(&format!("/api/v1/runs/{id}")).await["status"],
        "lost"
    );
    app.post_points(&id, &[("loss", 1, 2.0)]).await;
    assert_eq!(
        app.get_json(&format!("/api/v1/runs/{id}")).await["status"],
        "running"
    );
}

async fn a_heartbeat_for_an_unknown_run_is_a_404(app: &TestApp) {
    let res = app
        .post_json(
            "/api/v1/runs/0123456789abcdef0123456789abcdef/heartbeat",
            &json!({}),
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found", None).await;
}
