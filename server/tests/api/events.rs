//! Server-sent events: live points in order, resume without loss or duplicates, status changes.

use serde_json::json;

use crate::helpers::TestApp;
use crate::on_both_backends;

on_both_backends!(
    a_subscriber_receives_points_posted_afterwards_in_order,
    reconnecting_with_last_event_id_misses_nothing_and_repeats_nothing,
    after_step_replays_only_later_steps,
    status_changes_reach_the_run_stream_and_the_all_runs_stream,
);

async fn a_subscriber_receives_points_posted_afterwards_in_order(app: &TestApp) {
    let run = app.create_run("sse").await;
    let mut stream = app.sse(&format!("/api/v1/runs/{run}/events"), None).await;
    for batch in 0..5 {
        let points: Vec<(&str, i64, f64)> =
            (0..20).map(|i| ("loss", batch * 20 + i, 1.0)).collect();
        app.post_points(&run, &points).await;
    }
    let (steps, _) = stream.collect_points(100).await;
    assert_eq!(steps, (0..100).collect::<Vec<i64>>());
}

async fn reconnecting_with_last_event_id_misses_nothing_and_repeats_nothing(app: &TestApp) {
    let run = app.create_run("sse").await;
    let path = format!("/api/v1/runs/{run}/events");
    let first: Vec<(&str, i64, f64)> = (0..10).map(|s| ("loss", s, 1.0)).collect();
    app.post_points(&run, &first).await;

    let mut stream = app.sse(&path, None).await;
    let (steps, last_id) = stream.collect_points(10).await;
    assert_eq!(
        steps,
        (0..10).collect::<Vec<i64>>(),
        "replay of what was stored before"
    );
    drop(stream);

    // Written while the client is away.
    let gap: Vec<(&str, i64, f64)> = (10..25).map(|s| ("loss", s, 1.0)).collect();
    app.post_points(&run, &gap).await;

    let mut resumed = app.sse(&path, last_id.as_deref()).await;
    let after: Vec<(&str, i64, f64)> = (25..30).map(|s| ("loss", s, 1.0)).collect();
    app.post_points(&run, &after).await;
    let (steps, _) = resumed.collect_points(20).await;
    assert_eq!(steps, (10..30).collect::<Vec<i64>>());
}

async fn after_step_replays_only_later_steps(app: &TestApp) {
    let run = app.create_run("sse").await;
    let points: Vec<(&str, i64, f64)> = (0..10).map(|s| ("loss", s, 1.0)).collect();
    app.post_points(&run, &points).await;
    let mut stream = app
        .sse(&format!("/api/v1/runs/{run}/events?after_step=6"), None)
        .await;
    app.post_points(&run, &[("loss", 10, 1.0)]).await;
    let (steps, _) = stream.collect_points(4).await;
    assert_eq!(steps, vec![7, 8, 9, 10]);
}

async fn status_changes_reach_the_run_stream_and_the_all_runs_stream(app: &TestApp) {
    let run = app.create_run("sse").await;
    let mut run_stream = app.sse(&format!("/api/v1/runs/{run}/events"), None).await;
    let mut all = app.sse("/api/v1/events", None).await;
    let response = app
        .patch_json(
            &format!("/api/v1/runs/{run}"),
            &json!({ "status": "running", "reason": "started by test" }),
        )
        .await;
    assert!(response.status().is_success());

    let event = loop {
        let event = run_stream.next_event().await;
        if event.event == "status" && event.data["to_status"] == "running" {
            break event;
        }
    };
    assert_eq!(event.data["run_id"], run.as_str());
    assert_eq!(event.data["reason"], "started by test");

    let global = all.next_event().await;
    assert_eq!(global.event, "status");
    assert_eq!(global.data["run_id"], run.as_str());
    assert_eq!(global.data["to_status"], "running");
}
