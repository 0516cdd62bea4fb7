//! The Slurm executor against a real single-node Slurm cluster (`scripts/slurm-up.sh`, which
//! `scripts/test.sh` runs first): a tiny training run finishes through sbatch with its metrics
//! stored, a stop cancels the job after the trainer checkpointed, a failed job is resubmitted
//! and resumes from its checkpoint, a server SIGKILL leaves the job running and the next server
//! re-adopts it, and an unknown partition is refused up front.

use std::path::Path;
use std::time::Duration;

use crate::helpers::*;
use serde_json::{json, Value};

/// A tiny CPU run of `steps` steps on Slurm that checkpoints every `save` steps.
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
        "resources": {"executor": "slurm", "slurm": {"partition": "debug", "time": "15:00"}},
    })
}

async fn slurm_app() -> TestApp {
    spawn_app_with(&[], 1, |s| {
        s.launcher.executor = trainyard::launcher::slurm::Executor::Slurm;
        s.launcher.slurm.poll_interval = Duration::from_millis(300);
        // Jobs start their command through `trainyard confine`, as a server's do by default.
        s.launcher.unconfined_runs = false;
    })
    .await
}

/// Cancels a test's jobs when it ends, passed or panicked: a long job left behind would hold
/// the one-node cluster's CPUs and starve every later test.
struct CancelJobs(String);

impl Drop for CancelJobs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("scancel")
            .args(["--name", &format!("trainyard-{}", self.0)])
            .status();
    }
}

fn loss_step(run: &Value) -> i64 {
    run["latest_metrics"]["train/loss"]["step"]
        .as_i64()
        .unwrap_or(-1)
}

