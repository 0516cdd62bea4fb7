//! What a launched run can touch: a real `trainyard serve` with a secret in its environment
//! launches a command that tries to read the database file, another run's files, the server's
//! own `/proc` entry and the machine's host name, and to reach a port that is not the server's.
//! Each attempt fails with a plain error in the run's log, and nothing leaks; what a run needs
//! (its own directory, the system's programs, the server's port) still works. The server keeps
//! no secret in its own environment block either.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

const ADMIN_TOKEN: &str = "admin-token-never-in-proc";
const OTHER_SECRET: &str = "another-secret-of-the-operator";
const RUN_SECRET: &str = "private-notes-of-another-run";

/// Waits until the run's wrapper has written its exit code, and returns its log.
async fn log_when_done(data: &Path, id: &str) -> String {
    let dir = data.join("runs").join(id);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join("exit_code").exists() {
        assert!(
            Instant::now() < deadline,
            "the command never finished; the server's log:\n{}",
            serve_log(data)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::read_to_string(dir.join("output.log")).expect("output.log")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launched_run_cannot_read_the_database_another_run_or_the_servers_environment() {
    let data = tempfile::tempdir().unwrap();
    let mut server = spawn_serve_with_env(
        data.path(),
        0,
        &[
            ("TRAINYARD_ADMIN_TOKEN", ADMIN_TOKEN),
            ("UNRELATED_SECRET", OTHER_SECRET),
        ],
    )
    .await;
    let pid = server.child.id();
    let api = |path: &str| format!("{}{path}", server.address);
    let health: Value = client()
        .get(api("/healthz"))
        .send()
        .await
        .expect("healthz")
        .json()
        .await
        .expect("json");
    assert_eq!(health["runs_confined"], true, "{health}");

    // The server read its token and erased it from its environment block; what it did not
    // read stays there, which the confinement must then keep from runs.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("server environ");
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        !environ.contains(ADMIN_TOKEN),
        "the token is still in /proc/{pid}/environ"
    );
    assert!(environ.contains(OTHER_SECRET));

    // Another run's private file.
    let response = client()
        .post(api("/api/v1/runs"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"experiment": "private"}))
        .send()
        .await
        .expect("create run");
    assert_eq!(response.status(), StatusCode::CREATED);
    let other: Value = response.json().await.expect("run");
    let other_dir = data
        .path()
        .join("runs")
        .join(other["id"].as_str().expect("id"));
    std::fs::create_dir_all(other_dir.join("artifacts")).unwrap();
    let secret_file = other_dir.join("artifacts/notes.txt");
    std::fs::write(&secret_file, RUN_SECRET).unwrap();
    let database = data.path().join("trainyard.db");
    assert!(database.exists());
    // A port that is not the server's.
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let elsewhere_port = elsewhere.local_addr().unwrap().port();

    let command = format!(
        r#"for f in '{db}' '{secret}' /proc/{pid}/environ /etc/hostname; do
  cat "$f" > /dev/null && echo "READ $f" || echo "DENIED $f"
done
ls '{other}' > /dev/null && echo "LISTED other run" || echo "DENIED other run"
echo mine > own.txt && echo "WROTE own directory"
echo tmp > "$TMPDIR/t" && echo "WROTE its TMPDIR"
ls /usr/bin > /dev/null && echo "READ /usr"
# The system's Python: a shim under a home directory (pyenv) is out of a confined run's reach.
connect() {{ /usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), timeout=5)"; }}
connect {elsewhere_port} && echo "CONNECTED elsewhere" || echo "DENIED elsewhere"
connect {server_port} && echo "CONNECTED server""#,
        db = database.display(),
        secret = secret_file.display(),
        other = other_dir.display(),
        server_port = server.port,
    );
    let response = client()
        .post(api("/api/v1/runs"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"launch": true, "command": command}))
        .send()
        .await
        .expect("launch");
    assert_eq!(response.status(), StatusCode::CREATED);
    let run: Value = response.json().await.expect("run");
    let id = run["id"].as_str().expect("id").to_string();
    let log = log_when_done(data.path(), &id).await;
    server.child.kill().expect("kill server");
    server.child.wait().expect("reap server");

    for denied in [
        format!("DENIED {}", database.display()),
        format!("DENIED {}", secret_file.display()),
        format!("DENIED /proc/{pid}/environ"),
        "DENIED /etc/hostname".to_string(),
        "DENIED other run".to_string(),
        "DENIED elsewhere".to_string(),
    ] {
        assert!(log.lines().any(|l| l == denied), "{denied} missing:\n{log}");
    }
    // The run's log says why, in the words of the programs that were refused.
    assert!(log.contains("Permission denied"), "{log}");
    for allowed in [
        "WROTE own directory",
        "WROTE its TMPDIR",
        "READ /usr",
        "CONNECTED server",
    ] {
        assert!(
            log.lines().any(|l| l == allowed),
            "{allowed} missing:\n{log}"
        );
    }
    for leaked in [RUN_SECRET, OTHER_SECRET, ADMIN_TOKEN] {
        assert!(
            !log.contains(leaked),
            "{leaked} leaked into the log:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_given_its_admin_token_as_a_file_accepts_it_and_holds_it_in_no_process_block() {
    let data = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("admin-token");
    std::fs::write(&file, format!("{ADMIN_TOKEN}\n")).unwrap();
    let file_text = file.display().to_string();
    let mut server = spawn_serve_with_env(
        data.path(),
        0,
        &[("TRAINYARD_ADMIN_TOKEN_FILE", &file_text)],
    )
    .await;
    let pid = server.child.id();
    let runs = format!("{}/api/v1/runs", server.address);
    let with_token = client()
        .get(&runs)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("request");
    let without = client().get(&runs).send().await.expect("request");
    for block in ["environ", "cmdline"] {
        let bytes = std::fs::read(format!("/proc/{pid}/{block}")).expect("proc block");
        assert!(
            !String::from_utf8_lossy(&bytes).contains(ADMIN_TOKEN),
            "{block}"
        );
    }
    server.child.kill().expect("kill server");
    server.child.wait().expect("reap server");
    assert_eq!(with_token.status(), StatusCode::OK);
    assert_eq!(without.status(), StatusCode::UNAUTHORIZED);
}
