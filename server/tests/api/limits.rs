//! Hardening: command launches need the operator's consent, every stored text field has a
//! limit, launch configs are bounded before they are parsed, log followers leave nothing
//! behind, a launch that cannot prepare its directory fails visibly, and run statuses follow
//! the lifecycle.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use trainyard::app::Settings;

use crate::helpers::{assert_error, TestApp};
use crate::{on_both_backends, on_both_backends_with};

on_both_backends!(
    a_command_launch_is_forbidden_unless_the_server_allows_it,
    following_the_logs_of_unknown_runs_leaves_no_channel_behind,
    a_followed_then_closed_log_stream_removes_its_channel,
    over_deep_or_over_large_launch_configs_are_refused_naming_config_and_the_limit,
    the_server_answers_healthz_while_deeply_nested_configs_are_in_flight,
    fields_over_their_limit_are_refused_naming_the_field_and_the_limit,
    a_field_at_its_limit_is_accepted,
    the_runs_list_shows_the_start_of_long_notes_and_the_run_shows_them_whole,
    status_changes_follow_the_run_lifecycle,
    a_refused_status_change_writes_nothing_else_of_the_patch,
);

on_both_backends_with!(allow_commands; an_allowed_command_launch_is_accepted);

on_both_backends_with!(
    runs_dir_is_a_file;
    a_launch_whose_run_directory_cannot_be_created_fails_with_the_reason,
);

fn allow_commands(settings: &mut Settings) {
    settings.allow_command_launch = true;
}

/// `<data dir>/runs` is a file, so no run directory can be created under it.
fn runs_dir_is_a_file(settings: &mut Settings) {
    std::fs::write(settings.data_dir.join("runs"), b"not a directory").expect("write file");
}

async fn run_count(app: &TestApp) -> usize {
    app.get_json("/api/v1/runs").await["runs"]
        .as_array()
        .expect("runs")
        .len()
}

async fn a_command_launch_is_forbidden_unless_the_server_allows_it(app: &TestApp) {
    for command in [json!("echo hi"), json!(["echo", "hi"])] {
        let body = json!({ "launch": true, "command": command });
        let response = app.post_json("/api/v1/runs", &body).await;
        let error = assert_error(
            response,
            StatusCode::FORBIDDEN,
            "forbidden",
            Some("command"),
        )
        .await;
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains("--allow-command-launch"), "{message}");
    }
    assert_eq!(run_count(app).await, 0, "no run may be created");
}

async fn an_allowed_command_launch_is_accepted(app: &TestApp) {
    let body = json!({ "launch": true, "command": "true" });
    let response = app.post_json("/api/v1/runs", &body).await;
    assert_eq!(response.status(), StatusCode::CREATED);
}

async fn following_the_logs_of_unknown_runs_leaves_no_channel_behind(app: &TestApp) {
    for _ in 0..200 {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let response = app
            .get(&format!("/api/v1/runs/{id}/logs?follow=true"))
            .await;
        assert_error(response, StatusCode::NOT_FOUND, "not_found", None).await;
    }
    assert_eq!(app.state.launcher.logs().channel_count(), 0);
    assert_eq!(app.state.live.active_runs(), 0);
}

/// Polls `condition` every 50 ms until it holds; panics with `what` after 30 s.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_followed_then_closed_log_stream_removes_its_channel(app: &TestApp) {
    let id = app.create_run("follow").await;
    let logs = app.state.launcher.logs();
    let stream = app
        .sse(&format!("/api/v1/runs/{id}/logs?follow=true"), None)
        .await;
    assert_eq!(logs.channel_count(), 1, "a follower has a channel");
    drop(stream);
    eventually("the closed stream's channel is removed", || {
        logs.channel_count() == 0
    })
    .await;
}

async fn over_deep_or_over_large_launch_configs_are_refused_naming_config_and_the_limit(
    app: &TestApp,
) {
    let flow = format!("a: {}1{}", "[".repeat(5000), "]".repeat(5000));
    let block: String = (0..200)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect();
    let sequences = format!("{}x\n", "- ".repeat(100));
    let mut json_deep = json!(1);
    for _ in 0..60 {
        json_deep = json!({ "k": json_deep });
    }
    let large = format!("notes: \"{}\"\n", "x".repeat(300 * 1024));
    let cases = [
        (json!(flow), "32"),
        (json!(block), "32"),
        (json!(sequences), "32"),
        (json_deep, "32"),
        (json!(large), "262144"),
    ];
    for (config, limit) in cases {
        let body = json!({ "launch": true, "config": config });
        let response = app.post_json("/api/v1/runs", &body).await;
        let error = assert_error(
            response,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            Some("config"),
        )
        .await;
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(limit), "{message}");
    }
    let deep_override = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    let body = json!({
        "launch": true,
        "profile": "tiny",
        "overrides": { "training.max_steps": deep_override },
    });
    let response = app.post_json("/api/v1/runs", &body).await;
    assert_error(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unprocessable",
        Some("overrides.training.max_steps"),
    )
    .await;
    assert_eq!(run_count(app).await, 0, "no run may be created");
}

