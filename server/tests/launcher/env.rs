//! What a launched run's process sees of the server's environment: a real `trainyard serve`
//! started with a database URL, a token and an unrelated secret in its environment launches a
//! command that prints its own environment into its log.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

/// Launches `env` on a server started with `server_env`, optionally presenting `token`, and
/// returns the run's id and its log once the command has exited.
async fn printed_environment(
    data: &Path,
    server_env: &[(&str, &str)],
    token: Option<&str>,
) -> (String, String) {
    let mut server = spawn_serve_with_env(data, 0, server_env).await;
    let mut request = client()
        .post(format!("{}/api/v1/runs", server.address))
        .json(&json!({"launch": true, "command": "env"}));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("launch");
    assert_eq!(response.status(), StatusCode::CREATED);
    let run: Value = response.json().await.expect("run");
    let id = run["id"].as_str().expect("id").to_string();
    let dir = data.join("runs").join(&id);
    // The wrapper writes `exit_code` once the command is done (no polling through the API,
    // which may want a token).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join("exit_code").exists() {
        assert!(
            Instant::now() < deadline,
            "the command never finished; the server's log:\n{}",
            serve_log(data)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = std::fs::read_to_string(dir.join("output.log")).expect("output.log");
    server.child.kill().expect("kill server");
    server.child.wait().expect("reap server");
    (id, log)
}

fn has_variable(log: &str, name: &str) -> bool {
    log.lines().any(|l| l.starts_with(&format!("{name}=")))
}

async fn assert_no_server_secrets_reach_the_run(data: &Path, database_url: &str) {
    let server_env = [
        ("DATABASE_URL", database_url),
        ("TRAINYARD_TOKEN", "a-client-token-of-the-operator"),
        ("AWS_SECRET_ACCESS_KEY", "not-for-runs"),
        ("RUST_LOG", "info"),
        ("TRAINYARD_CPU_THREADS", "999"),
    ];
    let (id, log) = printed_environment(data, &server_env, None).await;
    // A CPU run gets its share of the cores: the server runs two CPU slots.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = format!("TRAINYARD_CPU_THREADS={}", (cores / 2).max(1));
    assert!(log.lines().any(|l| l == share), "{share} missing:\n{log}");
    for name in ["DATABASE_URL", "TRAINYARD_TOKEN", "AWS_SECRET_ACCESS_KEY"] {
        assert!(!has_variable(&log, name), "{name} reached the run:\n{log}");
    }
    assert!(!log.contains(database_url), "{log}");
    assert!(!log.contains("not-for-runs"), "{log}");
    assert!(log.contains(&format!("TRAINYARD_RUN_ID={id}")), "{log}");
    for name in [
        "PATH",
        "TRAINYARD_SERVER_URL",
        "TRAINYARD_RUN_DIR",
        "RUST_LOG",
    ] {
        assert!(has_variable(&log, name), "{name} is missing:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launched_command_sees_neither_the_database_url_nor_other_secrets_on_sqlite() {
    let data = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        data.path().join("elsewhere.db").display()
    );
    assert_no_server_secrets_reach_the_run(data.path(), &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launched_command_sees_neither_the_database_url_nor_other_secrets_on_postgres() {
    let base = std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
    let name = format!("trainyard_env_test_{}", uuid::Uuid::new_v4().simple());
    let pool = sqlx::PgPool::connect(&base)
        .await
        .unwrap_or_else(|e| panic!("Postgres at {base} is required for this test: {e}"));
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&pool)
        .await
        .expect("create test database");
    let (prefix, _) = base.rsplit_once('/').expect("database URL has a path");
    // A URL with a password, as a production one has (trust authentication ignores it).
    let (scheme, rest) = prefix.split_once("://").expect("scheme");
    let with_password = match rest.split_once('@') {
        Some((user, host)) if !user.contains(':') => {
            format!("{scheme}://{user}:db-password-42@{host}")
        }
        _ => prefix.to_string(),
    };
    let url = format!("{with_password}/{name}");
    let data = tempfile::tempdir().unwrap();
    assert_no_server_secrets_reach_the_run(data.path(), &url).await;
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(&pool)
        .await;
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_a_server_with_a_token_gets_a_token_of_its_own_to_report_back() {
    let data = tempfile::tempdir().unwrap();
    let server_env = [("TRAINYARD_ADMIN_TOKEN", "admin-s3cret")];
    let (_, log) = printed_environment(data.path(), &server_env, Some("admin-s3cret")).await;
    assert!(!has_variable(&log, "TRAINYARD_ADMIN_TOKEN"), "{log}");
    assert!(!has_variable(&log, "DATABASE_URL"), "{log}");
    // The run must authenticate its reports to this server: it gets a token of its own for
    // that (which can only report this run), never the admin token.
    assert!(!log.contains("admin-s3cret"), "{log}");
    let token = log
        .lines()
        .find_map(|l| l.strip_prefix("TRAINYARD_TOKEN="))
        .unwrap_or_else(|| panic!("no TRAINYARD_TOKEN: {log}"));
    assert!(token.starts_with("ty_") && token.len() > 40, "{token}");
}
