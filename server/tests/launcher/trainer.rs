//! The launcher with the real trainer (`trainyard train`, tiny profile on CPU): restarts resume
//! from the latest checkpoint, stop checkpoints, and a server SIGKILL loses no metric step.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;

/// A tiny CPU run of `steps` steps that checkpoints every `save` steps and reports quickly.
fn tiny(steps: u64, save: u64, max_restarts: u32) -> Value {
    json!({
        "launch": true,
        "profile": "tiny",
        "overrides": {
            "training.max_steps": steps,
            "training.save_steps": save,
            "training.eval_steps": 0,
            "training.batch_size": 2,
            "training.seq_len": 16,
            "training.warmup_steps": 2,
            "training.device": "cpu",
            "training.threads": 1,
            "logging.flush_interval_ms": 100,
        },
        "max_restarts": max_restarts,
    })
}

fn loss_step(run: &Value) -> i64 {
    run["latest_metrics"]["train/loss"]["step"]
        .as_i64()
        .unwrap_or(-1)
}

/// Steps of `train/loss`, asserted to be exactly `first..first + count` without a gap.
async fn assert_continuous(api: &Api, id: &str, count: i64) {
    let series = api
        .get(&format!(
            "/api/v1/runs/{id}/metrics?key=train/loss&max_points=100000"
        ))
        .await;
    let steps: Vec<i64> = series["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps.len() as i64, count, "steps: {steps:?}");
    let first = steps[0];
    assert_eq!(
        steps,
        (first..first + count).collect::<Vec<_>>(),
        "a step is missing"
    );
}

/// The trainer process under the run's wrapper.
async fn trainer_pid(data: &std::path::Path, id: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let wrapper = launch_record(data, id)["process"]["pid"].as_i64().unwrap();
        if let Some(&c) = children(wrapper).first() {
            return c;
        }
        assert!(Instant::now() < deadline, "no trainer process");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_killed_with_sigkill_is_relaunched_with_resume_and_its_metrics_are_continuous() {
    let app = spawn_confined_app(&[], 1).await;
    let id = app.launch(tiny(300, 10, 1)).await;
    app.wait_for(&id, Duration::from_secs(300), |r| loss_step(r) >= 25)
        .await;
    let pid = trainer_pid(app.data_dir.path(), &id).await;
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_eq!(run["tags"]["trainyard.attempts"], "2");
    let log = std::fs::read_to_string(
        app.data_dir
            .path()
            .join("runs")
            .join(&id)
            .join("output.log"),
    )
    .unwrap();
    assert!(log.contains("=== trainyard: attempt 2 ==="), "{log}");
    // The trainer reports `finished` itself; a last batch its reporter could not deliver (a
    // loaded machine) arrives from the launcher's backfill of metrics.jsonl once the process
    // has exited.
    app.wait_for(&id, Duration::from_secs(120), |r| loss_step(r) >= 300)
        .await;
    assert_continuous(&app, &id, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_training_run_leaves_a_checkpoint_that_a_resumed_trainer_continues_from() {
    let app = spawn_confined_app(&[], 1).await;
    let id = app.launch(tiny(100_000, 0, 0)).await;
    app.wait_for(&id, Duration::from_secs(300), |r| loss_step(r) >= 10)
        .await;
    let status = app.stop(&id).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED);
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "stopped", "{run:#}");
    let dir = app.data_dir.path().join("runs").join(&id);
    let checkpoints: Vec<_> = std::fs::read_dir(dir.join("checkpoints"))
        .expect("checkpoints dir")
        .collect();
    assert!(!checkpoints.is_empty(), "stop must leave a checkpoint");
    let stopped_at = loss_step(&run);
    // Resume by hand, offline, for a few more steps.
    let out = std::process::Command::new(TRAINYARD)
        .args(["train", "--resume", "latest", "--out"])
        .arg(&dir)
        .args(["--set", &format!("training.max_steps={}", stopped_at + 5)])
        .env_remove("TRAINYARD_SERVER_URL")
        .env_remove("TRAINYARD_RUN_ID")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "resume failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let last: Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert!(
        last["step"].as_i64().unwrap() > stopped_at,
        "resumed run went on past step {stopped_at}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_training_run_survives_a_server_sigkill_and_no_metric_step_is_missing() {
    let data = tempfile::tempdir().unwrap();
    let mut server = spawn_serve(data.path(), 0).await;
    let port = server.port;
    let id = server.launch(tiny(4000, 1000, 0)).await;
    server
        .wait_for(&id, Duration::from_secs(300), |r| loss_step(r) >= 20)
        .await;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    // The trainer keeps training and spools while nobody listens.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let wrapper = launch_record(data.path(), &id)["process"]["pid"]
        .as_i64()
        .unwrap() as i32;
    assert_eq!(
        unsafe { libc::kill(wrapper, 0) },
        0,
        "the run must still be going for this test to mean anything"
    );
    let mut server = spawn_serve(data.path(), port).await;
    let run = server.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_continuous(&server, &id, 4000).await;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_run_resumed_through_the_api_goes_on_as_the_same_run_on_sqlite() {
    a_stopped_run_resumed_through_the_api_goes_on_as_the_same_run(
        &spawn_confined_app(&[], 1).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_run_resumed_through_the_api_goes_on_as_the_same_run_on_postgres() {
    let db = crate::kit::ScratchDb::create("trainyard_resume").await;
    let url = db.url.clone();
    let app = spawn_app_with(&[], 1, |s| {
        s.database_url = Some(url);
        s.launcher.unconfined_runs = false;
    })
    .await;
    a_stopped_run_resumed_through_the_api_goes_on_as_the_same_run(&app).await;
    drop(db);
}

/// Stop, list checkpoints, a refused resume, a resume from the latest, sampling: one scenario
/// on the same series of the same run.
async fn a_stopped_run_resumed_through_the_api_goes_on_as_the_same_run(app: &TestApp) {
    let id = app.launch(tiny(1000, 0, 0)).await;
    app.wait_for(&id, Duration::from_secs(300), |r| loss_step(r) >= 10)
        .await;
    let path = format!("/api/v1/runs/{id}/stop");
    app.post(&path, &json!({})).await;
    let stopped = app.wait_terminal(&id).await;
    assert_eq!(stopped["status"], "stopped", "{stopped:#}");
    let stopped_at = loss_step(&stopped);
    let listed = app.get(&format!("/api/v1/runs/{id}/checkpoints")).await;
    let latest = listed["checkpoints"]
        .as_array()
        .and_then(|c| c.last())
        .and_then(|c| c["step"].as_i64())
        .expect("stop leaves a checkpoint");
    // A step it does not have is refused, naming the steps it has.
    let (status, reply) = app
        .post(
            &format!("/api/v1/runs/{id}/resume"),
            &json!({"from": 999_999}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert_eq!(reply["error"]["field"], "from");
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&latest.to_string()));
    let (status, reply) = app
        .post(
            &format!("/api/v1/runs/{id}/resume"),
            &json!({"from": "latest"}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{reply}");
    assert_eq!(reply["id"], id.as_str(), "the same run goes on");
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_eq!(run["tags"]["trainyard.attempts"], "2");
    assert!(loss_step(&run) > stopped_at);
    // One series from the first step to the last, without a gap at the resume.
    assert_continuous(app, &id, 1000).await;
    // Any listed checkpoint samples text, saying which one it used.
    let name = format!("step-{latest:06}");
    let (status, sample) = app
        .post(
            &format!("/api/v1/runs/{id}/checkpoints/{name}/sample"),
            &json!({"prompt": "The", "max_new_tokens": 8, "temperature": 0}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{sample}");
    assert_eq!(sample["checkpoint"], name.as_str());
    assert_eq!(sample["step"], latest);
    assert!(!sample["text"].as_str().unwrap_or_default().is_empty());
    let (status, refused) = app
        .post(
            &format!("/api/v1/runs/{id}/checkpoints/{name}/sample"),
            &json!({"max_new_tokens": 100000}),
        )
        .await;
    assert_eq!(
        status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{refused}"
    );
    assert_eq!(refused["error"]["field"], "max_new_tokens");
    // The attempt is recorded.
    let page = app
        .client
        .get(format!("{}/runs/{id}", app.address))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(&format!("resumed from checkpoint step-{latest:06}")),
        "the history shows the resume"
    );
}
