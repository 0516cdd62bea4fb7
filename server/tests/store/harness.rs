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
    /// The URL of this test's own Postgres database (`None` on SQLite).
    pub fn postgres_url(&self) -> Option<String> {
        self.pg.as_ref().map(|db| db.url.clone())
    }
}
