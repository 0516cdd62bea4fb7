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
