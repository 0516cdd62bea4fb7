//! `trainyard user ...` on the server's database, then signing in to the server with it.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use reqwest::{Method, StatusCode};
use serde_json::json;

use super::{send, Auth};
use crate::helpers::TestApp;

fn user_cli(dir: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut command = trainyard_user();
    command.env("TRAINYARD_DATA_DIR", dir);
    run(command, args, stdin)
}

/// `trainyard user` with none of the database settings from the test's own environment.
fn trainyard_user() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .arg("user")
        .env_remove("TRAINYARD_DATA_DIR")
        .env_remove("DATABASE_URL");
    command
}

fn run(mut command: Command, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run trainyard user");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write stdin");
    }
    child.wait_with_output().expect("output")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn sign_in_status(app: &TestApp, name: &str, password: &str) -> StatusCode {
    let body = json!({"name": name, "password": password});
    send(
        app,
        &Auth::Nobody,
        Method::POST,
        "/api/v1/session",
        Some(&body),
    )
    .await
    .status()
}

#[tokio::test]
async fn users_added_on_the_command_line_sign_in_and_are_managed_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A new server: the first command creates its database, as asked.
    let added = user_cli(
        dir.path(),
        &[
            "add",
            "alice",
            "--admin",
            "--password-stdin",
            "--create-database",
        ],
        Some("a long password\n"),
    );
    assert!(added.status.success(), "{added:?}");
    assert!(!stdout(&added).contains("a long password"));

    let again = user_cli(
        dir.path(),
        &["add", "alice", "--password-stdin"],
        Some("another password\n"),
    );
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("user `alice` already exists"), "{err}");

    let short = user_cli(
        dir.path(),
        &["add", "bob", "--password-stdin"],
        Some("short\n"),
    );
    assert!(!short.status.success());
    assert!(String::from_utf8_lossy(&short.stderr).contains("at least 8 characters"));

    let listed = stdout(&user_cli(dir.path(), &["list"], None));
    assert!(listed.contains("alice\tadministrator"), "{listed}");
    // The first administrator of every database, without a password until one is set.
    assert!(
        listed.contains("admin\tadministrator, no password"),
        "{listed}"
    );

    let mut settings = crate::kit::settings(dir.path());
    settings.auth = true;
    let spawned = crate::kit::spawn(settings).await;
    let app = TestApp::from_spawned(spawned);
    assert_eq!(
        sign_in_status(&app, "alice", "a long password").await,
        StatusCode::OK
    );

    assert!(user_cli(dir.path(), &["disable", "alice"], None)
        .status
        .success());
    assert_eq!(
        sign_in_status(&app, "alice", "a long password").await,
        StatusCode::UNAUTHORIZED
    );
    assert!(user_cli(dir.path(), &["enable", "alice"], None)
        .status
        .success());
    let reset = user_cli(dir.path(), &["reset-password", "alice"], None);
    assert!(reset.status.success());
    let generated = stdout(&reset)
        .lines()
        .find_map(|l| l.strip_prefix("password: ").map(str::to_owned))
        .expect("a generated password");
    assert_eq!(
        sign_in_status(&app, "alice", "a long password").await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        sign_in_status(&app, "alice", &generated).await,
        StatusCode::OK
    );

    let missing = user_cli(dir.path(), &["disable", "nobody"], None);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no user named `nobody`"));
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn user_run_outside_the_servers_directory_refuses_and_creates_nothing() {
    let elsewhere = tempfile::tempdir().expect("tempdir");
    // No --data-dir and no TRAINYARD_DATA_DIR: `serve`'s default, ./trainyard-data, which is
    // not here.
    for args in [
        &["add", "alice", "--admin"][..],
        &["list"][..],
        &["reset-password", "admin"][..],
    ] {
        let mut command = trainyard_user();
        command.current_dir(elsewhere.path());
        let out = run(command, args, None);
        assert!(!out.status.success(), "{args:?}: {out:?}");
        let err = stderr(&out);
        assert!(err.contains("no Trainyard database at"), "{err}");
        assert!(err.contains("trainyard-data/trainyard.db"), "{err}");
        assert!(err.contains("--data-dir"), "{err}");
        assert!(!stdout(&out).contains("added"), "{out:?}");
    }
    let left: Vec<_> = std::fs::read_dir(elsewhere.path())
        .expect("read dir")
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // --data-dir naming a folder without the database: refused, naming the file.
    let empty = elsewhere.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let out = run(
        trainyard_user(),
        &["list", "--data-dir", empty.to_str().expect("utf-8")],
        None,
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&empty.join("trainyard.db").display().to_string()),
        "{out:?}"
    );
    assert!(!empty.join("trainyard.db").exists());
}

#[test]
fn user_refuses_a_sqlite_file_without_trainyards_tables_and_leaves_it_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("trainyard.db");
    std::fs::write(&file, b"").expect("an empty file");
    let out = user_cli(dir.path(), &["add", "alice", "--admin"], None);
    assert!(!out.status.success(), "{out:?}");
    let err = stderr(&out);
    assert!(err.contains("is not a Trainyard database"), "{err}");
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert_eq!(std::fs::metadata(&file).expect("file").len(), 0);

    let url = format!("sqlite://{}", file.display());
    let mut command = trainyard_user();
    command.env("DATABASE_URL", &url);
    let out = run(command, &["list"], None);
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("is not a Trainyard database"));
}

#[tokio::test]
async fn user_refuses_a_postgres_database_without_trainyards_tables_then_uses_the_servers() {
    let db = crate::kit::ScratchDb::create("trainyard_user_cli").await;
    let url = db.url.clone();
    let cli = |args: &[&str], stdin: Option<&str>| {
        let mut command = trainyard_user();
        command.env("DATABASE_URL", &url);
        run(command, args, stdin)
    };
    let out = cli(&["add", "alice", "--admin"], None);
    assert!(!out.status.success(), "{out:?}");
    let err = stderr(&out);
    assert!(err.contains("no Trainyard tables in the database"), "{err}");
    assert!(err.contains(&db.name), "{err}");
    if let Some(password) = reqwest::Url::parse(&url)
        .ok()
        .and_then(|u| u.password().map(str::to_owned))
    {
        assert!(!err.contains(&format!(":{password}@")), "{err}");
    }
    // Nothing was created: the database still has no tables.
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .expect("connect");
    let tables: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()",
    )
    .fetch_one(&mut conn)
    .await
    .expect("count");
    assert_eq!(tables, 0);

    // Once the server has made it a Trainyard database, the same command works on it.
    let data_dir = tempfile::tempdir().expect("tempdir");
    let mut settings = crate::kit::settings(data_dir.path());
    settings.auth = true;
    settings.database_url = Some(url.clone());
    let app = TestApp::from_spawned(crate::kit::spawn(settings).await);
    let out = cli(
        &["add", "alice", "--password-stdin"],
        Some("a long password\n"),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sign_in_status(&app, "alice", "a long password").await,
        StatusCode::OK
    );
}
