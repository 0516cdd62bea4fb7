//! A launched run that reports its own end keeps that end, and how its process exited is still
//! recorded with it (the supervisor's own `failed` would be refused: a terminal status is final).

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use trainyard::app::Settings;

use crate::helpers::TestApp;
use crate::on_both_backends_with;

on_both_backends_with!(
    commands_with_tokens;
    a_run_that_reports_failed_itself_keeps_its_reason_and_its_exit_code,
);

/// Command launches on, and an admin token, so the run gets a token of its own to report with.
fn commands_with_tokens(settings: &mut Settings) {
    settings.allow_command_launch = true;
    settings.admin_token = Some("exit-code-admin".into());
}

async fn a_run_that_reports_failed_itself_keeps_its_reason_and_its_exit_code(app: &TestApp) {
    // As a trainer does, it reports once the launcher has recorded it running (a report that
    // came first would be followed by the launcher's own `running`): the test says when, with a
    // file in the run's directory.
    let command = r#"for _ in $(seq 1 600); do [ -e go ] && break; sleep 0.1; done
curl -sf -X PATCH "$TRAINYARD_SERVER_URL/api/v1/runs/$TRAINYARD_RUN_ID" \
  -H "Authorization: Bearer $TRAINYARD_TOKEN" -H 'content-type: application/json' \
  -d '{"status": "failed", "reason": "loss diverged"}' || exit 9
exit 3"#;
    let response = app
        .post_json(
            "/api/v1/runs",
            &json!({"launch": true, "experiment": "exits", "command": command}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.expect("run");
    let path = format!("/api/v1/runs/{}", created["id"].as_str().expect("id"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.get_json(&path).await["status"] != "running" {
        assert!(Instant::now() < deadline, "the run never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let id = created["id"].as_str().expect("id");
    let run_dir = app.state.launcher.data_dir().join("runs").join(id);
    std::fs::write(run_dir.join("go"), "").expect("the go file");
    // The run reports `failed` before its process exits; the exit is recorded after.
    let run = loop {
        let run = app.get_json(&path).await;
        if !run["exit"].is_null() {
            break run;
        }
        assert!(
            Instant::now() < deadline,
            "the process's exit was never recorded: {run:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(run["status"], "failed", "{run:#}");
    assert_eq!(run["exit"]["exit_code"], 3, "{run:#}");
    let events = app.state.store.run_events(id, None).await.expect("events");
    let last = events.last().expect("a status event");
    assert_eq!(last.to_status.as_str(), "failed");
    assert_eq!(last.reason.as_deref(), Some("loss diverged"), "{events:?}");
}