async fn the_server_answers_healthz_while_deeply_nested_configs_are_in_flight(app: &TestApp) {
    // About the size of the documents that froze the server: 140 KB of nesting each.
    let deep = format!("a: {}1{}", "[".repeat(70_000), "]".repeat(70_000));
    let body = json!({ "launch": true, "config": deep });
    let posts = (0..4).map(|_| app.post_json("/api/v1/runs", &body));
    let (health, refused) = tokio::join!(app.get("/healthz"), futures::future::join_all(posts));
    assert_eq!(health.status(), StatusCode::OK);
    for response in refused {
        assert_error(
            response,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            Some("config"),
        )
        .await;
    }
}

async fn fields_over_their_limit_are_refused_naming_the_field_and_the_limit(app: &TestApp) {
    let id = app.create_run("limits").await;
    let run = format!("/api/v1/runs/{id}");
    let long = |n: usize| "x".repeat(n);
    let many_tags: serde_json::Map<String, Value> =
        (0..257).map(|i| (format!("t{i}"), json!("v"))).collect();
    let mut deep = json!(1);
    for _ in 0..40 {
        deep = json!({ "k": deep });
    }
    let posts = [
        (
            "/api/v1/experiments",
            json!({ "name": long(201) }),
            "name",
            "200",
        ),
        ("/api/v1/runs", json!({ "name": long(201) }), "name", "200"),
        (
            "/api/v1/runs",
            json!({ "experiment": long(201) }),
            "experiment",
            "200",
        ),
        (
            "/api/v1/runs",
            json!({ "tags": { "k": long(4097) } }),
            "tags.k",
            "4096",
        ),
        (
            "/api/v1/runs",
            json!({ "tags": { long(201): "v" } }),
            "tags",
            "200",
        ),
        ("/api/v1/runs", json!({ "tags": many_tags }), "tags", "256"),
        (
            "/api/v1/runs",
            json!({ "config": { "big": long(300 * 1024) } }),
            "config",
            "262144",
        ),
        ("/api/v1/runs", json!({ "config": deep }), "config", "32"),
        (
            "/api/v1/runs",
            json!({ "config": { "p": long(16 * 1024 + 1) } }),
            "config.p",
            "16384",
        ),
    ];
    for (path, body, field, limit) in posts {
        let response = app.post_json(path, &body).await;
        let error = assert_error(
            response,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            Some(field),
        )
        .await;
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(limit), "{path} {field}: {message}");
    }
    let patches = [
        (json!({ "notes": long(64 * 1024 + 1) }), "notes", "65536"),
        (json!({ "name": long(201) }), "name", "200"),
        (
            json!({ "status": "running", "reason": long(4097) }),
            "reason",
            "4096",
        ),
        (json!({ "tags": { "k": long(4097) } }), "tags.k", "4096"),
        (
            json!({ "config": { "big": long(300 * 1024) } }),
            "config",
            "262144",
        ),
    ];
    for (body, field, limit) in patches {
        let response = app.patch_json(&run, &body).await;
        let error = assert_error(
            response,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            Some(field),
        )
        .await;
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(limit), "PATCH {field}: {message}");
    }
    // A run holds at most 256 tags, however many requests add them.
    let half = |from: usize| -> serde_json::Map<String, Value> {
        (from..from + 200)
            .map(|i| (format!("t{i}"), json!("v")))
            .collect()
    };
    let first = app.patch_json(&run, &json!({ "tags": half(0) })).await;
    assert_eq!(first.status(), StatusCode::OK);
    let second = app.patch_json(&run, &json!({ "tags": half(200) })).await;
    assert_error(
        second,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unprocessable",
        Some("tags"),
    )
    .await;
    // Nothing refused was stored.
    let stored = app.get_json(&run).await;
    assert_eq!(stored["notes"], "");
    assert_eq!(stored["status"], "created");
    assert_eq!(stored["tags"].as_object().map(|t| t.len()), Some(200));
    assert_eq!(run_count(app).await, 1);
}

async fn a_field_at_its_limit_is_accepted(app: &TestApp) {
    let id = app.create_run("at-limit").await;
    let run = format!("/api/v1/runs/{id}");
    let notes = "n".repeat(64 * 1024);
    let body = json!({
        "name": "r".repeat(200),
        "notes": notes,
        "tags": { "k": "v".repeat(4096) },
        "status": "failed",
        "reason": "x".repeat(4096),
    });
    let response = app.patch_json(&run, &body).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(app.get_json(&run).await["notes"], notes);
}

