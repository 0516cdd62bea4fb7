//! The sweeps API without the trainer: a spec that cannot run is refused whole with a 400
//! naming the key or parameter (and nothing is stored), command sweeps need the operator's
//! consent, pause, resume, stop and changes follow the sweep's state, and the event stream
//! follows the sweep until it ends.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{assert_error, SseClient, TestApp};
use crate::{on_both_backends, on_both_backends_with};

on_both_backends!(a_spec_that_cannot_run_is_refused_naming_the_key_and_nothing_is_stored);
on_both_backends_with!(
    allow_commands;
    pause_resume_stop_and_changes_follow_the_state_of_the_sweep,
    the_event_stream_sends_the_sweep_at_once_and_after_each_change_until_it_ends,
);
on_both_backends!(a_command_sweep_needs_the_operators_consent);

fn allow_commands(s: &mut trainyard::app::Settings) {
    s.allow_command_launch = true;
}

fn spec(parameters: Value, base: Value) -> Value {
    json!({
        "name": "s", "experiment": "sweeps", "base": base,
        "metric": {"name": "val/loss"}, "method": "random", "max_trials": 4,
        "parameters": parameters
    })
}

async fn a_spec_that_cannot_run_is_refused_naming_the_key_and_nothing_is_stored(app: &TestApp) {
    let tiny = json!({"profile": "tiny"});
    let lr = json!({"training.learning_rate": {"distribution": "log_uniform", "min": 1.0e-4, "max": 1.0e-2}});
    let cases: Vec<(Value, &str)> = vec![
        // Not a config key of the trainer.
        (
            spec(
                json!({"training.learning_rat": {"values": [0.1]}}),
                tiny.clone(),
            ),
            "parameters.training.learning_rat",
        ),
        // A value the space can produce that the trainer refuses (63 is no multiple of 4 heads).
        (
            spec(json!({"model.d_model": {"values": [64, 63]}}), tiny.clone()),
            "parameters.model.d_model",
        ),
        // The top of the range breaks the trainer's rule min_lr <= learning_rate at its bottom.
        (
            spec(
                json!({"training.learning_rate": {"distribution": "log_uniform", "min": 1.0e-6, "max": 1.0e-2}}),
                tiny.clone(),
            ),
            "parameters.training.learning_rate",
        ),
        (
            spec(
                json!({"training.learning_rate": {"distribution": "log_uniform", "min": 0, "max": 1}}),
                tiny.clone(),
            ),
            "parameters.training.learning_rate.min",
        ),
        (
            spec(lr.clone(), json!({"profile": "no-such-profile"})),
            "base.profile",
        ),
        (
            spec(
                lr.clone(),
                json!({"profile": "tiny", "overrides": {"training.max_stepz": 3}}),
            ),
            "base.overrides.training.max_stepz",
        ),
        (
            json!({"name": "s", "base": tiny.clone(), "metric": {"name": "loss"}, "method": "bays", "max_trials": 2, "parameters": lr.clone()}),
            "method",
        ),
        (
            json!({"name": "s", "base": tiny.clone(), "metric": {"name": "loss"}, "method": "random", "max_trials": 2, "parameters": lr.clone(), "resources": {"gpus": 2}}),
            "resources.gpus",
        ),
        (json!(42), "spec"),
        (json!("name: [unclosed"), "spec"),
    ];
    for (body, field) in cases {
        let response = app
            .post_json("/api/v1/sweeps", &json!({ "spec": body }))
            .await;
        let error = assert_error(
            response,
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some(field),
        )
        .await;
        let message = error["message"].as_str().unwrap();
        assert!(
            !message.contains("Some(") && !message.contains("::"),
            "{message}"
        );
    }
    let list = app.get_json("/api/v1/sweeps").await;
    assert_eq!(
        list["sweeps"],
        json!([]),
        "nothing of a refused spec is stored"
    );
    let runs = app.get_json("/api/v1/runs").await;
    assert_eq!(runs["runs"], json!([]), "no trial ran");
}

async fn a_command_sweep_needs_the_operators_consent(app: &TestApp) {
    let body = spec(
        json!({"x": {"values": [1, 2]}}),
        json!({"command": "sleep 1"}),
    );
    let response = app
        .post_json("/api/v1/sweeps", &json!({ "spec": body }))
        .await;
    assert_error(
        response,
        StatusCode::FORBIDDEN,
        "forbidden",
        Some("base.command"),
    )
    .await;
}

/// A command sweep whose trials sleep (they never report): two run at once, four in all.
async fn sleeping_sweep(app: &TestApp) -> String {
    let body = json!({
        "name": "sleepers", "experiment": "sweeps",
        // The trial's `--x=...` lands in `$1`, which `sleep` never sees.
        "base": {"command": ["sh", "-c", "sleep 30", "trial"]},
        "metric": {"name": "loss"}, "method": "grid", "parallel": 2,
        "parameters": {"x": {"values": [1, 2, 3, 4]}}
    });
    let response = app
        .post_json("/api/v1/sweeps", &json!({ "spec": body }))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let sweep: Value = response.json().await.unwrap();
    assert_eq!(sweep["max_trials"], 4, "a grid's budget is its size");
    sweep["id"].as_str().unwrap().to_string()
}

