//! A launcher-enabled server (in-process, or a real `trainyard serve` process that a test can
//! SIGKILL) with a fake GPU inventory, plus polling helpers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;
use trainyard::app::{AppState, Settings};

use crate::kit;

pub const TRAINYARD: &str = env!("CARGO_BIN_EXE_trainyard");

/// A launcher-enabled server in this process; its requests are `Api`'s methods
/// (`app.launch(body)`, `app.wait_terminal(&id)`, `app.get(path)`, `app.post(path, &body)`).
pub struct TestApp {
    pub api: Api,
    pub state: AppState,
    pub data_dir: tempfile::TempDir,
}

impl std::ops::Deref for TestApp {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

/// A server's address and a client: the requests a test makes of it, as JSON values (a test
/// asserts on what the server sends, bad input included), and the typed `trainyard::client`.
#[derive(Clone)]
pub struct Api {
    /// `http://127.0.0.1:<port>`.
    pub address: String,
    pub client: reqwest::Client,
}

impl Api {
    pub fn new(address: &str) -> Api {
        Api {
            address: address.to_string(),
            client: client(),
        }
    }

    /// `address` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// The typed API client of the command line, on this server.
    pub fn typed(&self) -> trainyard::client::Client {
        trainyard::client::Client::with_http(&self.address, None, self.client.clone())
    }

    /// POSTs `body` as JSON; the status and the reply (`null` when it is not JSON).
    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let resp = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// GETs a JSON reply (panics if it is not JSON).
    pub async fn get(&self, path: &str) -> Value {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("request")
            .json()
            .await
            .expect("json")
    }

