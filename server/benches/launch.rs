//! Launch latency: from `POST /api/v1/runs` (launch: true) to the run's process running.
//!
//! Two clocks per launch: until the API reports the run `running` (the launcher has spawned the
//! process and recorded it), and until the first line of the launched command has executed
//! (it writes a marker file). Runs one launch at a time on an idle in-process server (SQLite).
//!
//! `cargo bench -p trainyard --bench launch [-- LAUNCHES]`

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use trainyard::app::{Application, Settings};

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let pick = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:<34} n={:<3} median {:>7.1} ms   p90 {:>7.1} ms   max {:>7.1} ms",
        samples.len(),
        ms(pick(0.5)),
        ms(pick(0.9)),
        ms(*samples.last().unwrap_or(&Duration::ZERO)),
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let launches: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(30);
    let data = tempfile::tempdir()?;
    let addr: SocketAddr = "127.0.0.1:0".parse()?;
    let mut settings = Settings::new(addr, data.path());
    settings.launcher.gpus = Some(vec![0, 1]);
    settings.launcher.cpu_slots = 1;
    settings.launcher.trainer_bin = Some(env!("CARGO_BIN_EXE_trainyard").into());
    // The benchmark launches shell commands.
    settings.allow_command_launch = true;
    let app = Application::build(settings).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());
    let client = reqwest::Client::new();
    let marks = tempfile::tempdir()?;

    let mut to_running = Vec::new();
    let mut to_first_line = Vec::new();
    for i in 0..launches {
        let marker = marks.path().join(format!("{i}.started"));
        let command = format!("touch '{}'", marker.display());
        let body = json!({"launch": true, "command": command, "resources": {"gpus": 1}});
        let t0 = Instant::now();
        let reply: Value = client
            .post(format!("{base}/api/v1/runs"))
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let id = reply["id"].as_str().unwrap_or_default().to_string();
        let mut saw_running = None;
        loop {
            if saw_running.is_none() {
                let run: Value = client
                    .get(format!("{base}/api/v1/runs/{id}"))
                    .send()
                    .await?
                    .json()
                    .await?;
                if run["status"] != "queued" {
                    saw_running = Some(t0.elapsed());
                }
            }
            if marker.exists() && saw_running.is_some() {
                to_first_line.push(t0.elapsed().min(Duration::from_secs(3600)));
                break;
            }
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(30),
                "launch {i} never ran"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        to_running.extend(saw_running);
        // Let it finish so the next launch finds a free GPU slot, as on an idle server.
        loop {
            let run: Value = client
                .get(format!("{base}/api/v1/runs/{id}"))
                .send()
                .await?
                .json()
                .await?;
            if run["status"] == "finished" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // The real trainer (tiny profile, CPU): until its process runs, and until its first metric.
    let mut trainer_running = Vec::new();
    let mut trainer_first_point = Vec::new();
    for _ in 0..launches.min(10) {
        let body = json!({"launch": true, "profile": "tiny", "overrides": {
            "training.max_steps": 5, "training.eval_steps": 0, "training.device": "cpu",
            "training.warmup_steps": 1, "logging.flush_interval_ms": 50}});
        let t0 = Instant::now();
        let reply: Value = client
            .post(format!("{base}/api/v1/runs"))
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let id = reply["id"].as_str().unwrap_or_default().to_string();
        let pid_file = data.path().join("runs").join(&id).join("launch.json");
        let mut running = None;
        let mut first_point = None;
        loop {
            if running.is_none() {
                // The trainer is the wrapper's child: running once the wrapper has one.
                let pid = std::fs::read_to_string(&pid_file)
                    .ok()
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                    .and_then(|v| v["process"]["pid"].as_i64());
                if let Some(pid) = pid {
                    let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                        .unwrap_or_default();
                    if !kids.trim().is_empty() {
                        running = Some(t0.elapsed());
                    }
                }
            }
            let run: Value = client
                .get(format!("{base}/api/v1/runs/{id}"))
                .send()
                .await?
                .json()
                .await?;
            if first_point.is_none() && run["latest_metrics"].get("train/loss").is_some() {
                first_point = Some(t0.elapsed());
            }
            if run["status"] == "finished" || run["status"] == "failed" {
                anyhow::ensure!(run["status"] == "finished", "trainer run failed: {run}");
                break;
            }
            anyhow::ensure!(t0.elapsed() < Duration::from_secs(120), "trainer run hung");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        trainer_running.extend(running);
        trainer_first_point.extend(first_point);
    }
    println!("launch latency over {launches} launches (fake 2-GPU inventory, SQLite):");
    summary("POST → API shows `running`", to_running);
    summary("POST → command's first line ran", to_first_line);
    summary("POST → trainer process running", trainer_running);
    summary("POST → trainer's first metric", trainer_first_point);
    Ok(())
}