async fn the_runs_list_shows_the_start_of_long_notes_and_the_run_shows_them_whole(app: &TestApp) {
    let notes = "é".repeat(20 * 1024); // 40 KiB of two-byte characters
    let created = app
        .create_run_with(json!({ "experiment": "list", "config": { "training": { "lr": 0.5 } } }))
        .await;
    let id = created["id"].as_str().expect("id");
    let path = format!("/api/v1/runs/{id}");
    let response = app.patch_json(&path, &json!({ "notes": notes })).await;
    assert_eq!(response.status(), StatusCode::OK);
    let short = app
        .create_run_with(json!({ "experiment": "list", "name": "short" }))
        .await;
    let short_id = short["id"].as_str().expect("id");
    app.patch_json(
        &format!("/api/v1/runs/{short_id}"),
        &json!({ "notes": "brief" }),
    )
    .await;

    let page = app.get_json("/api/v1/runs").await;
    let listed = |id: &str| -> Value {
        page["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .expect("listed")
    };
    let long_one = listed(id);
    let shown = long_one["notes"].as_str().expect("notes");
    assert!(shown.len() <= 1024 && !shown.is_empty(), "{}", shown.len());
    assert!(notes.starts_with(shown));
    assert_eq!(long_one["notes_truncated"], true);
    assert!(long_one.get("config").is_none(), "{long_one}");
    assert_eq!(long_one["params"]["training.lr"], "0.5");
    let short_one = listed(short_id);
    assert_eq!(short_one["notes"], "brief");
    assert_eq!(short_one["notes_truncated"], false);

    let whole = app.get_json(&path).await;
    assert_eq!(whole["notes"], notes);
    assert_eq!(whole["config"]["training"]["lr"], 0.5);
}

async fn patch_status(app: &TestApp, run: &str, status: &str) -> reqwest::Response {
    app.patch_json(run, &json!({ "status": status })).await
}

async fn status_changes_follow_the_run_lifecycle(app: &TestApp) {
    // (from a fresh run, the statuses to walk through, the one that must be refused)
    let cases: [(&[&str], &str); 6] = [
        (&["running", "finished"], "failed"),
        (&["running", "stopped"], "finished"),
        (&["failed"], "stopped"),
        (&["running"], "created"),
        (&[], "queued"),
        (&["running", "finished", "running", "finished"], "stopped"),
    ];
    for (walk, refused) in cases {
        let id = app.create_run("lifecycle").await;
        let run = format!("/api/v1/runs/{id}");
        for status in walk {
            let response = patch_status(app, &run, status).await;
            assert_eq!(response.status(), StatusCode::OK, "{walk:?} at {status}");
        }
        let from = walk.last().copied().unwrap_or("created");
        let response = patch_status(app, &run, refused).await;
        let error = assert_error(response, StatusCode::CONFLICT, "conflict", Some("status")).await;
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("`{from}`")) && message.contains(&format!("`{refused}`")),
            "{from} → {refused}: {message}"
        );
        assert_eq!(app.get_json(&run).await["status"], from);
        // Re-sending the current status is not a change, so it is always fine.
        let same = patch_status(app, &run, from).await;
        assert_eq!(same.status(), StatusCode::OK);
    }
}

async fn a_refused_status_change_writes_nothing_else_of_the_patch(app: &TestApp) {
    let id = app.create_run("lifecycle").await;
    let run = format!("/api/v1/runs/{id}");
    assert_eq!(
        patch_status(app, &run, "finished").await.status(),
        StatusCode::OK
    );
    let before = app.get_json(&run).await;
    let body = json!({ "status": "failed", "notes": "should not stick", "tags": { "a": "b" } });
    let response = app.patch_json(&run, &body).await;
    assert_error(response, StatusCode::CONFLICT, "conflict", Some("status")).await;
    let after = app.get_json(&run).await;
    assert_eq!(after["notes"], "");
    assert_eq!(after["tags"], before["tags"]);
    assert_eq!(after["status"], "finished");
    assert_eq!(after["ended_at"], before["ended_at"]);
    let events = app.state.store.run_events(&id, None).await.expect("events");
    assert!(
        events.iter().all(|e| e.to_status.as_str() != "failed"),
        "{events:?}"
    );
}

async fn a_launch_whose_run_directory_cannot_be_created_fails_with_the_reason(app: &TestApp) {
    let body = json!({ "launch": true, "profile": "tiny", "experiment": "broken-disk" });
    let response = app.post_json("/api/v1/runs", &body).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.expect("run JSON");
    assert_eq!(created["status"], "failed", "{created}");
    let id = created["id"].as_str().expect("id");
    let run = app.get_json(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(run["status"], "failed");
    let message = run["exit"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("run directory"), "{run}");
    let events = app.state.store.run_events(id, None).await.expect("events");
    let last = events.last().expect("a status event");
    assert_eq!(last.to_status.as_str(), "failed");
    let reason = last.reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("could not prepare the run directory"),
        "{reason}"
    );
    assert!(
        app.state.launcher.queued().is_empty(),
        "nothing waits in the queue"
    );
}
