//! One client cannot exhaust the server's connections: each address holds at most its share of
//! them (the rest are answered 429 and closed at once), and a request body has a total deadline,
//! so a body trickled a byte at a time is cut off however short each pause.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::helpers::{spawn_app_with, TestApp};

const HOUR: Duration = Duration::from_secs(3600);

fn server_addr(app: &TestApp) -> SocketAddr {
    app.address
        .trim_start_matches("http://")
        .parse()
        .expect("server address")
}

/// A connection from `from` (any 127.x.y.z address is this machine).
async fn connect_from(app: &TestApp, from: Ipv4Addr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(IpAddr::V4(from), 0))
        .expect("bind a loopback address");
    socket.connect(server_addr(app)).await.expect("connect")
}

/// A connection that sends a request's headers and the first byte of its body, then waits.
async fn trickling(app: &TestApp) -> TcpStream {
    let mut stream = connect_from(app, Ipv4Addr::LOCALHOST).await;
    let head = "POST /api/v1/experiments HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{";
    stream.write_all(head.as_bytes()).await.expect("write");
    stream
}

/// Reads until the server closes the connection (a reset closes it too); what it sent.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(60), stream.read(&mut buf))
            .await
            .expect("the server closes the connection")
        {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
                break;
            }
        }
    }
    String::from_utf8_lossy(&received).into_owned()
}

async fn healthz_from(app: &TestApp, from: Ipv4Addr) -> reqwest::Result<reqwest::Response> {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(from))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
        .get(app.url("/healthz"))
        .send()
        .await
}

#[tokio::test]
async fn an_address_over_its_share_of_connections_is_refused_while_others_are_served() {
    let app = spawn_app_with(|s| {
        s.max_connections_per_address = 3;
        s.header_timeout = HOUR;
        s.body_timeout = HOUR;
        s.body_deadline = HOUR;
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(trickling(&app).await);
    }
    // The fourth connection of 127.0.0.1 is answered at once and closed, unserved.
    let mut fourth = connect_from(&app, Ipv4Addr::LOCALHOST).await;
    let answer = read_until_closed(&mut fourth).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let body: Value = serde_json::from_str(body).expect("JSON error body");
    assert_eq!(body["error"]["code"], "too_many_requests", "{answer}");
    // Another address still gets its answer.
    let health = healthz_from(&app, Ipv4Addr::new(127, 0, 0, 2))
        .await
        .expect("GET /healthz from 127.0.0.2");
    assert_eq!(health.status(), StatusCode::OK);
    // A connection that ends gives its place back to its address.
    drop(held.pop());
    let mut served = false;
    for _ in 0..300 {
        if let Ok(r) = healthz_from(&app, Ipv4Addr::LOCALHOST).await {
            served = r.status() == StatusCode::OK;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        served,
        "127.0.0.1 is served again once one of its connections closed"
    );
}

#[tokio::test]
async fn a_body_trickled_past_its_total_deadline_is_cut_off_with_408_and_nothing_stored() {
    // Each pause is far shorter than the body timeout; only the total deadline can end it.
    let app = spawn_app_with(|s| {
        s.body_timeout = HOUR;
        s.body_deadline = Duration::from_secs(2);
    })
    .await;
    let stream = connect_from(&app, Ipv4Addr::LOCALHOST).await;
    let (mut reader, mut writer) = stream.into_split();
    let body = format!(
        "{{\"name\": \"trickled\", \"pad\": \"{}\"}}",
        "x".repeat(970)
    );
    let head = format!(
        "POST /api/v1/experiments HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    writer.write_all(head.as_bytes()).await.expect("head");
    // The writer stops once the answer arrives (or the reader is done).
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let mut stop = Some(stop);
    let trickle = tokio::spawn(async move {
        let mut sent = 0;
        for byte in body.bytes() {
            tokio::select! {
                _ = &mut stopped => break,
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            if writer.write_all(&[byte]).await.is_err() {
                break;
            }
            sent += 1;
        }
        (sent, body.len())
    });
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(120), reader.read(&mut buf))
            .await
            .expect("the server answers before the whole body is sent");
        match read {
            Ok(0) => break,
            Ok(n) => {
                received.extend_from_slice(&buf[..n]);
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
            }
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
                break;
            }
        }
    }
    drop(stop);
    let (sent, whole) = trickle.await.expect("trickle task");
    assert!(
        sent < whole,
        "cut off before the end ({sent} of {whole} bytes)"
    );
    let answer = String::from_utf8_lossy(&received);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert!(answer.contains("deadline"), "{answer}");
    let names: Vec<String> = app.get_json("/api/v1/experiments").await["experiments"]
        .as_array()
        .expect("experiments")
        .iter()
        .filter_map(|e| e["name"].as_str().map(str::to_owned))
        .collect();
    assert!(!names.contains(&"trickled".to_owned()), "{names:?}");
}