async fn wait_until(app: &TestApp, id: &str, what: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..300 {
        let sweep = app.get_json(&format!("/api/v1/sweeps/{id}")).await;
        if what(&sweep) {
            return sweep;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "sweep {id} did not get there: {:#}",
        app.get_json(&format!("/api/v1/sweeps/{id}")).await
    );
}

async fn post(app: &TestApp, path: &str) -> reqwest::Response {
    app.post_json(path, &json!({})).await
}

async fn pause_resume_stop_and_changes_follow_the_state_of_the_sweep(app: &TestApp) {
    let id = sleeping_sweep(app).await;
    let base = format!("/api/v1/sweeps/{id}");
    let running = wait_until(app, &id, |s| s["counts"]["running"] == 2).await;
    assert_eq!(
        running["trials"].as_array().unwrap().len(),
        2,
        "parallel: 2"
    );

    assert_error(
        post(app, &format!("{base}/resume")).await,
        StatusCode::CONFLICT,
        "conflict",
        Some("state"),
    )
    .await;
    let paused = post(app, &format!("{base}/pause")).await;
    assert_eq!(paused.status(), StatusCode::OK);
    let paused: Value = paused.json().await.unwrap();
    assert_eq!(paused["state"], "paused");
    assert_error(
        post(app, &format!("{base}/pause")).await,
        StatusCode::CONFLICT,
        "conflict",
        Some("state"),
    )
    .await;

    // Changes: against a stale version, below what was made, of a parameter it does not have.
    let stale = app
        .patch_json(&base, &json!({"version": 7, "parallel": 3}))
        .await;
    assert_error(stale, StatusCode::CONFLICT, "conflict", Some("version")).await;
    let low = app.patch_json(&base, &json!({"max_trials": 1})).await;
    assert_error(
        low,
        StatusCode::BAD_REQUEST,
        "bad_request",
        Some("max_trials"),
    )
    .await;
    let unknown = app
        .patch_json(&base, &json!({"parameters": {"y": {"values": [1]}}}))
        .await;
    assert_error(
        unknown,
        StatusCode::BAD_REQUEST,
        "bad_request",
        Some("parameters.y"),
    )
    .await;
    let changed = app
        .patch_json(&base, &json!({"version": 1, "parallel": 3}))
        .await;
    assert_eq!(changed.status(), StatusCode::OK);
    let changed: Value = changed.json().await.unwrap();
    assert_eq!(changed["version"], 2);
    assert_eq!(changed["parallel"], 3);
    assert_eq!(
        changed["versions"][1]["changes"],
        json!(["parallel: 2 → 3"])
    );

    // Paused, it launched nothing; resumed, the third slot fills.
    assert_eq!(changed["trials"].as_array().unwrap().len(), 2);
    assert_eq!(
        post(app, &format!("{base}/resume")).await.status(),
        StatusCode::OK
    );
    wait_until(app, &id, |s| s["counts"]["running"] == 3).await;

    let stopped = post(app, &format!("{base}/stop")).await;
    assert_eq!(stopped.status(), StatusCode::OK);
    let stopped: Value = stopped.json().await.unwrap();
    assert_eq!(stopped["state"], "stopped");
    assert!(
        stopped["message"]
            .as_str()
            .unwrap()
            .starts_with("stopped by"),
        "{stopped}"
    );
    for t in stopped["trials"].as_array().unwrap() {
        assert_eq!(t["state"], "stopped", "{t}");
        let run_id = t["run_id"].as_str().unwrap();
        // Its run is stopped too, not left running.
        let mut status = Value::Null;
        for _ in 0..100 {
            status = app.get_json(&format!("/api/v1/runs/{run_id}")).await["status"].clone();
            if status == "stopped" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(status, "stopped");
    }
    assert_error(
        post(app, &format!("{base}/stop")).await,
        StatusCode::CONFLICT,
        "conflict",
        Some("state"),
    )
    .await;
    let late = app.patch_json(&base, &json!({"max_trials": 9})).await;
    assert_error(late, StatusCode::CONFLICT, "conflict", Some("state")).await;
    // The audit log has the trials' launches by the local user (the sweep's creator here) and
    // each control with its sweep.
    let audit = app.get_json("/api/v1/audit?limit=100").await;
    let entries = audit["entries"].as_array().expect("entries");
    let launches = entries
        .iter()
        .filter(|e| e["action"] == "run_launch")
        .count();
    assert_eq!(launches, 3, "{audit:#}");
    assert!(
        entries
            .iter()
            .filter(|e| e["action"] == "run_launch")
            .all(|e| e["actor"] == "local"),
        "{audit:#}"
    );
    for action in [
        "sweep_submit",
        "sweep_pause",
        "sweep_change",
        "sweep_resume",
        "sweep_stop",
    ] {
        assert!(
            entries
                .iter()
                .any(|e| e["action"] == action && e["target"] == id.as_str()),
            "{action}: {audit:#}"
        );
    }
    let missing = app.get(&format!("/api/v1/sweeps/{}", "0".repeat(32))).await;
    assert_error(missing, StatusCode::NOT_FOUND, "not_found", None).await;
}

async fn the_event_stream_sends_the_sweep_at_once_and_after_each_change_until_it_ends(
    app: &TestApp,
) {
    let id = sleeping_sweep(app).await;
    let response = app.get(&format!("/api/v1/sweeps/{id}/events")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut events = SseClient::from_response(response);
    let first = events.next_event().await;
    assert_eq!(first.event, "sweep");
    assert_eq!(first.data["id"], id.as_str());
    assert_eq!(first.data["state"], "running");
    assert_eq!(
        post(app, &format!("/api/v1/sweeps/{id}/stop"))
            .await
            .status(),
        StatusCode::OK
    );
    loop {
        let event = events.next_event().await;
        assert_eq!(event.event, "sweep");
        if event.data["state"] == "stopped" {
            break;
        }
    }
}
