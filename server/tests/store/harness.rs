//! Fresh databases for each test: a temp SQLite file, or a new Postgres database that is
//! dropped afterwards (even when the test panics).

use crate::kit::ScratchDb;
use trainyard::store::{self, DynStore};

pub struct TestDb {
    pub store: DynStore,
    _dir: Option<tempfile::TempDir>,
    pg: Option<ScratchDb>,
}

impl TestDb {
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        // A nested directory that does not exist yet: connect must create it.
        let path = dir.path().join("data").join("store.db");
        let url = format!("sqlite://{}", path.display());
        let store = store::connect(&url).await.expect("open SQLite store");
        assert_eq!(store.backend(), "sqlite");
        TestDb {
            store,
            _dir: Some(dir),
            pg: None,
        }
    }

    pub async fn postgres() -> TestDb {
        let db = ScratchDb::create("trainyard_test").await;
        let store = store::connect(&db.url).await.expect("open Postgres store");
        assert_eq!(store.backend(), "postgres");
        TestDb {
            store,
            _dir: None,
            pg: Some(db),
        }
    }
}

impl TestDb {
    /// The Postgres server's admin URL and this test's database name (`None` on SQLite).
    pub fn postgres_admin(&self) -> Option<(String, String)> {
        self.pg
            .as_ref()
            .map(|db| (db.base.clone(), db.name.clone()))
    }

    /// The URL of this test's own Postgres database (`None` on SQLite).
    pub fn postgres_url(&self) -> Option<String> {
        self.pg.as_ref().map(|db| db.url.clone())
    }
}

/// The whole HTTP application over `store` (launcher idle), for requests through `call`.
pub fn app_over(store: DynStore, data_dir: &std::path::Path) -> axum::Router {
    let settings = trainyard::app::Settings::new("127.0.0.1:0".parse().expect("addr"), data_dir);
    trainyard::app::app(trainyard::app::AppState::new(store, settings))
}

/// One request through the whole HTTP stack; returns the status, Retry-After and JSON body.
pub async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, Option<String>, serde_json::Value) {
    use tower::ServiceExt;
    let request = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        ))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("response");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().expect("ascii").to_string());
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, retry_after, json)
}
