//! The real `trainyard serve` binary: flags from the environment, refusal to expose itself,
//! graceful exit on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn trainyard() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    for var in [
        "TRAINYARD_ADDR",
        "TRAINYARD_DATA_DIR",
        "DATABASE_URL",
        "TRAINYARD_ADMIN_TOKEN",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

#[test]
fn serve_refuses_a_public_address_from_the_environment_without_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = trainyard()
        .arg("serve")
        .env("TRAINYARD_ADDR", "0.0.0.0:0")
        .env("TRAINYARD_DATA_DIR", dir.path())
        .output()
        .expect("run trainyard");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0"),
        "{stderr}"
    );
    assert!(stderr.contains("TRAINYARD_ADMIN_TOKEN"), "{stderr}");
}

#[cfg(unix)]
#[test]
fn serve_uses_the_data_dir_from_the_environment_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("data");
    let mut child = trainyard()
        .arg("serve")
        .env("TRAINYARD_ADDR", "127.0.0.1:0")
        .env("TRAINYARD_DATA_DIR", &data_dir)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trainyard");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let listening = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|line| line.contains("listening"))
        .expect("a `listening` log line");
    assert!(listening.contains("127.0.0.1:"), "{listening}");
    assert!(
        data_dir.join("trainyard.db").exists(),
        "the SQLite file lives in the data dir"
    );

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "trainyard did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
}
