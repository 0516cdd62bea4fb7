//! The typed API client (`trainyard::client`) that `trainyard submit` and `trainyard sweep`
//! speak with: its requests are what the server's own types accept, its replies what the
//! server's types send, and a followed log keeps a character the network split in two whole.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use trainyard::client::{
    Command, CreateRun, LogEvent, Resources, ResumeFrom, ResumeRun, StopOutcome, StopReply,
    SubmitSweep,
};
use trainyard::store::{Run, RunStatus};

use crate::helpers::*;

/// Every field the client can send, each set, read by the server's own request type (which
/// refuses unknown fields): a field renamed on either side fails here.
#[test]
fn the_server_reads_every_field_of_the_clients_launch_request() {
    let sent = CreateRun {
        experiment: Some("e".into()),
        name: Some("n".into()),
        config: Some(Value::String("model: {}".into())),
        tags: BTreeMap::from([("k".to_string(), "v".to_string())]),
        launch: true,
        profile: Some("tiny".into()),
        overrides: BTreeMap::from([("training.max_steps".to_string(), json!("5"))]),
        resources: Some(Resources { gpus: 2 }),
        max_restarts: Some(3),
        command: Some(Command::Argv(vec!["echo".into(), "hi".into()])),
        working_dir: Some("/w".into()),
    };
    let read: trainyard::http::api::runs::CreateRun =
        serde_json::from_value(serde_json::to_value(&sent).unwrap()).unwrap();
    assert_eq!(read.experiment.as_deref(), Some("e"));
    assert_eq!(read.name.as_deref(), Some("n"));
    assert_eq!(read.config, sent.config);
    assert_eq!(read.tags, sent.tags);
    assert!(read.launch);
    assert_eq!(read.profile.as_deref(), Some("tiny"));
    assert_eq!(read.overrides, sent.overrides);
    assert_eq!(read.resources.map(|r| r.gpus), Some(2));
    assert_eq!(read.max_restarts, Some(3));
    assert!(matches!(
        read.command,
        Some(trainyard::actions::CommandSpec::Argv(argv)) if argv == ["echo", "hi"]
    ));
    assert_eq!(read.working_dir.as_deref(), Some("/w"));
    // A shell line is a string.
    let shell = serde_json::to_value(Command::Shell("echo hi".into())).unwrap();
    assert_eq!(shell, json!("echo hi"));
}

#[test]
fn the_server_reads_the_clients_resume_and_sweep_requests() {
    use trainyard::checkpoints::ResumePoint;
    use trainyard::http::api::checkpoints::ResumeRequest;
    for (from, point) in [
        (ResumeFrom::Latest, ResumePoint::Latest),
        (ResumeFrom::Best, ResumePoint::Best),
        (ResumeFrom::Step(300), ResumePoint::Step(300)),
    ] {
        let sent = ResumeRun {
            from,
            resources: Some(Resources { gpus: 1 }),
        };
        let read: ResumeRequest =
            serde_json::from_value(serde_json::to_value(&sent).unwrap()).unwrap();
        assert_eq!(read.resources.as_ref().map(|r| r.gpus), Some(1));
        assert_eq!(read.point().unwrap(), point);
    }
    let sent = SubmitSweep {
        spec: json!({"name": "s"}),
    };
    let read: trainyard::http::api::sweeps::SubmitSweep =
        serde_json::from_value(serde_json::to_value(&sent).unwrap()).unwrap();
    assert_eq!(read.spec, sent.spec);
}

#[test]
fn the_client_reads_the_servers_stop_reply() {
    let sent = trainyard::http::api::launch::StopResponse {
        id: "r1".into(),
        status: trainyard::launcher::StopOutcome::Stopping,
    };
    let read: StopReply = serde_json::from_value(serde_json::to_value(&sent).unwrap()).unwrap();
    assert_eq!(
        read,
        StopReply {
            id: "r1".into(),
            status: StopOutcome::Stopping
        }
    );
}

#[test]
fn the_client_and_the_trainer_read_the_servers_error_body() {
    use trainyard::http::error::{ErrorBody, ErrorDetail};
    let sent = ErrorBody {
        error: ErrorDetail {
            code: "invalid_field",
            message: "must be positive".into(),
            field: Some("training.max_steps".into()),
        },
    };
    let read: trainer::wire::ErrorReply =
        serde_json::from_value(serde_json::to_value(&sent).unwrap()).unwrap();
    assert_eq!(
        read.error,
        trainyard::client::Refusal {
            code: "invalid_field".into(),
            message: "must be positive".into(),
            field: Some("training.max_steps".into()),
        }
    );
    let without_field = ErrorBody {
        error: ErrorDetail {
            code: "not_found",
            message: "no such run".into(),
            field: None,
        },
    };
    let read: trainer::wire::ErrorReply =
        serde_json::from_value(serde_json::to_value(&without_field).unwrap()).unwrap();
    assert_eq!(read.error.field, None);
}

