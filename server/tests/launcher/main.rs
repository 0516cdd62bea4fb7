//! Launcher tests: queue and GPU accounting on a fake inventory, supervision (exit, signals,
//! restarts, stop), logs, custom commands, and surviving a server SIGKILL.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

mod client;
mod confine;
mod env;
mod helpers;
#[allow(dead_code)]
#[path = "../kit/mod.rs"]
mod kit;
mod restart;
mod slurm;
mod sweeps;
mod trainer;

use std::time::{Duration, Instant};

use helpers::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use trainyard::store::RunStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_runs_on_two_gpus_never_overlap_beyond_two_all_finish_and_start_in_fifo_order() {
    let app = spawn_app(&[0, 1], 1).await;
    let marks = tempfile::tempdir().unwrap();
    let body = r#"d="$1"
echo "$(date +%s%N) $CUDA_VISIBLE_DEVICES" > "$d/$TRAINYARD_RUN_ID.start"
sleep 0.3
date +%s%N > "$d/$TRAINYARD_RUN_ID.end""#;
    let s = script(marks.path(), "job.sh", body);
    let mut ids = Vec::new();
    for _ in 0..10 {
        let cmd = json!(["sh", s.to_str().unwrap(), marks.path().to_str().unwrap()]);
        let body = json!({"launch": true, "resources": {"gpus": 1}, "command": cmd});
        ids.push(app.launch(body).await);
    }
    let mut intervals = Vec::new();
    for id in &ids {
        let run = app.wait_terminal(id).await;
        assert_eq!(run["status"], "finished", "{run:#}");
        let start = std::fs::read_to_string(marks.path().join(format!("{id}.start"))).unwrap();
        let end = std::fs::read_to_string(marks.path().join(format!("{id}.end"))).unwrap();
        let mut f = start.split_whitespace();
        let t0: u128 = f.next().unwrap().parse().unwrap();
        let gpu = f.next().unwrap_or("").to_string();
        assert!(gpu == "0" || gpu == "1", "CUDA_VISIBLE_DEVICES was {gpu:?}");
        intervals.push((t0, end.trim().parse::<u128>().unwrap(), gpu));
    }
    // Never more than two at once (sweep over start/end marks), never two on the same GPU.
    let mut marks_in_time: Vec<(u128, i32)> = intervals
        .iter()
        .flat_map(|(s, e, _)| [(*s, 1), (*e, -1)])
        .collect();
    marks_in_time.sort();
    let mut running = 0;
    for (_, delta) in marks_in_time {
        running += delta;
        assert!(running <= 2, "{running} runs at once on 2 GPUs");
    }
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            if b.0 < a.1 && a.0 < b.1 {
                assert_ne!(a.2, b.2, "two runs shared GPU {} at the same time", a.2);
            }
        }
    }
    // FIFO: the `running` events come in submission order.
    let mut starts = Vec::new();
    for id in &ids {
        let events = app.state.store.run_events(id, None).await.unwrap();
        let running = events
            .iter()
            .find(|e| e.to_status == RunStatus::Running)
            .expect("a running event");
        starts.push(running.seq);
    }
    let mut sorted = starts.clone();
    sorted.sort();
    assert_eq!(starts, sorted, "runs started out of submission order");
}

#[tokio::test]
async fn a_run_asking_for_more_gpus_than_exist_is_rejected_with_a_clear_error() {
    let app = spawn_app(&[0, 1], 1).await;
    let body = json!({"launch": true, "profile": "tiny", "resources": {"gpus": 3}});
    let (status, reply) = app.post("/api/v1/runs", &body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reply["error"]["field"], "resources.gpus");
    let msg = reply["error"]["message"].as_str().unwrap();
    assert!(msg.contains("3 GPUs") && msg.contains("has 2"), "{msg}");
}

