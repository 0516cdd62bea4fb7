//! Harness for the browser tests: a server on a free loopback port with a fresh SQLite database,
//! and headless Chromium driven over WebDriver by a chromedriver this harness starts.
//! Missing browser packages fail the tests (they never skip): install Debian's `chromium` and
//! `chromium-driver`.

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use tokio::process::{Child, Command};

use crate::kit;

pub struct TestApp {
    pub address: String,
    pub http: reqwest::Client,
    pub data_dir: PathBuf,
    _dir: TempDir,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with_store().await.0
}

/// The server and a handle on its store (for seeding many runs quickly).
pub async fn spawn_app_with_store() -> (TestApp, trainyard::store::DynStore) {
    spawn_app_with(|_| {}).await
}

/// Like `spawn_app_with_store`, with settings adjusted by `tweak` first.
pub async fn spawn_app_with(
    tweak: impl FnOnce(&mut trainyard::app::Settings),
) -> (TestApp, trainyard::store::DynStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = kit::settings(dir.path());
    // Launched runs use the real binary on CPU slots; no GPU discovery in tests.
    settings.launcher.gpus = Some(vec![]);
    settings.launcher.trainer_bin = Some(PathBuf::from(env!("CARGO_BIN_EXE_trainyard")));
    settings.launcher.stop_grace = Duration::from_secs(5);
    // The stop test launches a shell command.
    settings.allow_command_launch = true;
    tweak(&mut settings);
    let spawned = kit::spawn(settings).await;
    let address = spawned.address;
    let store = spawned.state.store.clone();
    let app = TestApp {
        address,
        http: reqwest::Client::new(),
        data_dir: dir.path().to_path_buf(),
        _dir: dir,
    };
    (app, store)
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    pub async fn create_run(&self, body: Value) -> String {
        let res = self
            .http
            .post(self.url("/api/v1/runs"))
            .json(&body)
            .send()
            .await
            .expect("create run");
        assert_eq!(
            res.status().as_u16(),
            201,
            "create run: {:?}",
            res.text().await
        );
        let v: Value = res.json().await.expect("json");
        v["id"].as_str().expect("run id").to_string()
    }

    pub async fn post_points(&self, run_id: &str, points: Value) {
        let res = self
            .http
            .post(self.url(&format!("/api/v1/runs/{run_id}/metrics")))
            .json(&json!({ "points": points }))
            .send()
            .await
            .expect("post metrics");
        assert!(
            res.status().is_success(),
            "post metrics: {:?}",
            res.text().await
        );
    }

    pub async fn patch(&self, run_id: &str, body: Value) {
        let res = self
            .http
            .patch(self.url(&format!("/api/v1/runs/{run_id}")))
            .json(&body)
            .send()
            .await
            .expect("patch run");
        assert!(res.status().is_success(), "patch: {:?}", res.text().await);
    }

    pub async fn run(&self, run_id: &str) -> Value {
        self.http
            .get(self.url(&format!("/api/v1/runs/{run_id}")))
            .send()
            .await
            .expect("get run")
            .json()
            .await
            .expect("json")
    }
}

/// A loss curve with a spike, as a trainer would post it.
pub fn loss_points(key: &str, steps: std::ops::Range<i64>) -> Value {
    Value::Array(
        steps
            .map(|s| json!({"key": key, "step": s, "value": 3.0 / (1.0 + s as f64 * 0.05) + if s == 30 { 2.0 } else { 0.0 }}))
            .collect(),
    )
}

pub struct Browser {
    pub client: Client,
    _driver: Child,
    _profile: TempDir,
}

fn find_binary(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for n in names {
            let p = dir.join(n);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

pub async fn browser() -> Browser {
    browser_with(json!({})).await
}

/// Chromium with JavaScript off, as a person who turned it off browses: pages render, forms
/// post, no page script runs (WebDriver's own commands still work).
pub async fn browser_without_javascript() -> Browser {
    browser_with(json!({"profile.managed_default_content_settings.javascript": 2})).await
}

async fn browser_with(prefs: Value) -> Browser {
    let driver_bin = find_binary(&["chromedriver"]).unwrap_or_else(|| {
        panic!("chromedriver not found on PATH: install the Debian packages `chromium chromium-driver`")
    });
    let chrome_bin = find_binary(&["chromium", "chromium-browser", "google-chrome"]).unwrap_or_else(
        || panic!("chromium not found on PATH: install the Debian packages `chromium chromium-driver`"),
    );
    let port = free_port();
    let driver = Command::new(driver_bin)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start chromedriver");
    let profile = tempfile::tempdir().expect("profile dir");
    let caps = json!({
        "goog:chromeOptions": {
            "binary": chrome_bin.to_string_lossy(),
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1440,1000",
                format!("--user-data-dir={}", profile.path().display()),
            ],
            "prefs": prefs,
        }
    });
    let caps = match caps {
        Value::Object(m) => m,
        _ => unreachable!("capabilities are an object"),
    };
    let webdriver = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let client = loop {
        // Plain HTTP: chromedriver listens on loopback, so no TLS stack is needed.
        match ClientBuilder::new(HttpConnector::new())
            .capabilities(caps.clone())
            .connect(&webdriver)
            .await
        {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot start a Chromium session through chromedriver: {e}"),
        }
    };
    Browser {
        client,
        _driver: driver,
        _profile: profile,
    }
}

impl Browser {
    /// Evaluates `script` (a JS expression body with `return`) until it yields a truthy value.
    pub async fn wait_for(&self, script: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self
                .client
                .execute(script, vec![])
                .await
                .expect("execute script");
            let truthy =
                !matches!(&v, Value::Null | Value::Bool(false)) && v != json!(0) && v != json!("");
            if truthy {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for `{script}` (last: {v})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .expect("execute script")
    }

    /// Saves a PNG of the current page as `<screenshots dir>/<name>.png`.
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        let dir = screenshots_dir();
        std::fs::create_dir_all(&dir).expect("screenshots dir");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("write screenshot");
    }

    pub async fn close(self) {
        let _ = self.client.close().await;
    }
}

/// Where screenshots go: the folder `TRAINYARD_SCREENSHOTS` names (a relative one from the
/// repository root; the README's images are made with `TRAINYARD_SCREENSHOTS=docs/img`), else
/// `target/screenshots/`.
pub fn screenshots_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TRAINYARD_SCREENSHOTS").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return if dir.is_absolute() {
            dir
        } else {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir)
        };
    }
    // CARGO_TARGET_TMPDIR is `<target>/tmp`; screenshots go next to it.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|p| p.join("screenshots"))
        .unwrap_or_else(|| PathBuf::from("target/screenshots"))
}
