//! Surviving the server: a real `trainyard serve` process is SIGKILLed while runs are queued and
//! running, then started again on the same data directory and port.

use std::time::Duration;

use serde_json::json;

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_survives_a_server_sigkill_is_readopted_finishes_and_misses_no_metric_step() {
    let data = tempfile::tempdir().unwrap();
    let mut server = spawn_serve(data.path(), 0).await;
    let port = server.port;
    // Posts 30 steps, retrying each until the server takes it (as the trainer's spool does).
    let cmd = r#"for step in $(seq 0 29); do
  until curl -sf -X POST "$TRAINYARD_SERVER_URL/api/v1/runs/$TRAINYARD_RUN_ID/metrics" \
      -H 'content-type: application/json' \
      -d "{\"points\": [{\"key\": \"train/loss\", \"step\": $step, \"value\": 1.0}]}" >/dev/null; do
    sleep 0.1
  done
  sleep 0.1
done"#;
    let id = server.launch(json!({"launch": true, "command": cmd})).await;
    server
        .wait_for(&id, Duration::from_secs(30), |r| {
            r["latest_metrics"]["train/loss"]["step"]
                .as_i64()
                .unwrap_or(-1)
                >= 3
        })
        .await;
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    let record = launch_record(data.path(), &id);
    let pid = record["process"]["pid"].as_i64().unwrap() as i32;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        unsafe { libc::kill(pid, 0) },
        0,
        "the run must outlive the server"
    );

    let mut server = spawn_serve(data.path(), port).await;
    let run = server.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_eq!(
        run["exit"]["exit_code"], 0,
        "the exit marker tells an adopted run's code"
    );
    let series = server
        .get(&format!("/api/v1/runs/{id}/metrics?key=train/loss"))
        .await;
    assert_eq!(series["total"], 30, "{series:#}");
    let steps: Vec<i64> = series["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, (0..30).collect::<Vec<_>>());
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_server_restart_queued_runs_stay_queued_and_vanished_processes_are_failed_as_lost()
{
    let data = tempfile::tempdir().unwrap();
    let mut server = spawn_serve(data.path(), 0).await;
    let port = server.port;
    let hog = server
        .launch(json!({"launch": true, "command": "exec sleep 60", "resources": {"gpus": 1}}))
        .await;
    let waiting = server
        .launch(json!({"launch": true, "command": "echo ran", "resources": {"gpus": 1}}))
        .await;
    server
        .wait_for(&hog, Duration::from_secs(30), |r| r["status"] == "running")
        .await;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    // The whole process group dies while nobody watches: no exit marker is left.
    let pgid = launch_record(data.path(), &hog)["process"]["pid"]
        .as_i64()
        .unwrap() as i32;
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut server = spawn_serve(data.path(), port).await;
    let lost = server.wait_terminal(&hog).await;
    assert_eq!(lost["status"], "failed");
    assert!(
        lost["exit"]["message"].as_str().unwrap().contains("lost"),
        "{lost:#}"
    );
    let done = server.wait_terminal(&waiting).await;
    assert_eq!(
        done["status"], "finished",
        "the queued run waited and then ran: {done:#}"
    );
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_ends_log_followers_and_leaves_the_run_going() {
    use trainyard::app::{Application, Settings};
    let data = tempfile::tempdir().unwrap();
    let mut settings = Settings::new("127.0.0.1:0".parse().unwrap(), data.path());
    settings.launcher.gpus = Some(vec![]);
    settings.allow_command_launch = true;
    let app = Application::build(settings).await.unwrap();
    let address = format!("http://127.0.0.1:{}", app.port());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async {
        let _ = stopped.await;
    }));
    let api = Api::new(&address);
    let id = api
        .launch(json!({"launch": true, "command": "echo up; exec sleep 60"}))
        .await;
    api.wait_for(&id, Duration::from_secs(30), |r| r["status"] == "running")
        .await;
    let follow = api
        .client
        .get(api.url(&format!("/api/v1/runs/{id}/logs?follow=true")))
        .send()
        .await
        .unwrap();
    assert_eq!(follow.status(), reqwest::StatusCode::OK);
    stop.send(()).unwrap();
    let body = tokio::time::timeout(Duration::from_secs(20), follow.text())
        .await
        .expect("the follow stream ends on shutdown");
    assert!(body.unwrap_or_default().contains("up"));
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("the server shuts down while a follower was attached")
        .unwrap()
        .unwrap();
    let pgid = launch_record(data.path(), &id)["process"]["pid"]
        .as_i64()
        .unwrap() as i32;
    assert_eq!(
        unsafe { libc::kill(-pgid, 0) },
        0,
        "the run outlives the server"
    );
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}
