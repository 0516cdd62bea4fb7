//! An existing single-user database upgrades in place: its runs and experiments belong to the
//! first administrator the migration creates. And sessions end when idle or too old.

use std::path::Path;

use reqwest::{Method, StatusCode};
use sqlx::migrate::Migrator;
use sqlx::Connection;

use super::{accounts, add_user, send, Auth, PASSWORD};
use crate::helpers::TestApp;
use crate::kit::ScratchDb;

/// The migrations of `backend` from before accounts existed, in a directory of their own.
fn migrations_before_accounts(backend: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(backend);
    for entry in std::fs::read_dir(&source).expect("migrations") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if name.as_str() < "20261210000000" {
            std::fs::copy(&path, dir.path().join(&name)).expect("copy");
        }
    }
    dir
}

const OLD_RUN: &str = "INSERT INTO runs (id, experiment_id, name, status, created_at) \
     VALUES ('0123456789abcdef0123456789abcdef', '0', 'old-run', 'finished', 1)";

async fn old_sqlite_database_with_a_run(url: &str) {
    let dir = migrations_before_accounts("sqlite");
    let migrator = Migrator::new(dir.path()).await.expect("migrator");
    let mut conn = sqlx::SqliteConnection::connect(url).await.expect("connect");
    migrator.run(&mut conn).await.expect("old migrations");
    sqlx::query(OLD_RUN)
        .execute(&mut conn)
        .await
        .expect("old run");
}

async fn old_postgres_database_with_a_run(url: &str) {
    let dir = migrations_before_accounts("postgres");
    let migrator = Migrator::new(dir.path()).await.expect("migrator");
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    migrator.run(&mut conn).await.expect("old migrations");
    sqlx::query(OLD_RUN)
        .execute(&mut conn)
        .await
        .expect("old run");
}

async fn upgraded_runs_belong_to_the_first_admin(url: &str) {
    let store = trainyard::store::connect(url).await.expect("upgrade");
    let run = store
        .get_run("0123456789abcdef0123456789abcdef")
        .await
        .expect("run");
    assert_eq!(run.created_by.as_deref(), Some("admin"));
    let sharing = store.experiment_sharing("0").await.expect("sharing");
    assert_eq!(sharing.owner.as_deref(), Some("admin"));
    let admin = store
        .user_by_name("admin")
        .await
        .expect("users")
        .expect("admin");
    assert!(admin.is_admin && !admin.has_password);
}

#[tokio::test]
async fn a_sqlite_database_from_before_accounts_upgrades_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("old.db").display());
    old_sqlite_database_with_a_run(&url).await;
    upgraded_runs_belong_to_the_first_admin(&url).await;
}

#[tokio::test]
async fn a_postgres_database_from_before_accounts_upgrades_in_place() {
    let db = ScratchDb::create("trainyard_upgrade_test").await;
    old_postgres_database_with_a_run(&db.url).await;
    upgraded_runs_belong_to_the_first_admin(&db.url).await;
}

async fn idle_and_expired_sessions_no_longer_sign_anyone_in(app: &TestApp) {
    use trainyard::access::secret::{hash_secret, new_secret};
    use trainyard::store::accounts::SessionNew;
    add_user(app, "alice", false).await;
    let alice = app
        .state
        .store
        .user_by_name("alice")
        .await
        .expect("store")
        .expect("alice");
    let now = trainyard::store::now_ms();
    let hour = 3_600_000;
    let cases = [
        ("fresh", now, now + hour, StatusCode::OK),
        // Default idle limit: 12 hours without a request.
        (
            "idle",
            now - 13 * hour,
            now + hour,
            StatusCode::UNAUTHORIZED,
        ),
        (
            "past its absolute expiry",
            now - 60_000,
            now - 1,
            StatusCode::UNAUTHORIZED,
        ),
    ];
    for (label, last_seen, expires_at, want) in cases {
        let secret = new_secret();
        app.state
            .store
            .create_session(SessionNew {
                id_hash: hash_secret(&secret),
                user_id: alice.id.clone(),
                csrf_hash: hash_secret(&trainyard::access::secret::session_csrf_token(&secret)),
                now: last_seen,
                expires_at,
                client: None,
            })
            .await
            .expect("session");
        let auth = Auth::Session {
            cookie: format!("trainyard_session={secret}"),
            csrf: String::new(),
        };
        let got = send(app, &auth, Method::GET, "/api/v1/runs", None)
            .await
            .status();
        assert_eq!(got, want, "{label} session");
    }
    // A real sign-in still works after all that.
    super::sign_in(app, "alice", PASSWORD).await;
}

crate::on_both_backends_with!(accounts;
    idle_and_expired_sessions_no_longer_sign_anyone_in,
);
