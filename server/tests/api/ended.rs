//! A run this server did not launch is not stopped (there is no process here to signal): it is
//! marked `stopped` or `failed` with a reason (`POST /api/v1/runs/{id}/end`), and then deleted.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{assert_error, TestApp};
use crate::on_both_backends;

on_both_backends!(
    a_run_not_launched_here_is_marked_ended_with_a_reason_then_deleted,
    marking_a_run_ended_refuses_other_statuses_a_missing_reason_and_an_ended_run,
);

async fn running_run(app: &TestApp, name: &str) -> String {
    let id = app.create_run(name).await;
    let r = app
        .patch_json(&format!("/api/v1/runs/{id}"), &json!({"status": "running"}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    id
}

async fn a_run_not_launched_here_is_marked_ended_with_a_reason_then_deleted(app: &TestApp) {
    let id = running_run(app, "elsewhere").await;
    // Stop says why it cannot work and what to do instead.
    let stop = app
        .post_json(&format!("/api/v1/runs/{id}/stop"), &json!({}))
        .await;
    let error = assert_error(stop, StatusCode::CONFLICT, "conflict", None).await;
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("not launched by this server") && message.contains("/end"),
        "{message}"
    );
    // Not deleted while it runs.
    let delete = app
        .send_raw(reqwest::Method::DELETE, &format!("/api/v1/runs/{id}"), "")
        .await;
    assert_eq!(delete.status(), StatusCode::CONFLICT);

    let ended = app
        .post_json(
            &format!("/api/v1/runs/{id}/end"),
            &json!({"status": "stopped", "reason": "  the job was cancelled  "}),
        )
        .await;
    assert_eq!(ended.status(), StatusCode::OK);
    let run: serde_json::Value = ended.json().await.expect("json");
    assert_eq!(run["status"], "stopped");
    let events = app.get_json(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(events["status"], "stopped");

    let delete = app
        .send_raw(reqwest::Method::DELETE, &format!("/api/v1/runs/{id}"), "")
        .await;
    assert_eq!(delete.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        app.get(&format!("/api/v1/runs/{id}")).await.status(),
        StatusCode::NOT_FOUND
    );
}

async fn marking_a_run_ended_refuses_other_statuses_a_missing_reason_and_an_ended_run(
    app: &TestApp,
) {
    let id = running_run(app, "refusals").await;
    let path = format!("/api/v1/runs/{id}/end");
    let r = app
        .post_json(&path, &json!({"status": "finished", "reason": "done"}))
        .await;
    assert_error(
        r,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unprocessable",
        Some("status"),
    )
    .await;
    let r = app
        .post_json(&path, &json!({"status": "failed", "reason": "   "}))
        .await;
    assert_error(
        r,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unprocessable",
        Some("reason"),
    )
    .await;
    assert_eq!(
        app.get_json(&format!("/api/v1/runs/{id}")).await["status"],
        "running",
        "a refused mark changes nothing"
    );
    let r = app
        .post_json(
            &path,
            &json!({"status": "failed", "reason": "OOM on the node"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = app
        .post_json(&path, &json!({"status": "stopped", "reason": "again"}))
        .await;
    let error = assert_error(r, StatusCode::CONFLICT, "conflict", Some("status")).await;
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("already ended"),
        "{error}"
    );
}
