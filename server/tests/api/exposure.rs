//! What a server exposes to browsers and to slow or hostile clients: the host check (DNS
//! rebinding), the cross-site rule for writes, security headers, connection limits and
//! timeouts, JSON-object bodies and NUL bytes in parameters.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{assert_error, spawn_app, spawn_app_with, TestApp};
use crate::on_both_backends;

fn port(app: &TestApp) -> &str {
    app.address.rsplit(':').next().expect("port")
}

async fn run_count(app: &TestApp) -> usize {
    app.get_json("/api/v1/runs").await["runs"]
        .as_array()
        .expect("runs")
        .len()
}

async fn experiment_names(app: &TestApp) -> Vec<String> {
    app.get_json("/api/v1/experiments").await["experiments"]
        .as_array()
        .expect("experiments")
        .iter()
        .filter_map(|e| e["name"].as_str().map(String::from))
        .collect()
}

#[tokio::test]
async fn a_forged_host_is_refused_on_every_kind_of_route() {
    let app = spawn_app().await;
    let run = app.create_run("rebinding").await;
    let host = format!("evil.example:{}", port(&app));
    let paths = [
        "/api/v1/experiments".to_string(),
        format!("/api/v1/runs/{run}"),
        "/api/v1/events".to_string(),
        format!("/api/v1/runs/{run}/events"),
        "/".to_string(),
        format!("/runs/{run}"),
        "/static/app.css".to_string(),
        "/healthz".to_string(),
        "/no/such/page".to_string(),
    ];
    for path in paths {
        let response = app
            .client
            .get(app.url(&path))
            .header("host", &host)
            .send()
            .await
            .expect("GET");
        let error = assert_error(
            response,
            StatusCode::MISDIRECTED_REQUEST,
            "host_not_allowed",
            None,
        )
        .await;
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("evil.example")),
            "{path}: {error}"
        );
    }
}

#[tokio::test]
async fn a_page_on_a_rebound_host_name_cannot_launch_a_command() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/api/v1/runs"))
        .header("host", format!("rebind.evil.example:{}", port(&app)))
        .json(&json!({ "launch": true, "command": "echo pwned" }))
        .send()
        .await
        .expect("POST");
    assert_error(
        response,
        StatusCode::MISDIRECTED_REQUEST,
        "host_not_allowed",
        None,
    )
    .await;
    assert_eq!(run_count(&app).await, 0, "no run may be created");
}

#[tokio::test]
async fn loopback_names_the_public_url_and_allowed_hosts_are_accepted() {
    let app = spawn_app_with(|s| {
        s.public_url = Some("https://ty.example.com".parse().expect("url"));
        s.allowed_hosts = vec!["lab.lan".to_string()];
    })
    .await;
    let port = port(&app);
    let hosts = [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("[::1]:{port}"),
        "ty.example.com".to_string(),
        "TY.example.com:443".to_string(),
        "lab.lan:1234".to_string(),
    ];
    for host in hosts {
        for path in ["/api/v1/experiments", "/", "/static/app.css"] {
            let response = app
                .client
                .get(app.url(path))
                .header("host", &host)
                .send()
                .await
                .expect("GET");
            assert_eq!(response.status(), StatusCode::OK, "{host} {path}");
        }
    }
    let other = app
        .client
        .get(app.url("/api/v1/experiments"))
        .header("host", "ty.example.com.evil.example")
        .send()
        .await
        .expect("GET");
    assert_eq!(other.status(), StatusCode::MISDIRECTED_REQUEST);
}

/// Browser headers a page on another site sends with a write.
fn cross_site_headers() -> [Vec<(&'static str, &'static str)>; 3] {
    [
        vec![("origin", "http://evil.example")],
        vec![("sec-fetch-site", "cross-site")],
        vec![
            ("sec-fetch-site", "same-site"),
            ("origin", "http://evil.example"),
        ],
    ]
}

