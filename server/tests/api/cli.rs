//! The real `trainyard` binary: `serve`'s flags from the environment, refusal to expose itself,
//! graceful exit on SIGTERM; `train --print-config`; `train --server` creating its own run.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn trainyard() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    for var in [
        "TRAINYARD_ADDR",
        "TRAINYARD_DATA_DIR",
        "DATABASE_URL",
        "TRAINYARD_ADMIN_TOKEN",
        "TRAINYARD_SERVER_URL",
        "TRAINYARD_RUN_ID",
        "TRAINYARD_TOKEN",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

#[test]
fn serve_refuses_a_public_address_from_the_environment_without_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = trainyard()
        .arg("serve")
        .env("TRAINYARD_ADDR", "0.0.0.0:0")
        .env("TRAINYARD_DATA_DIR", dir.path())
        .output()
        .expect("run trainyard");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0"),
        "{stderr}"
    );
    assert!(stderr.contains("TRAINYARD_ADMIN_TOKEN"), "{stderr}");
}

#[cfg(unix)]
#[test]
fn serve_uses_the_data_dir_from_the_environment_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("data");
    let mut child = trainyard()
        .arg("serve")
        .env("TRAINYARD_ADDR", "127.0.0.1:0")
        .env("TRAINYARD_DATA_DIR", &data_dir)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trainyard");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let listening = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|line| line.contains("listening"))
        .expect("a `listening` log line");
    assert!(listening.contains("127.0.0.1:"), "{listening}");
    assert!(
        data_dir.join("trainyard.db").exists(),
        "the SQLite file lives in the data dir"
    );

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "trainyard did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
}

/// `train` on the CPU with a tiny model and no progress bar, plus `extra` arguments.
fn tiny_train(extra: &[&str]) -> Command {
    let mut cmd = trainyard();
    cmd.args([
        "train",
        "--config",
        "tiny",
        "--set",
        "training.max_steps=3",
        "--set",
        "training.warmup_steps=1",
        "--set",
        "training.device=cpu",
        "--set",
        "training.threads=1",
        "--set",
        "logging.progress=never",
    ])
    .args(extra);
    cmd
}

#[test]
fn train_print_config_prints_the_resolved_config_and_trains_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run");
    let output = tiny_train(&["--print-config", "--out"])
        .arg(&out)
        .output()
        .expect("run trainyard");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = trainer::config::Config::from_yaml_str(&String::from_utf8_lossy(&output.stdout))
        .expect("the output is a config");
    let overrides: Vec<String> = [
        "training.max_steps=3",
        "training.warmup_steps=1",
        "training.device=cpu",
        "training.threads=1",
        "logging.progress=never",
    ]
    .map(String::from)
    .to_vec();
    let resolved = trainer::config::Config::resolve("tiny", &overrides).expect("resolves");
    assert_eq!(printed, resolved);
    assert!(!out.exists(), "nothing was trained");

    let bad = tiny_train(&["--set", "training.max_step=9", "--print-config"])
        .output()
        .expect("run trainyard");
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("training.max_step: unknown key; did you mean training.max_steps?"),
        "{stderr}"
    );
}

#[tokio::test]
async fn train_with_a_server_and_no_run_id_creates_its_run_and_reports_to_it() {
    let app = crate::helpers::spawn_app().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run");
    let mut cmd = tiny_train(&[
        "--server",
        &app.address,
        "--experiment",
        "by-hand",
        "--name",
        "first try",
        "--out",
    ]);
    cmd.arg(&out);
    let output = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run trainyard");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("run "))
        .unwrap_or_else(|| panic!("no `run ID: URL` line in {stdout}"));
    let (id, page) = line.split_once(": ").expect("run ID: URL");
    assert_eq!(page, format!("{}/runs/{id}", app.address));

    let run = app.get_json(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(run["name"], "first try");
    assert_eq!(run["status"], "finished", "{run}");
    assert_eq!(run["params"]["training.max_steps"], "3");
    assert_eq!(run["latest_metrics"]["train/loss"]["step"], 3);
    let experiments = app.get_json("/api/v1/experiments").await;
    let experiment = experiments["experiments"]
        .as_array()
        .expect("experiments")
        .iter()
        .find(|e| e["name"] == "by-hand")
        .expect("the experiment was created");
    assert_eq!(run["experiment_id"], experiment["id"]);
}
