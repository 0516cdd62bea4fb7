//! `trainyard user ...` on the server's database, then signing in to the server with it.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use reqwest::{Method, StatusCode};
use serde_json::json;

use super::{send, Auth};
use crate::helpers::TestApp;

fn user_cli(dir: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .arg("user")
        .args(args)
        .env("TRAINYARD_DATA_DIR", dir)
        .env_remove("DATABASE_URL")
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
    let added = user_cli(
        dir.path(),
        &["add", "alice", "--admin", "--password-stdin"],
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