/// `scontrol show job`'s JobState of a job.
fn job_state(job: &str) -> String {
    let out = std::process::Command::new("scontrol")
        .args(["show", "job", "-o", job])
        .output()
        .expect("scontrol (is Slurm installed? scripts/slurm-up.sh)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix("JobState="))
        .unwrap_or("")
        .to_string()
}

fn jobs_of(data: &Path, id: &str) -> Vec<String> {
    launch_record(data, id)["slurm"]["jobs"]
        .as_array()
        .map(|a| a.iter().map(|j| j.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The pid of the run's trainer (started by the job's batch script on this, the only node).
fn trainer_pid(id: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        let is_trainer = args.iter().any(|a| a == "train")
            && args.windows(2).any(|w| w[0] == "--run-id" && w[1] == id);
        is_trainer.then_some(pid)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_training_run_on_slurm_finishes_with_its_metrics_and_its_job_shown() {
    let app = slurm_app().await;
    let id = app.launch(tiny(30, 0, 0)).await;
    let _cancel = CancelJobs(id.clone());
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_eq!(run["tags"]["trainyard.launcher"], "slurm");
    assert_eq!(run["tags"]["trainyard.slurm.partition"], "debug");
    // The trainer reports `finished` itself, before Slurm has seen its job end.
    let run = app
        .wait_for(&id, Duration::from_secs(60), |r| {
            r["tags"]["trainyard.slurm.state"] == "COMPLETED" && loss_step(r) >= 30
        })
        .await;
    let jobs = jobs_of(app.data_dir.path(), &id);
    assert_eq!(jobs.len(), 1, "one attempt, one job");
    assert_eq!(run["tags"]["trainyard.slurm.job_id"], jobs[0]);
    assert_eq!(job_state(&jobs[0]), "COMPLETED");
    let record = launch_record(app.data_dir.path(), &id);
    assert_eq!(record["executor"], "slurm");
    let series = app
        .get(&format!("/api/v1/runs/{id}/metrics?key=train/loss"))
        .await;
    assert_eq!(series["total"], 30, "{series:#}");
    // The job's output reaches the log API through the run's output.log.
    let log = app
        .client
        .get(format!("{}/api/v1/runs/{id}/logs", app.address))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(log.contains(&format!("Slurm job {}", jobs[0])), "{log}");
    // The run page shows where it ran.
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
        page.contains(&format!("Slurm job {}", jobs[0])),
        "the run page names the job"
    );
    let script = std::fs::read_to_string(
        app.data_dir
            .path()
            .join("runs")
            .join(&id)
            .join("slurm-job.sh"),
    )
    .unwrap();
    assert!(script.contains("#SBATCH --partition=debug"), "{script}");
    assert!(script.contains("#SBATCH --time=15:00"), "{script}");
    assert!(
        !script.contains("TRAINYARD_TOKEN="),
        "no secret in the script"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slurm_job_is_confined_on_its_node_as_a_local_run_is() {
    let app = slurm_app().await;
    let database = app.data_dir.path().join("trainyard.db");
    assert!(database.exists());
    let command = format!(
        r#"for f in '{}' /etc/hostname; do
  cat "$f" > /dev/null && echo "READ $f" || echo "DENIED $f"
done
echo mine > own.txt && echo "WROTE own directory""#,
        database.display()
    );
    let id = app
        .launch(json!({"launch": true, "command": command, "resources":
            {"executor": "slurm", "slurm": {"partition": "debug", "time": "15:00"}}}))
        .await;
    let _cancel = CancelJobs(id.clone());
    let run = app.wait_terminal(&id).await;
    let log = std::fs::read_to_string(
        app.data_dir
            .path()
            .join("runs")
            .join(&id)
            .join("output.log"),
    )
    .unwrap();
    assert_eq!(run["status"], "finished", "{run:#}\n{log}");
    for line in [
        format!("DENIED {}", database.display()),
        "DENIED /etc/hostname".to_string(),
        "WROTE own directory".to_string(),
    ] {
        assert!(log.lines().any(|l| l == line), "{line} missing:\n{log}");
    }
    assert!(log.contains("Permission denied"), "{log}");
    assert!(!log.contains("not confined"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_slurm_run_cancels_its_job_leaving_a_checkpoint_that_resume_continues_from() {
    let app = slurm_app().await;
    let id = app.launch(tiny(100_000, 0, 0)).await;
    let _cancel = CancelJobs(id.clone());
    app.wait_for(&id, Duration::from_secs(300), |r| loss_step(r) >= 5)
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
    // The trainer reports `stopped` before it exits; the job ends right after.
    let jobs = jobs_of(app.data_dir.path(), &id);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let state = job_state(&jobs[0]);
        let over = !matches!(state.as_str(), "RUNNING" | "PENDING" | "COMPLETING");
        if over && trainer_pid(&id).is_none() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job is still {state} or its trainer alive"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Resume goes on as a new job of the same run, from the checkpoint the stop left.
    let (status, reply) = app
        .post(
            &format!("/api/v1/runs/{id}/resume"),
            &json!({"from": "latest"}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{reply}");
    let stopped_at = loss_step(&run);
    app.wait_for(&id, Duration::from_secs(300), |r| {
        r["status"] == "running" && loss_step(r) > stopped_at
    })
    .await;
    let jobs = jobs_of(app.data_dir.path(), &id);
    let events = app.state.store.run_events(&id, None).await.unwrap();
    assert_eq!(
        jobs.len(),
        2,
        "a second job: {jobs:?} {:#} {events:#?}",
        launch_record(app.data_dir.path(), &id)
    );
    let script = std::fs::read_to_string(dir.join("slurm-job.sh")).unwrap();
    assert!(script.contains("'--resume'"), "{script}");
    let status = app.stop(&id).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED);
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "stopped", "{run:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_slurm_job_is_resubmitted_and_resumes_from_its_latest_checkpoint() {
    let app = slurm_app().await;
    let id = app.launch(tiny(300, 10, 1)).await;
    let _cancel = CancelJobs(id.clone());
    app.wait_for(&id, Duration::from_secs(300), |r| loss_step(r) >= 25)
        .await;
    let pid = trainer_pid(&id).expect("the trainer runs on this node");
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_eq!(run["tags"]["trainyard.attempts"], "2");
    let jobs = jobs_of(app.data_dir.path(), &id);
    assert_eq!(jobs.len(), 2, "the failed job was followed by a new one");
    assert_eq!(job_state(&jobs[0]), "FAILED");
    assert_eq!(run["tags"]["trainyard.slurm.job_id"], jobs[1]);
    let dir = app.data_dir.path().join("runs").join(&id);
    let script = std::fs::read_to_string(dir.join("slurm-job.sh")).unwrap();
    assert!(
        script.contains("'--resume'") && script.contains("checkpoints"),
        "the second job resumes from a checkpoint: {script}"
    );
    let events = app.state.store.run_events(&id, None).await.unwrap();
    assert!(
        events.iter().any(|e| e
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("restarting (attempt 2 of 2)"))),
        "{events:#?}"
    );
    let log = std::fs::read_to_string(dir.join("output.log")).unwrap();
    assert!(log.contains("=== trainyard: attempt 2 ==="), "{log}");
    // Every step is there once, the resumed ones included.
    app.wait_for(&id, Duration::from_secs(60), |r| loss_step(r) >= 300)
        .await;
    let series = app
        .get(&format!(
            "/api/v1/runs/{id}/metrics?key=train/loss&max_points=100000"
        ))
        .await;
    assert_eq!(series["total"], 300, "{series:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slurm_job_outlives_a_server_sigkill_and_the_next_server_readopts_it() {
    let data = tempfile::tempdir().unwrap();
    let env = [("TRAINYARD_EXECUTOR", "slurm")];
    let mut server = spawn_serve_with_env(data.path(), 0, &env).await;
    let port = server.port;
    let mut body = tiny(2000, 500, 0);
    body["resources"] = json!({});
    let id = server.launch(body).await;
    let _cancel = CancelJobs(id.clone());
    server
        .wait_for(&id, Duration::from_secs(300), |r| loss_step(r) >= 10)
        .await;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let jobs = jobs_of(data.path(), &id);
    assert_eq!(jobs.len(), 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        job_state(&jobs[0]),
        "RUNNING",
        "the job goes on without the server"
    );

    let mut server = spawn_serve_with_env(data.path(), port, &env).await;
    let run = server.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_eq!(run["tags"]["trainyard.launcher"], "slurm");
    assert_eq!(
        jobs_of(data.path(), &id),
        jobs,
        "re-adopted, not resubmitted"
    );
    // Only the executor following the job records Slurm's end of it and the exit status.
    let run = server
        .wait_for(&id, Duration::from_secs(60), |r| {
            r["tags"]["trainyard.slurm.state"] == "COMPLETED"
                && r["exit"]["exit_code"] == 0
                && loss_step(r) >= 2000
        })
        .await;
    assert_eq!(run["status"], "finished", "{run:#}");
    let series = server
        .get(&format!(
            "/api/v1/runs/{id}/metrics?key=train/loss&max_points=100000"
        ))
        .await;
    assert_eq!(series["total"], 2000, "no step is missing: {series:#}");
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

#[tokio::test]
async fn slurm_requests_that_cannot_work_are_refused_naming_the_field() {
    let app = slurm_app().await;
    let cases = [
        (
            json!({"executor": "slurm", "slurm": {"partition": "no-such-partition"}}),
            "resources.slurm.partition",
            "debug",
        ),
        (
            json!({"executor": "slurm", "slurm": {"time": "tomorrow"}}),
            "resources.slurm.time",
            "time limit",
        ),
        (
            json!({"executor": "slurm", "slurm": {"extra": ["--output=/tmp/x"]}}),
            "resources.slurm.extra[0]",
            "output",
        ),
        (
            json!({"executor": "slurm", "slurm": {"extra": ["-o/some/file"]}}),
            "resources.slurm.extra[0]",
            "-o",
        ),
        (
            json!({"executor": "slurm", "slurm": {"extra": ["--constraint=x", "--open-mode=truncate"]}}),
            "resources.slurm.extra[1]",
            "--open-mode",
        ),
        (
            json!({"executor": "slurm", "slurm": {"extra": ["--export-file=/tmp/env"]}}),
            "resources.slurm.extra[0]",
            "--export-file",
        ),
        (
            json!({"executor": "slurm", "slurm": {"extra": ["--get-user-env"]}}),
            "resources.slurm.extra[0]",
            "--get-user-env",
        ),
        (
            json!({"executor": "slurm", "slurm": {"extra": ["-D/tmp"]}}),
            "resources.slurm.extra[0]",
            "-D",
        ),
        (
            json!({"executor": "slurm", "slurm": {"extra": ["--input=/etc/passwd"]}}),
            "resources.slurm.extra[0]",
            "--input",
        ),
        (
            json!({"executor": "slurm", "slurm": {"gpu": 1}}),
            "resources",
            "unknown field",
        ),
        (
            json!({"executor": "local", "slurm": {"partition": "debug"}}),
            "resources.slurm",
            "executor",
        ),
    ];
    for (resources, field, words) in cases {
        let mut body = tiny(10, 0, 0);
        body["resources"] = resources.clone();
        let (status, reply) = app.post("/api/v1/runs", &body).await;
        assert_eq!(
            status,
            reqwest::StatusCode::UNPROCESSABLE_ENTITY,
            "{resources} → {reply}"
        );
        let got = reply["error"]["field"].as_str().unwrap_or("");
        assert!(got.starts_with(field), "{resources} → {reply}");
        let msg = reply["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(words), "{resources} → {msg}");
    }
    let runs = app.get("/api/v1/runs").await;
    assert_eq!(
        runs["runs"].as_array().map(Vec::len),
        Some(0),
        "nothing was created"
    );
    // A server nobody pointed at Slurm submits nothing to it.
    let local = spawn_app(&[], 1).await;
    let (status, reply) = local.post("/api/v1/runs", &tiny(10, 0, 0)).await;
    assert_eq!(status, reqwest::StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert_eq!(reply["error"]["field"], "resources.executor", "{reply}");
    let msg = reply["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("--executor slurm"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trials_of_a_sweep_on_a_slurm_server_run_as_slurm_jobs() {
    let app = slurm_app().await;
    // A confined trial reads its script from the data root.
    let dir = tempfile::tempdir_in(&app.state.launcher.roots().paths()[0]).unwrap();
    let body = r#"for step in 0 1 2; do
  curl -sf -X POST "$TRAINYARD_SERVER_URL/api/v1/runs/$TRAINYARD_RUN_ID/metrics" \
    -H 'content-type: application/json' \
    -d "{\"points\": [{\"key\": \"loss\", \"step\": $step, \"value\": 1.5}]}" >/dev/null
done"#;
    let trial = script(dir.path(), "trial.sh", body);
    let spec = json!({
        "name": "on-slurm",
        "experiment": "sweeps-on-slurm",
        "base": {"command": ["sh", trial.to_str().unwrap()]},
        "metric": {"name": "loss", "goal": "minimize"},
        "method": "random",
        "parameters": {"x": {"distribution": "uniform", "min": 0.0, "max": 1.0}},
        "max_trials": 2,
        "parallel": 2,
        "seed": 3
    });
    let (status, reply) = app.post("/api/v1/sweeps", &json!({ "spec": spec })).await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{reply:#}");
    let id = reply["id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let sweep = loop {
        let sweep = app.get(&format!("/api/v1/sweeps/{id}")).await;
        if sweep["state"] == "finished" {
            break sweep;
        }
        assert!(std::time::Instant::now() < deadline, "{sweep:#}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let trials = sweep["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2, "{sweep:#}");
    for t in trials {
        let run_id = t["run_id"].as_str().unwrap();
        let run = app.get(&format!("/api/v1/runs/{run_id}")).await;
        assert_eq!(run["status"], "finished", "{run:#}");
        assert_eq!(run["tags"]["trainyard.launcher"], "slurm", "{run:#}");
        let job = run["tags"]["trainyard.slurm.job_id"].as_str().unwrap();
        assert_eq!(jobs_of(app.data_dir.path(), run_id), vec![job.to_string()]);
        let script = std::fs::read_to_string(
            app.data_dir
                .path()
                .join("runs")
                .join(run_id)
                .join("slurm-job.sh"),
        )
        .unwrap();
        assert!(
            script.contains("--x="),
            "the trial's parameter is on its command: {script}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_job_still_waits_in_slurm_is_stopped_by_cancelling_the_job() {
    let app = slurm_app().await;
    let mut body = tiny(10, 0, 0);
    // Held back by Slurm for an hour: the job stays PENDING (reason BeginTime).
    body["resources"]["slurm"]["extra"] = json!(["--begin=now+3600"]);
    let id = app.launch(body).await;
    let _cancel = CancelJobs(id.clone());
    let run = app
        .wait_for(&id, Duration::from_secs(60), |r| {
            r["tags"]["trainyard.slurm.state"] == "PENDING"
        })
        .await;
    assert_eq!(run["status"], "queued", "a pending job is a queued run");
    let job = run["tags"]["trainyard.slurm.job_id"]
        .as_str()
        .unwrap()
        .to_string();
    let status = app.stop(&id).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED);
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "stopped", "{run:#}");
    assert_eq!(job_state(&job), "CANCELLED");
    let events = app.state.store.run_events(&id, None).await.unwrap();
    assert!(
        events
            .iter()
            .all(|e| e.to_status != trainyard::store::RunStatus::Running),
        "it never ran: {events:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_reaches_its_time_limit_is_resubmitted_within_max_restarts() {
    let app = slurm_app().await;
    // The first attempt outlives its one-minute limit; the second ends at once.
    let body = json!({
        "launch": true,
        "command": r#"if [ "$TRAINYARD_ATTEMPT" = 1 ]; then sleep 600; fi; echo "attempt $TRAINYARD_ATTEMPT done""#,
        "max_restarts": 1,
        "resources": {"slurm": {"time": "1"}},
    });
    let id = app.launch(body).await;
    let _cancel = CancelJobs(id.clone());
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_eq!(run["tags"]["trainyard.attempts"], "2");
    let jobs = jobs_of(app.data_dir.path(), &id);
    assert_eq!(jobs.len(), 2);
    assert_eq!(job_state(&jobs[0]), "TIMEOUT");
    let events = app.state.store.run_events(&id, None).await.unwrap();
    assert!(
        events.iter().any(|e| e
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("restarting") && r.contains("TIMEOUT"))),
        "{events:#?}"
    );
    let log = std::fs::read_to_string(
        app.data_dir
            .path()
            .join("runs")
            .join(&id)
            .join("output.log"),
    )
    .unwrap();
    assert!(log.contains("attempt 2 done"), "{log}");
}
