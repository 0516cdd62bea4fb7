//! `spawn_app()`: a real server on a random loopback port with a fresh database per test.

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use trainyard::app::{AppState, Settings};

use crate::kit::{self, ScratchDb};

pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub token: Option<String>,
    /// The server's state (its live hub and launcher), for what only the inside shows.
    pub state: AppState,
    _data_dir: tempfile::TempDir,
    /// This test's own Postgres database, dropped with the app.
    _pg_database: Option<ScratchDb>,
}

/// A server on SQLite in a fresh temporary directory.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Like `spawn_app`, with settings adjusted by `tweak` before the server starts.
pub async fn spawn_app_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let mut settings = kit::settings(data_dir.path());
    tweak(&mut settings);
    let token = settings.admin_token.clone();
    let spawned = kit::spawn(settings).await;
    TestApp {
        address: spawned.address,
        client: kit::client(),
        token,
        state: spawned.state,
        _data_dir: data_dir,
        _pg_database: None,
    }
}

/// A server on a brand-new Postgres database.
pub async fn spawn_pg_app() -> TestApp {
    spawn_pg_app_with(|_| {}).await
}

/// Like `spawn_pg_app`, with settings adjusted by `tweak` before the server starts.
pub async fn spawn_pg_app_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let db = ScratchDb::create("trainyard_api_test").await;
    let url = db.url.clone();
    let mut app = spawn_app_with(|s| {
        s.database_url = Some(url);
        tweak(s);
    })
    .await;
    app._pg_database = Some(db);
    app
}

impl TestApp {
    /// A test app around a server the test spawned itself (on a data directory it chose).
    pub fn from_spawned(spawned: kit::Spawned) -> TestApp {
        TestApp {
            address: spawned.address,
            client: kit::client(),
            token: None,
            state: spawned.state,
            _data_dir: tempfile::tempdir().expect("temp dir"),
            _pg_database: None,
        }
    }

    /// A fresh folder inside the server's data root, where launched runs may read: a user's
    /// project with its data.
    pub fn project_dir(&self) -> tempfile::TempDir {
        let root = self
            .state
            .launcher
            .roots()
            .paths()
            .first()
            .expect("the server has a data root")
            .clone();
        tempfile::tempdir_in(root).expect("a folder in the data root")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    fn authed(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    pub async fn get(&self, path: &str) -> Response {
        self.authed(self.client.get(self.url(path)))
            .send()
            .await
            .expect("GET")
    }

    /// GET with URL-encoded query parameters; asserts 200 and returns the JSON body.
    pub async fn get_query(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let response = self
            .authed(self.client.get(self.url(path)))
            .query(query)
            .send()
            .await
            .expect("GET");
        let status = response.status();
        let body: Value = response.json().await.expect("JSON body");
        assert_eq!(status, StatusCode::OK, "GET {path} {query:?}: {body}");
        body
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Response {
        self.authed(self.client.post(self.url(path)))
            .json(body)
            .send()
            .await
            .expect("POST")
    }

    pub async fn patch_json(&self, path: &str, body: &Value) -> Response {
        self.authed(self.client.patch(self.url(path)))
            .json(body)
            .send()
            .await
            .expect("PATCH")
    }

    /// Sends `body` verbatim as JSON (for malformed payloads).
    pub async fn send_raw(&self, method: reqwest::Method, path: &str, body: &str) -> Response {
        self.authed(self.client.request(method, self.url(path)))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("raw request")
    }

    /// Creates a run in `experiment` and returns its id.
    pub async fn create_run(&self, experiment: &str) -> String {
        self.create_run_with(json!({ "experiment": experiment }))
            .await["id"]
            .as_str()
            .expect("run id")
            .to_string()
    }

    pub async fn create_run_with(&self, body: Value) -> Value {
        let response = self.post_json("/api/v1/runs", &body).await;
        assert_eq!(response.status(), StatusCode::CREATED, "creating a run");
        response.json().await.expect("run JSON")
    }

    /// Posts `(key, step, value)` points and asserts they were accepted.
    pub async fn post_points(&self, run_id: &str, points: &[(&str, i64, f64)]) -> Value {
        let points: Vec<Value> = points
            .iter()
            .map(|(key, step, value)| json!({ "key": key, "step": step, "value": value }))
            .collect();
        let response = self
            .post_json(
                &format!("/api/v1/runs/{run_id}/metrics"),
                &json!({ "points": points }),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK, "posting points");
        response.json().await.expect("accepted JSON")
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let response = self.get(path).await;
        let status = response.status();
        let body: Value = response.json().await.expect("JSON body");
        assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
        body
    }

    /// Opens an SSE stream.
    pub async fn sse(&self, path: &str, last_event_id: Option<&str>) -> SseClient {
        let mut request = self
            .authed(self.client.get(self.url(path)))
            .header("accept", "text/event-stream")
            .timeout(Duration::from_secs(3600));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.expect("SSE request");
        assert_eq!(response.status(), StatusCode::OK, "opening {path}");
        SseClient::from_response(response)
    }
}

/// Asserts an error response's status, code and field; returns its `error` object.
pub async fn assert_error(
    response: Response,
    status: StatusCode,
    code: &str,
    field: Option<&str>,
) -> Value {
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.expect("error body is JSON");
    let error = body["error"].clone();
    assert_eq!(error["code"], code, "{body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    if let Some(field) = field {
        assert_eq!(error["field"], field, "{body}");
    }
    error
}

/// Event streams are read by the kit's `SseClient` (the API client's decoder).
pub use crate::kit::SseClient;

/// Generates one test per backend for each scenario `async fn name(app: &TestApp)`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn on_sqlite() {
                super::$name(&$crate::helpers::spawn_app().await).await
            }
            #[tokio::test]
            async fn on_postgres() {
                super::$name(&$crate::helpers::spawn_pg_app().await).await
            }
        }
    )*};
}

/// Like `on_both_backends!`, on servers whose settings `tweak` (a closure or function taking
/// `&mut Settings`) adjusts first.
#[macro_export]
macro_rules! on_both_backends_with {
    ($tweak:expr; $($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn on_sqlite() {
                let tweak = { use super::*; $tweak };
                super::$name(&$crate::helpers::spawn_app_with(tweak).await).await
            }
            #[tokio::test]
            async fn on_postgres() {
                let tweak = { use super::*; $tweak };
                super::$name(&$crate::helpers::spawn_pg_app_with(tweak).await).await
            }
        }
    )*};
}
