//! Fresh databases for each test: a temp SQLite file, or a new Postgres database that is
//! dropped afterwards (even when the test panics).

use sqlx::Connection;
use trainyard::store::{self, DynStore};

const DEFAULT_PG: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub struct TestDb {
    pub store: DynStore,
    _dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

fn pg_base() -> String {
    std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG.to_string())
}

/// `base` with its database name replaced.
fn with_database(base: &str, name: &str) -> String {
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
        let base = pg_base();
        let mut admin = sqlx::PgConnection::connect(&base)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "Postgres is required for the store tests but `{base}` is unreachable: {e}. \
                 Start Postgres or set TEST_DATABASE_URL."
                )
            });
        let name = format!("trainyard_test_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create test database");
        let _ = admin.close().await;
        let url = with_database(&base, &name);
        let store = store::connect(&url).await.expect("open Postgres store");
        assert_eq!(store.backend(), "postgres");
        TestDb {
            store,
            _dir: None,
            pg: Some((base, name)),
        }
    }
}

impl TestDb {
    /// The Postgres server's admin URL and this test's database name (`None` on SQLite).
    pub fn postgres_admin(&self) -> Option<(String, String)> {
        self.pg.clone()
    }

    /// The URL of this test's own Postgres database (`None` on SQLite).
    pub fn postgres_url(&self) -> Option<String> {
        self.pg
            .as_ref()
            .map(|(base, name)| with_database(base, name))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some((base, name)) = self.pg.take() else {
            return;
        };
        // Drop runs outside async context: use a small runtime on its own thread.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                if let Ok(mut admin) = sqlx::PgConnection::connect(&base).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut admin)
                        .await;
                }
            });
        })
        .join();
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