    /// Launches and returns the new run's id (panics unless 201 queued).
    pub async fn launch(&self, body: Value) -> String {
        let (status, reply) = self.post("/api/v1/runs", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{reply}");
        assert_eq!(reply["status"], "queued");
        reply["id"].as_str().expect("id").to_string()
    }

    /// `POST /api/v1/runs/{id}/stop`: the status of the answer.
    pub async fn stop(&self, id: &str) -> StatusCode {
        let path = format!("/api/v1/runs/{id}/stop");
        self.post(&path, &serde_json::json!({})).await.0
    }

    /// Polls the run until `done` holds for it; panics with the last state after `timeout`.
    pub async fn wait_for(
        &self,
        id: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let resp = self
                .client
                .get(self.url(&format!("/api/v1/runs/{id}")))
                .send()
                .await;
            if let Ok(resp) = resp {
                if let Ok(run) = resp.json::<Value>().await {
                    if done(&run) {
                        return run;
                    }
                    if Instant::now() > deadline {
                        panic!("run {id} did not get there in {timeout:?}: {run:#}");
                    }
                }
            }
            if Instant::now() > deadline {
                panic!("run {id}: server unreachable for {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for a run to end. The budget is only a guard against a hung test: a 4,000-step
    /// CPU run on a loaded 2-core machine took more than 120 s.
    pub async fn wait_terminal(&self, id: &str) -> Value {
        self.wait_for(id, Duration::from_secs(400), |r| {
            matches!(
                r["status"].as_str(),
                Some("finished" | "failed" | "stopped")
            )
        })
        .await
    }

    /// Follows the run's log (`?follow=true`) until the server ends the stream.
    pub async fn follow_log(&self, id: &str) -> Vec<kit::SseEvent> {
        let resp = self
            .client
            .get(self.url(&format!("/api/v1/runs/{id}/logs?follow=true")))
            .send()
            .await
            .expect("request");
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        kit::SseClient::from_response(resp).until_end().await
    }
}

/// An in-process server on SQLite whose launcher has the given fake GPUs and CPU slots.
pub async fn spawn_app(gpus: &[u32], cpu_slots: usize) -> TestApp {
    spawn_app_with(gpus, cpu_slots, |_| {}).await
}

/// Like `spawn_app`, with the settings adjusted by `tweak` before the server starts.
pub async fn spawn_app_with(
    gpus: &[u32],
    cpu_slots: usize,
    tweak: impl FnOnce(&mut Settings),
) -> TestApp {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let mut settings = kit::settings(data_dir.path());
    settings.launcher.gpus = Some(gpus.to_vec());
    settings.launcher.cpu_slots = cpu_slots;
    settings.launcher.stop_grace = Duration::from_secs(2);
    settings.launcher.trainer_bin = Some(PathBuf::from(TRAINYARD));
    settings.launcher.sys_metrics_interval = Duration::from_millis(500);
    // These tests launch shell commands, which a server refuses unless told otherwise.
    settings.allow_command_launch = true;
    // Their commands share scratch folders with the test (marks, scripts), which a confined
    // run may not write or read: queueing and supervision are tested unconfined, confinement
    // in `confine.rs`, and the trainer tests run confined (`spawn_confined_app`).
    settings.launcher.unconfined_runs = true;
    tweak(&mut settings);
    let spawned = kit::spawn(settings).await;
    TestApp {
        api: Api::new(&spawned.address),
        state: spawned.state,
        data_dir,
    }
}

/// Like `spawn_app`, with launched runs confined as a server confines them by default.
pub async fn spawn_confined_app(gpus: &[u32], cpu_slots: usize) -> TestApp {
    spawn_app_with(gpus, cpu_slots, |s| s.launcher.unconfined_runs = false).await
}

pub use kit::client;

/// Writes an executable shell script.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

pub fn launch_record(data_dir: &Path, id: &str) -> Value {
    let text = std::fs::read_to_string(data_dir.join("runs").join(id).join("launch.json"))
        .expect("launch.json");
    serde_json::from_str(&text).expect("launch.json is JSON")
}

/// Pids of a process's direct children.
pub fn children(pid: i64) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// A `trainyard serve` process (so a test can SIGKILL the server for real); its requests are
/// `Api`'s methods, as a `TestApp`'s are.
pub struct ServeProcess {
    pub child: std::process::Child,
    pub api: Api,
    /// The port it listens on: a restart on the same data directory passes it back in.
    pub port: u16,
}

impl std::ops::Deref for ServeProcess {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

/// The file in a server's data directory that collects its log, across restarts.
const SERVE_LOG: &str = "serve.log";

/// `trainyard serve` (command launches allowed) on `port`, 0 for one the kernel picks.
pub async fn spawn_serve(data_dir: &Path, port: u16) -> ServeProcess {
    spawn_serve_with_env(data_dir, port, &[]).await
}

/// `trainyard serve` (command launches allowed) with these extra environment variables, on
/// `port` (0: any free one). The port is read back from the server's own "listening" log line
/// rather than reserved beforehand: a port found free and released can be taken by another
/// test's server before this one binds it, and requests would then reach that server.
pub async fn spawn_serve_with_env(
    data_dir: &Path,
    port: u16,
    env: &[(&str, &str)],
) -> ServeProcess {
    std::fs::create_dir_all(data_dir).expect("data dir");
    let log_path = data_dir.join(SERVE_LOG);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .expect("open the server log");
    let from = log.metadata().expect("log metadata").len() as usize;
    let mut child = std::process::Command::new(TRAINYARD)
        .args([
            "serve",
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(data_dir)
        .args(["--cpu-slots", "2", "--gpus", "0", "--allow-command-launch"])
        .env_remove("DATABASE_URL")
        .env_remove("TRAINYARD_ADMIN_TOKEN")
        // The "listening" line is an info line; a test may still ask for more.
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn trainyard serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    let port = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let ours = text.get(from..).unwrap_or_default();
        if let Some(port) = crate::kit::listening_port(ours) {
            break port;
        }
        if let Some(status) = child.try_wait().expect("server status") {
            panic!("trainyard serve exited ({status}) before listening:\n{ours}");
        }
        assert!(
            Instant::now() < deadline,
            "trainyard serve did not come up:\n{ours}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let address = format!("http://127.0.0.1:{port}");
    let c = client();
    while c.get(format!("{address}/healthz")).send().await.is_err() {
        assert!(Instant::now() < deadline, "trainyard serve did not answer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ServeProcess {
        child,
        api: Api::new(&address),
        port,
    }
}

/// What a server started by `spawn_serve` has logged so far, for a failing test's message.
pub fn serve_log(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join(SERVE_LOG)).unwrap_or_default()
}