async fn assert_cross_site_writes_refused(app: &TestApp) {
    let run = app.create_run("victim").await;
    let writes = [
        (
            Method::POST,
            "/api/v1/experiments".to_string(),
            json!({ "name": "planted" }),
        ),
        (
            Method::POST,
            "/api/v1/runs".to_string(),
            json!({ "experiment": "planted", "launch": true, "command": "echo pwned" }),
        ),
        (
            Method::PATCH,
            format!("/api/v1/runs/{run}"),
            json!({ "notes": "planted" }),
        ),
        (Method::POST, format!("/api/v1/runs/{run}/stop"), json!({})),
    ];
    for headers in cross_site_headers() {
        for (method, path, body) in &writes {
            let mut request = app.client.request(method.clone(), app.url(path)).json(body);
            if let Some(token) = &app.token {
                request = request.bearer_auth(token);
            }
            for (name, value) in &headers {
                request = request.header(*name, *value);
            }
            let response = request.send().await.expect("write");
            assert_error(response, StatusCode::FORBIDDEN, "cross_site", None).await;
        }
    }
    assert!(!experiment_names(app).await.contains(&"planted".to_string()));
    assert_eq!(run_count(app).await, 1);
    let stored = app.get_json(&format!("/api/v1/runs/{run}")).await;
    assert_ne!(stored["notes"], "planted");
}

#[tokio::test]
async fn a_cross_site_write_is_refused_without_a_token() {
    assert_cross_site_writes_refused(&spawn_app().await).await;
}

#[tokio::test]
async fn a_cross_site_write_is_refused_even_with_the_token() {
    let app = spawn_app_with(|s| s.admin_token = Some("s3cret".into())).await;
    assert_cross_site_writes_refused(&app).await;
}

#[tokio::test]
async fn a_same_origin_write_from_the_dashboard_still_works() {
    let app = spawn_app_with(|s| s.admin_token = Some("s3cret".into())).await;
    let origin = app.address.clone();
    // The dashboard's fetch: its own origin, the token in the cookie.
    let response = app
        .client
        .post(app.url("/api/v1/experiments"))
        .header("origin", &origin)
        .header("sec-fetch-site", "same-origin")
        .header("cookie", "trainyard_token=s3cret")
        .json(&json!({ "name": "from-the-page" }))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), StatusCode::CREATED);
    // A script without browser headers, as today.
    let response = app
        .post_json("/api/v1/experiments", &json!({ "name": "from-a-script" }))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let names = experiment_names(&app).await;
    assert!(names.contains(&"from-the-page".to_string()), "{names:?}");
    assert!(names.contains(&"from-a-script".to_string()), "{names:?}");
}

/// The launch form's fields, with a config that validates.
fn launch_form(yaml: &str) -> Vec<(&'static str, String)> {
    vec![
        ("experiment", "form-posted".to_string()),
        ("name", "planted".to_string()),
        ("profile", "tiny".to_string()),
        ("yaml", yaml.to_string()),
        ("overrides", "training.max_steps=20".to_string()),
        ("gpus", "0".to_string()),
    ]
}

#[tokio::test]
async fn a_cross_site_form_post_to_launch_is_refused_and_creates_no_run() {
    let app = spawn_app_with(|s| {
        s.launcher.gpus = Some(vec![]);
        // Never a real trainer: a refused post must not need one, an accepted one fails fast.
        s.launcher.trainer_bin = Some(s.data_dir.join("no-such-trainer"));
    })
    .await;
    let yaml = trainer::config::PROFILES
        .iter()
        .find(|(name, _)| *name == "tiny")
        .map(|(_, yaml)| *yaml)
        .expect("tiny profile");
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    for headers in cross_site_headers() {
        let mut request = no_redirects
            .post(app.url("/launch"))
            .form(&launch_form(yaml));
        for (name, value) in &headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("POST /launch");
        assert_error(response, StatusCode::FORBIDDEN, "cross_site", None).await;
    }
    assert_eq!(run_count(&app).await, 0, "no run may be created");
    // The same post from the page itself launches.
    let response = no_redirects
        .post(app.url("/launch"))
        .header("origin", &app.address)
        .header("sec-fetch-site", "same-origin")
        .form(&launch_form(yaml))
        .send()
        .await
        .expect("POST /launch");
    let status = response.status();
    let page = response.text().await.unwrap_or_default();
    assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(run_count(&app).await, 1);
}

