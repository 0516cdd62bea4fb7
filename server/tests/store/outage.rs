//! A Postgres outage on loopback: the test's database stops taking connections and the ones the
//! store holds are terminated, as when the server restarts or the database goes away. Requests
//! get a 503 with Retry-After (not a 500), `/healthz` says so, and the store serves again as
//! soon as the database is back, without a restart.

use sqlx::Connection;
use trainyard::store::{NewRun, StoreError};

use crate::harness::{app_over, call, TestDb};

async fn admin(base: &str, sql: &str) {
    let mut conn = sqlx::PgConnection::connect(base)
        .await
        .expect("admin connection");
    sqlx::query(sql).execute(&mut conn).await.expect(sql);
    let _ = conn.close().await;
}

async fn cut_off(base: &str, name: &str) {
    admin(
        base,
        &format!("ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false"),
    )
    .await;
    admin(
        base,
        &format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_outage_is_a_503_with_retry_after_until_the_database_is_back() {
    let db = TestDb::postgres().await;
    let (base, name) = db.postgres_admin().expect("a Postgres test database");
    let dir = tempfile::tempdir().expect("temp dir");
    let app = app_over(db.store.clone(), dir.path());
    let run = db
        .store
        .create_run(NewRun {
            experiment_id: "0".into(),
            name: Some("before".into()),
            ..Default::default()
        })
        .await
        .expect("run")
        .id;
    let (status, _, body) = call(&app, "GET", &format!("/api/v1/runs/{run}"), None).await;
    assert_eq!(status, 200, "{body}");

    cut_off(&base, &name).await;
    let err = db.store.get_run(&run).await.expect_err("no database");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let requests = [
        ("GET", format!("/api/v1/runs/{run}"), None),
        ("GET", "/api/v1/runs".to_string(), None),
        (
            "POST",
            format!("/api/v1/runs/{run}/metrics"),
            Some(serde_json::json!({"points": [{"key": "loss", "step": 0, "value": 1.0}]})),
        ),
        (
            "POST",
            "/api/v1/runs".to_string(),
            Some(serde_json::json!({"experiment": "0"})),
        ),
        ("GET", "/healthz".to_string(), None),
    ];
    for (method, path, body) in requests {
        let (status, retry_after, response) = call(&app, method, &path, body).await;
        assert_eq!(status, 503, "{method} {path}: {response}");
        assert_eq!(response["error"]["code"], "unavailable", "{response}");
        let message = response["error"]["message"].as_str().expect("message");
        assert!(message.contains("database"), "{message}");
        let seconds: u32 = retry_after
            .expect("Retry-After on a 503")
            .parse()
            .expect("Retry-After in seconds");
        assert!(seconds > 0);
    }

    admin(
        &base,
        &format!("ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true"),
    )
    .await;
    let (status, _, body) = call(&app, "GET", "/healthz", None).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(
        &app,
        "POST",
        &format!("/api/v1/runs/{run}/metrics"),
        Some(serde_json::json!({"points": [{"key": "loss", "step": 0, "value": 1.0}]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stored"], 1);
}