#[tokio::test]
async fn launch_requests_with_config_mistakes_are_rejected_naming_the_key() {
    let app = spawn_app(&[], 1).await;
    let cases = [
        (
            json!({"launch": true, "profile": "tiny", "overrides": {"training.max_stepz": 3}}),
            "training.max_stepz",
        ),
        (
            json!({"launch": true, "config": "model:\n  n_heads: 3\n"}),
            "model.d_model",
        ),
        (
            json!({"launch": true, "config": {"training": {"lr": 1}}}),
            "training.lr",
        ),
        (json!({"launch": true, "profile": "gigantic"}), "profile"),
        (json!({"launch": true}), "config"),
        (json!({"launch": true, "command": []}), "command"),
        (json!({"profile": "tiny"}), "profile"),
        (json!({"command": "echo hi"}), "command"),
    ];
    for (body, field) in cases {
        let (status, reply) = app.post("/api/v1/runs", &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], field, "{body} → {reply}");
    }
    let runs = app.get("/api/v1/runs").await;
    assert_eq!(
        runs["runs"].as_array().unwrap().len(),
        0,
        "no run may be created"
    );
}

#[tokio::test]
async fn killing_a_runs_process_with_sigkill_fails_the_run_within_five_seconds_with_signal_and_log_tail(
) {
    let app = spawn_app(&[], 1).await;
    let cmd = "echo hello-from-the-run; exec sleep 60";
    let id = app.launch(json!({"launch": true, "command": cmd})).await;
    app.wait_for(&id, Duration::from_secs(30), |r| r["status"] == "running")
        .await;
    let wrapper = launch_record(app.data_dir.path(), &id)["process"]["pid"]
        .as_i64()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let target = loop {
        if let Some(&c) = children(wrapper).first() {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "the run's process never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Let the echo reach the log before killing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed_at = Instant::now();
    unsafe { libc::kill(target, libc::SIGKILL) };
    let run = app
        .wait_for(&id, Duration::from_secs(5), |r| r["status"] == "failed")
        .await;
    assert!(killed_at.elapsed() <= Duration::from_secs(5));
    assert_eq!(run["exit"]["signal"], 9, "{run:#}");
    let message = run["exit"]["message"].as_str().unwrap();
    assert!(message.contains("SIGKILL"), "{message}");
    assert!(message.contains("hello-from-the-run"), "{message}");
}

#[tokio::test]
async fn a_failed_command_with_max_restarts_is_relaunched_and_its_attempts_are_counted() {
    let app = spawn_app(&[], 1).await;
    let cmd = r#"echo "attempt $TRAINYARD_ATTEMPT"; [ "$TRAINYARD_ATTEMPT" = 2 ] || exit 7"#;
    let body = json!({"launch": true, "command": cmd, "max_restarts": 1});
    let id = app.launch(body).await;
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_eq!(run["tags"]["trainyard.attempts"], "2");
    let events = app.state.store.run_events(&id, None).await.unwrap();
    let restart = events
        .iter()
        .find(|e| e.reason.as_deref().unwrap_or("").starts_with("restarting"))
        .expect("a restart event");
    assert!(
        restart.reason.as_deref().unwrap().contains("exit code 7"),
        "{restart:?}"
    );
    let log = std::fs::read_to_string(
        app.data_dir
            .path()
            .join("runs")
            .join(&id)
            .join("output.log"),
    )
    .unwrap();
    assert!(
        log.contains("attempt 1") && log.contains("attempt 2"),
        "{log}"
    );
}

#[tokio::test]
async fn a_run_that_fails_with_no_restarts_left_is_failed_with_its_exit_code() {
    let app = spawn_app(&[], 1).await;
    let id = app
        .launch(json!({"launch": true, "command": "echo boom >&2; exit 3"}))
        .await;
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["exit"]["exit_code"], 3);
    assert!(run["exit"]["message"].as_str().unwrap().contains("boom"));
}

#[tokio::test]
async fn stopping_a_queued_run_takes_it_out_of_the_queue_and_stopping_a_running_one_sends_sigterm()
{
    let app = spawn_app(&[0], 0).await;
    let cmd = "echo up; exec sleep 60";
    let first = app
        .launch(json!({"launch": true, "command": cmd, "resources": {"gpus": 1}}))
        .await;
    let second = app
        .launch(json!({"launch": true, "command": cmd, "resources": {"gpus": 1}}))
        .await;
    app.wait_for(&first, Duration::from_secs(30), |r| {
        r["status"] == "running"
    })
    .await;
    let (status, reply) = app
        .post(&format!("/api/v1/runs/{second}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(reply["status"], "stopped");
    assert_eq!(
        app.get(&format!("/api/v1/runs/{second}")).await["status"],
        "stopped"
    );
    assert!(app.state.launcher.queued().is_empty());
    let (status, reply) = app
        .post(&format!("/api/v1/runs/{first}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(reply["status"], "stopping");
    let run = app.wait_terminal(&first).await;
    assert_eq!(run["status"], "stopped", "{run:#}");
    assert_eq!(
        run["exit"]["signal"], 15,
        "sleep dies of the SIGTERM: {run:#}"
    );
    // The queued run never started.
    assert!(!app
        .data_dir
        .path()
        .join("runs")
        .join(&second)
        .join("output.log")
        .exists());
    let status = app.stop(&first).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a finished run cannot be stopped again"
    );
}

#[tokio::test]
async fn a_run_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let app = spawn_app(&[], 1).await;
    let cmd = "trap '' TERM; echo stubborn; sleep 60";
    let id = app.launch(json!({"launch": true, "command": cmd})).await;
    app.wait_for(&id, Duration::from_secs(30), |r| r["status"] == "running")
        .await;
    let status = app.stop(&id).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "stopped");
    assert_eq!(run["exit"]["signal"], 9, "{run:#}");
}

#[tokio::test]
async fn a_custom_command_posting_points_with_curl_shows_up_with_its_points_and_exit_status() {
    let app = spawn_app(&[], 1).await;
    let dir = tempfile::tempdir().unwrap();
    let body = r#"for step in 0 1 2; do
  curl -sf -X POST "$TRAINYARD_SERVER_URL/api/v1/runs/$TRAINYARD_RUN_ID/metrics" \
    -H 'content-type: application/json' \
    -d "{\"points\": [{\"key\": \"custom/score\", \"step\": $step, \"value\": $step.5}]}" || exit 9
done
[ "$PWD" = "$TRAINYARD_RUN_DIR" ] || exit 8
echo "cuda=[$CUDA_VISIBLE_DEVICES]"
exit 0"#;
    let s = script(dir.path(), "report.sh", body);
    let id = app
        .launch(json!({"launch": true, "command": [s.to_str().unwrap()]}))
        .await;
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_eq!(run["exit"]["exit_code"], 0);
    let series = app
        .get(&format!("/api/v1/runs/{id}/metrics?key=custom/score"))
        .await;
    let steps: Vec<i64> = series["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, [0, 1, 2]);
    assert_eq!(series["points"][2]["value"], 2.5);
    let log = app
        .client
        .get(format!("{}/api/v1/runs/{id}/logs", app.address))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(log.contains("cuda=[]"), "a CPU run sees no GPU: {log}");
}

#[tokio::test]
async fn logs_are_served_by_tail_and_offset_and_followed_live_until_the_run_ends() {
    let app = spawn_app(&[], 1).await;
    let cmd = "for i in 1 2 3 4 5; do echo line-$i; sleep 0.2; done";
    let id = app.launch(json!({"launch": true, "command": cmd})).await;
    // The stream ends after the `end` event.
    let events = app.follow_log(&id).await;
    let (end, output) = events.split_last().expect("events");
    let got: String = output
        .iter()
        .map(|e| {
            assert_eq!(e.event, "log", "{e:?}");
            e.data["text"].as_str().expect("text")
        })
        .collect();
    assert_eq!(got, "line-1\nline-2\nline-3\nline-4\nline-5\n");
    assert_eq!(end.event, "end", "{end:?}");
    assert_eq!(end.data["status"], "finished", "{end:?}");
    let tail = app
        .get(&format!("/api/v1/runs/{id}/logs?tail=2&format=json"))
        .await;
    assert_eq!(tail["text"], "line-4\nline-5\n");
    let from = app
        .get(&format!("/api/v1/runs/{id}/logs?offset=7&format=json"))
        .await;
    assert_eq!(from["text"], "line-2\nline-3\nline-4\nline-5\n");
    let (status, reply) = {
        let r = app
            .client
            .get(format!("{}/api/v1/runs/{id}/logs?tail=x", app.address))
            .send()
            .await
            .unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(reply["error"]["field"], "tail");
}

#[tokio::test]
async fn a_running_process_reports_system_metrics() {
    let app = spawn_app(&[], 1).await;
    let id = app
        .launch(json!({"launch": true, "command": "sleep 2"}))
        .await;
    let run = app.wait_terminal(&id).await;
    assert_eq!(run["status"], "finished");
    let rss = &run["latest_metrics"]["sys/rss_mb"];
    assert!(rss["value"].as_f64().unwrap() > 0.0, "{run:#}");
    assert!(
        run["latest_metrics"]["sys/cpu_percent"].is_object(),
        "{run:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_follow_streams_the_output_and_exits_with_the_final_status() {
    let bin = tempfile::tempdir().unwrap();
    // Stands in for `trainyard train`: shows its arguments, fails when asked to.
    let fake = script(
        bin.path(),
        "fake-trainer.sh",
        r#"echo "fake trainer: $*"
echo "héllo ✓ 日本"
grep -q '"max_steps": 13' "$TRAINYARD_RUN_DIR/config.json" && { echo "unlucky"; exit 4; }
exit 0"#,
    );
    let app = spawn_app_with(&[], 1, |s| s.launcher.trainer_bin = Some(fake.clone())).await;
    let submit = |steps: &str| {
        tokio::process::Command::new(TRAINYARD)
            .args(["submit", "--server", &app.address, "--profile", "tiny"])
            .args(["--set", &format!("training.max_steps={steps}"), "--follow"])
            .env_remove("TRAINYARD_TOKEN")
            .output()
    };
    let ok = submit("20").await.unwrap();
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(stdout.contains("fake trainer: train --config"), "{stdout}");
    assert!(stdout.contains("--run-id"), "{stdout}");
    assert!(stdout.contains("héllo ✓ 日本\n"), "{stdout}");
    let failed = submit("13").await.unwrap();
    assert_eq!(
        failed.status.code(),
        Some(1),
        "a failed run fails the command"
    );
    assert!(String::from_utf8_lossy(&failed.stdout).contains("unlucky"));
    let refused = submit("many").await.unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("training.max_steps"));
}

#[tokio::test]
async fn a_launched_command_gets_a_token_of_its_own_and_can_report_to_a_protected_server() {
    let app = spawn_app_with(&[], 1, |s| s.admin_token = Some("s3cret".into())).await;
    let cmd = r#"curl -sf -X POST "$TRAINYARD_SERVER_URL/api/v1/runs/$TRAINYARD_RUN_ID/metrics" \
  -H "Authorization: Bearer $TRAINYARD_TOKEN" -H 'content-type: application/json' \
  -d '{"points": [{"key": "auth/ok", "step": 0, "value": 1}]}'"#;
    let url = format!("{}/api/v1/runs", app.address);
    let unauthorized = app
        .client
        .post(&url)
        .json(&json!({"launch": true, "command": cmd}))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), StatusCode::UNAUTHORIZED);
    let reply: Value = app
        .client
        .post(&url)
        .bearer_auth("s3cret")
        .json(&json!({"launch": true, "command": cmd}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = reply["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let run = loop {
        let run: Value = app
            .client
            .get(format!("{url}/{id}"))
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if run["status"] == "finished" || run["status"] == "failed" {
            break run;
        }
        assert!(Instant::now() < deadline, "{run:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(run["status"], "finished", "{run:#}");
    assert_eq!(run["latest_metrics"]["auth/ok"]["value"], 1.0);
}