/// The typed client launches, follows and stops a run on a real server.
#[tokio::test]
async fn the_typed_client_launches_follows_the_output_of_and_stops_a_run() {
    let app = spawn_app(&[], 1).await;
    let client = app.typed();
    let launch = |command: &str| CreateRun {
        launch: true,
        command: Some(Command::Shell(command.into())),
        ..CreateRun::default()
    };
    let run = client
        .create_run(&launch(
            "printf 'h\\303\\251llo \\342\\234\\223 \\346\\227\\245\\346\\234\\254\\n'",
        ))
        .await
        .unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    let mut events = client.follow_logs(&run.id).await.unwrap();
    let mut output = String::new();
    let end = loop {
        match events.next().await.expect("an end event").unwrap() {
            LogEvent::Output(chunk) => output.push_str(&chunk.text),
            LogEvent::End(end) => break end,
        }
    };
    assert_eq!(output, "héllo ✓ 日本\n");
    assert_eq!(end.status(), Some(RunStatus::Finished));
    assert_eq!(
        client.get_run(&run.id).await.unwrap().status,
        RunStatus::Finished
    );

    let sleeper = client.create_run(&launch("exec sleep 60")).await.unwrap();
    app.wait_for(&sleeper.id, Duration::from_secs(30), |r| {
        r["status"] == "running"
    })
    .await;
    let stopped = client.stop_run(&sleeper.id).await.unwrap();
    assert_eq!(stopped.status, StopOutcome::Stopping);
    app.wait_terminal(&sleeper.id).await;
    let refused = client.stop_run(&sleeper.id).await.unwrap_err();
    let (status, refusal) = refused.refusal().expect("a refusal");
    assert_eq!(status, reqwest::StatusCode::CONFLICT, "{refused}");
    assert!(!refusal.message.is_empty());
    let missing = client.get_run("0123456789abcdef0123456789abcdef").await;
    let missing = missing.unwrap_err();
    assert_eq!(
        missing.refusal().map(|(s, _)| s),
        Some(reqwest::StatusCode::NOT_FOUND),
        "{missing}"
    );
}

/// The output a stand-in server sends, cut inside `é`, `✓` and `日`.
const SPLIT_EVENT: [&[u8]; 4] = [
    b"event: log\ndata: {\"offset\":0,\"text\":\"h\xc3",
    b"\xa9llo \xe2\x9c",
    b"\x93 \xe6",
    b"\x97\xa5\xe6\x9c\xac\\n\"}\n\n",
];

/// Reads one request's head (and its body, as long as its `content-length`); its request line.
async fn read_request(stream: &mut BufReader<TcpStream>) -> String {
    let mut request_line = String::new();
    stream.read_line(&mut request_line).await.unwrap();
    let mut length = 0;
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).await.unwrap();
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.unwrap();
    request_line
}

/// A server that answers `submit --follow` as a real one would, except that it writes the log
/// event in pieces that cut characters in two, each piece a read of its own for the client.
async fn split_character_server(run: Run) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            stream.set_nodelay(true).unwrap();
            let run = run.clone();
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                let request = read_request(&mut stream).await;
                let stream = stream.get_mut();
                if request.contains("/logs?follow=true") {
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                                connection: close\r\n\r\n";
                    stream.write_all(head.as_bytes()).await.unwrap();
                    for piece in SPLIT_EVENT {
                        stream.write_all(piece).await.unwrap();
                        stream.flush().await.unwrap();
                        // The client is waiting for more: the next piece is its next read.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    let end = b"event: end\ndata: {\"status\":\"finished\"}\n\n";
                    stream.write_all(end).await.unwrap();
                } else {
                    let status = if request.starts_with("POST") {
                        "201 Created"
                    } else {
                        "200 OK"
                    };
                    let body = serde_json::to_string(&run).unwrap();
                    let reply = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    stream.write_all(reply.as_bytes()).await.unwrap();
                }
                stream.shutdown().await.unwrap();
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_follow_prints_a_character_that_arrives_split_across_two_reads_whole() {
    let run = Run {
        id: "0123456789abcdef0123456789abcdef".into(),
        name: "split".into(),
        experiment_id: "0".into(),
        status: RunStatus::Queued,
        created_at: 0,
        started_at: None,
        ended_at: None,
        config: None,
        params: BTreeMap::new(),
        tags: BTreeMap::new(),
        notes: String::new(),
        exit: None,
        latest_metrics: BTreeMap::new(),
        created_by: None,
        deleted_at: None,
    };
    let address = split_character_server(run).await;
    let output = tokio::process::Command::new(TRAINYARD)
        .args([
            "submit",
            "--server",
            &address,
            "--profile",
            "tiny",
            "--follow",
        ])
        .env_remove("TRAINYARD_TOKEN")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8(output.stdout).expect("stdout is UTF-8");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(
        stdout, "run 0123456789abcdef0123456789abcdef queued\nhéllo ✓ 日本\n",
        "{stderr}"
    );
    // Where to watch it, on stderr.
    assert!(
        stderr.contains(&format!(
            "page: {}/runs/0123456789abcdef0123456789abcdef",
            address.trim_end_matches('/')
        )),
        "{stderr}"
    );
}
