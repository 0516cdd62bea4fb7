//! The one test kit: a scratch Postgres database per test and an in-process server on a free
//! loopback port. Every suite (api, launcher, store, pages, browser) builds on it; each keeps
//! only the conveniences of its own domain in its helpers file.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::Value;
use sqlx::Connection;
use trainyard::app::{AppState, Application, Settings};
use trainyard::client::sse::{self, SseError};

const DEFAULT_PG: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Base URL of the Postgres server the tests may create databases on.
pub fn pg_base() -> String {
    std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG.to_string())
}

/// `base` with its database name replaced (any `?options` kept).
pub fn with_database(base: &str, name: &str) -> String {
    let (url, query) = match base.split_once('?') {
        Some((u, q)) => (u, Some(q)),
        None => (base, None),
    };
    let after_scheme = url.find("://").map(|i| i + 3).unwrap_or(0);
    let host_end = url[after_scheme..]
        .find('/')
        .map(|i| i + after_scheme)
        .unwrap_or(url.len());
    let mut out = format!("{}/{name}", &url[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// A brand-new Postgres database, dropped when this value is (even when the test panics).
pub struct ScratchDb {
    /// This database's URL.
    pub url: String,
    /// The server's admin URL the database was created through.
    pub base: String,
    pub name: String,
}

impl ScratchDb {
    /// Creates `<prefix>_<uuid>`; Postgres is required (the tests never skip).
    pub async fn create(prefix: &str) -> ScratchDb {
        let base = pg_base();
        let mut admin = sqlx::PgConnection::connect(&base)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "Postgres is required for these tests but `{base}` is unreachable: {e}. \
                     Start Postgres or set TEST_DATABASE_URL."
                )
            });
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .expect("create test database");
        let _ = admin.close().await;
        ScratchDb {
            url: with_database(&base, &name),
            base,
            name,
        }
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        let (base, name) = (self.base.clone(), self.name.clone());
        // Drop may run inside the test's runtime, which cannot block on async work: a thread
        // with its own runtime drops the database (FORCE ends pooled connections), and we wait
        // for it so no scratch database outlives the test process.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(mut admin) = sqlx::PgConnection::connect(&base).await {
                    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                    let _ = sqlx::query(&sql).execute(&mut admin).await;
                    let _ = admin.close().await;
                }
            });
        })
        .join();
    }
}

/// Settings for a server on a free loopback port keeping its data in `data_dir`.
pub fn settings(data_dir: &Path) -> Settings {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    Settings::new(addr, data_dir)
}

/// A server running in this process.
pub struct Spawned {
    /// `http://127.0.0.1:<port>`.
    pub address: String,
    pub state: AppState,
}

/// Builds and starts the server in the background of the test's runtime.
pub async fn spawn(settings: Settings) -> Spawned {
    let app = Application::build(settings).await.expect("server builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let state = app.state().clone();
    // Not `run_until_stopped`: its signal handlers would keep Ctrl-C from ending the tests.
    tokio::spawn(app.run_until(std::future::pending()));
    Spawned { address, state }
}

/// The port in a `trainyard serve` log's "trainyard listening" line (the server was started
/// on port 0 and says which one it got).
pub fn listening_port(logs: &str) -> Option<u16> {
    let line = logs.lines().find(|l| l.contains("trainyard listening"))?;
    let at = line.find("127.0.0.1:")? + "127.0.0.1:".len();
    line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// An HTTP client whose requests give up after 30 s instead of hanging a test.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// One event of a `text/event-stream`, its data read as JSON (as text when it is not JSON).
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub event: String,
    pub id: Option<String>,
    pub data: Value,
}

/// Reads the events of a `text/event-stream` with the API client's decoder (`client::sse`),
/// which keeps a character or a frame split across two reads whole.
pub struct SseClient {
    events: BoxStream<'static, Result<sse::SseEvent, SseError>>,
}

impl SseClient {
    /// Reads the events of an already opened `text/event-stream` response.
    pub fn from_response(response: reqwest::Response) -> SseClient {
        SseClient {
            events: sse::events(response),
        }
    }

    /// The next event (keep-alive comments are skipped); panics after 10 s without one.
    pub async fn next_event(&mut self) -> SseEvent {
        self.next_event_or_end().await.expect("the stream is open")
    }

    /// The next event, or `None` once the server ended the stream; panics after 10 s without
    /// either.
    pub async fn next_event_or_end(&mut self) -> Option<SseEvent> {
        let next = tokio::time::timeout(Duration::from_secs(10), self.events.next())
            .await
            .expect("an SSE event within 10 s")?;
        let event = next.expect("reading the event stream");
        Some(SseEvent {
            event: event.event,
            id: event.id,
            data: serde_json::from_str(&event.data).unwrap_or(Value::String(event.data)),
        })
    }

    /// Reads until the server ends the stream; returns the events sent before the end. Panics
    /// if the stream stays silent for 10 s without ending.
    pub async fn until_end(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next_event_or_end().await {
            events.push(event);
        }
        events
    }

    /// Collects `points` events until `count` points arrived; returns (steps, last event id).
    pub async fn collect_points(&mut self, count: usize) -> (Vec<i64>, Option<String>) {
        let mut steps = Vec::new();
        let mut last_id = None;
        while steps.len() < count {
            let event = self.next_event().await;
            if event.event == "points" {
                for p in event.data["points"].as_array().expect("points array") {
                    steps.push(p["step"].as_i64().expect("step"));
                }
                last_id = event.id;
            }
        }
        (steps, last_id)
    }
}

/// The Python that has the official `mlflow` client: `TRAINYARD_MLFLOW_PYTHON`, else the
/// virtual environment `scripts/mlflow-venv.sh` makes in `target/` (`scripts/test.sh` runs it).
pub fn mlflow_python() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("TRAINYARD_MLFLOW_PYTHON") {
        return std::path::PathBuf::from(p);
    }
    let python = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/mlflow-venv/bin/python");
    assert!(
        python.exists(),
        "the MLflow client is not installed: run scripts/mlflow-venv.sh (scripts/test.sh does), \
         or point TRAINYARD_MLFLOW_PYTHON at a Python that has `mlflow`"
    );
    python
}

/// The scenario the MLflow client runs (`--live` mode for the browser test).
pub fn mlflow_scenario() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mlflow/scenario.py")
}
