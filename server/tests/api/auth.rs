use std::net::SocketAddr;

use reqwest::StatusCode;
use serde_json::Value;
use trainyard::app::{Application, Settings};

use crate::helpers::{assert_error, spawn_app, spawn_app_with};

#[tokio::test]
async fn a_loopback_server_without_a_token_needs_no_auth() {
    let app = spawn_app().await;
    let response = app
        .client
        .get(app.url("/api/v1/experiments"))
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_non_loopback_address_without_a_token_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr: SocketAddr = "0.0.0.0:0".parse().expect("addr");
    let error = Application::build(Settings::new(addr, dir.path()))
        .await
        .err()
        .map(|e| e.to_string())
        .expect("build must fail");
    assert!(error.contains("admin token"), "{error}");
    assert!(error.contains("--admin-token"), "{error}");
}

#[tokio::test]
async fn with_a_token_every_api_request_needs_the_bearer_header() {
    let app = spawn_app_with(|s| s.admin_token = Some("s3cret".into())).await;
    let url = app.url("/api/v1/experiments");

    let missing = app.client.get(&url).send().await.expect("GET");
    assert_eq!(
        missing
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    assert_error(missing, StatusCode::UNAUTHORIZED, "unauthorized", None).await;

    let wrong = app
        .client
        .get(&url)
        .bearer_auth("guess")
        .send()
        .await
        .expect("GET");
    assert_error(wrong, StatusCode::UNAUTHORIZED, "unauthorized", None).await;

    let basic = app
        .client
        .get(&url)
        .basic_auth("admin", Some("s3cret"))
        .send()
        .await
        .expect("GET");
    assert_error(basic, StatusCode::UNAUTHORIZED, "unauthorized", None).await;

    let right = app
        .client
        .get(&url)
        .bearer_auth("s3cret")
        .send()
        .await
        .expect("GET");
    assert_eq!(right.status(), StatusCode::OK);
    let body: Value = right.json().await.expect("json");
    assert!(body["experiments"].is_array());

    // Writes are guarded too, and the event streams.
    let post = app
        .client
        .post(app.url("/api/v1/runs"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .expect("POST");
    assert_eq!(post.status(), StatusCode::UNAUTHORIZED);
    let events = app
        .client
        .get(app.url("/api/v1/events"))
        .send()
        .await
        .expect("GET");
    assert_eq!(events.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_health_check_needs_no_token() {
    let app = spawn_app_with(|s| s.admin_token = Some("s3cret".into())).await;
    let response = app
        .client
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn with_a_token_the_dashboard_cookie_reads_the_api_but_cannot_write_cross_site() {
    let app = spawn_app_with(|s| s.admin_token = Some("s3cret".into())).await;
    let read = app
        .client
        .get(app.url("/api/v1/experiments"))
        .header("cookie", "trainyard_token=s3cret")
        .send()
        .await
        .expect("GET");
    assert_eq!(read.status(), StatusCode::OK);

    let cross_site = app
        .client
        .post(app.url("/api/v1/experiments"))
        .header("cookie", "trainyard_token=s3cret")
        .header("origin", "https://elsewhere.example")
        .json(&serde_json::json!({"name": "forged"}))
        .send()
        .await
        .expect("POST");
    // Refused before the token is even looked at: a write from another site (http/guard.rs).
    assert_error(cross_site, StatusCode::FORBIDDEN, "cross_site", None).await;

    // Without a browser's word that the request comes from the dashboard, the cookie does not
    // count for a write.
    let unmarked = app
        .client
        .post(app.url("/api/v1/experiments"))
        .header("cookie", "trainyard_token=s3cret")
        .json(&serde_json::json!({"name": "forged"}))
        .send()
        .await
        .expect("POST");
    assert_error(unmarked, StatusCode::UNAUTHORIZED, "unauthorized", None).await;

    let listed: Value = app
        .client
        .get(app.url("/api/v1/experiments"))
        .bearer_auth("s3cret")
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("json");
    assert!(
        !listed.to_string().contains("forged"),
        "nothing was created: {listed}"
    );
}