#[tokio::test]
async fn every_response_carries_the_security_headers() {
    let app = spawn_app().await;
    let page_headers = [
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("content-security-policy", "frame-ancestors 'none'"),
        ("referrer-policy", "same-origin"),
    ];
    let paths = [
        "/",
        "/launch",
        "/static/app.css",
        "/static/run.js",
        "/api/v1/experiments",
        "/api/v1/runs/nope",
        "/no/such/page",
    ];
    for path in paths {
        let response = app.get(path).await;
        for (name, value) in page_headers {
            let values: Vec<&str> = response
                .headers()
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            assert!(values.contains(&value), "{path}: {name} is {values:?}");
        }
    }
}

#[tokio::test]
async fn a_body_that_is_not_a_json_object_is_refused_and_creates_nothing() {
    let app = spawn_app().await;
    let run = app.create_run("objects").await;
    let experiments = experiment_names(&app).await;
    let routes = [
        (Method::POST, "/api/v1/runs".to_string()),
        (Method::POST, "/api/v1/experiments".to_string()),
        (Method::PATCH, format!("/api/v1/runs/{run}")),
        (Method::POST, format!("/api/v1/runs/{run}/metrics")),
    ];
    let bodies = ["[]", " [ ]", "[\"x\"]", "\"x\"", "1", "null", "true"];
    for (method, path) in &routes {
        for body in bodies {
            let response = app.send_raw(method.clone(), path, body).await;
            let error = assert_error(
                response,
                StatusCode::UNPROCESSABLE_ENTITY,
                "unprocessable",
                None,
            )
            .await;
            assert!(
                error["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("JSON object")),
                "{method} {path} {body}: {error}"
            );
        }
        // Malformed JSON stays a syntax error.
        let response = app.send_raw(method.clone(), path, "[1,").await;
        assert_error(response, StatusCode::BAD_REQUEST, "bad_request", None).await;
    }
    assert_eq!(run_count(&app).await, 1);
    assert_eq!(experiment_names(&app).await, experiments);
}

async fn a_nul_byte_in_a_path_or_query_parameter_is_a_400_naming_it(app: &TestApp) {
    let run = app.create_run("nul").await;
    let cases = [
        (Method::GET, "/api/v1/runs/abc%00def".to_string(), "id"),
        (Method::PATCH, "/api/v1/runs/%00".to_string(), "id"),
        (
            Method::GET,
            "/api/v1/runs/a%00/metric-keys".to_string(),
            "id",
        ),
        (
            Method::GET,
            "/api/v1/runs?experiment=x%00".to_string(),
            "experiment",
        ),
        (
            Method::GET,
            "/api/v1/runs?q=name%20%3D%20%22a%00%22".to_string(),
            "q",
        ),
        (
            Method::GET,
            format!("/api/v1/runs/{run}/metrics?key=loss%00"),
            "key",
        ),
        (
            Method::GET,
            format!("/api/v1/runs/{run}/logs?offset=%00"),
            "offset",
        ),
        (Method::GET, "/api/v1/runs?x%00y=1".to_string(), "x%00y"),
        (Method::GET, "/runs/0123%00".to_string(), "id"),
        (Method::GET, "/experiments/e%00".to_string(), "id"),
        (Method::GET, "/?experiment=%00".to_string(), "experiment"),
        (Method::GET, "/compare?runs=%00".to_string(), "runs"),
    ];
    for (method, path, field) in cases {
        let mut request = app.client.request(method.clone(), app.url(&path));
        if method == Method::PATCH {
            request = request.json(&json!({ "notes": "x" }));
        }
        let response = request.send().await.expect("request");
        let status = response.status();
        let body: Value = response.json().await.expect("JSON error body");
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{path}: {body}");
        assert_eq!(body["error"]["field"], field, "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("NUL"), "{path}: {body}");
    }
    // Nothing broke: the store still answers, the run is unchanged.
    let stored = app.get_json(&format!("/api/v1/runs/{run}")).await;
    assert_eq!(stored["id"], run.as_str());
}

on_both_backends!(a_nul_byte_in_a_path_or_query_parameter_is_a_400_naming_it);

/// A raw connection that sends the start of a request and then nothing more.
async fn slow_connection(app: &TestApp) -> TcpStream {
    let mut stream = TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .expect("partial header");
    stream
}

/// Reads until the server closes the connection; returns what it sent. Panics if it stays open
/// for a minute.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut received))
        .await
        .expect("the server closes the connection");
    if let Err(err) = read {
        // A reset closes the connection too.
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    }
    String::from_utf8_lossy(&received).into_owned()
}

#[tokio::test]
async fn slow_connections_beyond_the_limit_are_closed_after_the_header_timeout_and_healthz_answers()
{
    let app = spawn_app_with(|s| {
        s.header_timeout = Duration::from_secs(1);
        s.max_connections = 4;
    })
    .await;
    let mut slow = Vec::new();
    for _ in 0..12 {
        slow.push(slow_connection(&app).await);
    }
    let health = app.get("/healthz").await;
    assert_eq!(health.status(), StatusCode::OK);
    let body: Value = health.json().await.expect("JSON");
    assert_eq!(body["status"], "ok");
    for stream in &mut slow {
        let sent = read_until_closed(stream).await;
        assert!(
            !sent.contains("200 OK"),
            "a slow request was served: {sent}"
        );
    }
}

#[tokio::test]
async fn a_connection_over_the_limit_waits_until_a_slot_frees() {
    let app = spawn_app_with(|s| {
        s.header_timeout = Duration::from_secs(3600);
        s.max_connections = 2;
    })
    .await;
    let first = slow_connection(&app).await;
    let _second = slow_connection(&app).await;
    let client = app.client.clone();
    let url = app.url("/healthz");
    let waiting = tokio::spawn(async move { client.get(url).send().await });
    // While both slots are held the request cannot be served, however long it is given; this
    // pause only gives a wrongly served request the chance to show.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "served beyond the connection limit");
    drop(first);
    let response = waiting.await.expect("task").expect("GET /healthz");
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_request_body_that_stalls_is_answered_408_after_the_body_timeout() {
    let app = spawn_app_with(|s| s.body_timeout = Duration::from_secs(1)).await;
    let mut stream = TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .expect("connect");
    let head = "POST /api/v1/experiments HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                Content-Type: application/json\r\nContent-Length: 100\r\n\
                Connection: close\r\n\r\n{\"name\": \"stalled\"";
    stream.write_all(head.as_bytes()).await.expect("write");
    let answer = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    let names = experiment_names(&app).await;
    assert!(!names.contains(&"stalled".to_string()), "{names:?}");
}

/// Sends `head` (a whole request without a body) on a fresh connection; the answer.
async fn raw_request(app: &TestApp, head: &str) -> String {
    let mut stream = TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    read_until_closed(&mut stream).await
}

#[tokio::test]
async fn a_request_with_two_host_headers_is_a_400_naming_host_and_changes_nothing() {
    let app = spawn_app().await;
    let pairs = [
        ("127.0.0.1", "evil.example"),
        ("evil.example", "127.0.0.1"),
        ("127.0.0.1", "127.0.0.1"),
    ];
    for (first, second) in pairs {
        for (method, path) in [
            ("GET", "/api/v1/experiments"),
            ("GET", "/"),
            ("POST", "/api/v1/experiments"),
        ] {
            let body = r#"{"name": "two-hosts"}"#;
            let head = format!(
                "{method} {path} HTTP/1.1\r\nHost: {first}\r\nHost: {second}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{}",
                if method == "POST" { body.len() } else { 0 },
                if method == "POST" { body } else { "" },
            );
            let answer = raw_request(&app, &head).await;
            assert!(
                answer.starts_with("HTTP/1.1 400"),
                "{method} {path} with {first}, {second}: {answer}"
            );
            let json = answer.split("\r\n\r\n").nth(1).unwrap_or("");
            let error: Value = serde_json::from_str(json).expect("a JSON body");
            assert_eq!(error["error"]["code"], "bad_request", "{answer}");
            assert_eq!(error["error"]["field"], "Host", "{answer}");
        }
    }
    // One Host, the same request: served.
    let answer = raw_request(
        &app,
        "GET /api/v1/experiments HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let names = experiment_names(&app).await;
    assert!(!names.contains(&"two-hosts".to_string()), "{names:?}");
}
