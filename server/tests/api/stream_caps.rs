//! One reader cannot hold every stream: a principal (a user, whichever token or session it
//! uses) and a client address each hold at most their share of open event streams, on every
//! streaming route (all runs' events, a run's events, a sweep's events, a followed log). One
//! more is answered 429 with `Retry-After` while other callers are still served, and a stream
//! that ends gives its place back.
//!
//! The bound is measured in streams; nothing here waits for time to pass except for the server
//! to notice that a client hung up (polled, with a generous limit).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use reqwest::{Method, Response, StatusCode};
use serde_json::{json, Value};
use trainyard::live::StreamLimits;

use crate::access::{accounts, add_user, send, sign_in, Auth, PASSWORD};
use crate::helpers::{spawn_app_with, TestApp};

/// Opens `path` as an event stream as `auth` from `from`; the response, whatever its status.
async fn open_from(app: &TestApp, auth: &Auth, path: &str, from: Ipv4Addr) -> Response {
    let client = reqwest::Client::builder()
        .local_address(IpAddr::V4(from))
        .build()
        .expect("client");
    let request = client
        .get(app.url(path))
        .header("accept", "text/event-stream")
        .timeout(Duration::from_secs(3600));
    auth.apply(request).send().await.expect("open a stream")
}

async fn open(app: &TestApp, auth: &Auth, path: &str) -> Response {
    open_from(app, auth, path, Ipv4Addr::LOCALHOST).await
}

/// Asserts a stream was refused for its share: 429, `Retry-After`, the stable error code.
async fn assert_refused(response: Response, path: &str) {
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        retry_after.is_some_and(|s| s > 0),
        "{path}: {retry_after:?}"
    );
    let body: Value = response.json().await.expect("JSON error body");
    assert_eq!(body["error"]["code"], "too_many_requests", "{path}: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("event streams")),
        "{path}: {body}"
    );
}

/// Opens `path` until it is served (the server has to notice a closed stream first).
async fn open_once_freed(app: &TestApp, auth: &Auth, path: &str, from: Ipv4Addr) -> Response {
    for _ in 0..600 {
        let response = open_from(app, auth, path, from).await;
        if response.status() != StatusCode::TOO_MANY_REQUESTS {
            return response;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{path} from {from} was still refused after one of its streams closed");
}

async fn ok(app: &TestApp, auth: &Auth, method: Method, path: &str, body: Value) -> Value {
    let response = send(app, auth, method, path, Some(&body)).await;
    let status = response.status();
    let text = response.text().await.expect("body");
    assert!(status.is_success(), "{path}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_principal_over_its_share_of_streams_gets_429_on_every_stream_route_while_others_are_served(
) {
    let app = spawn_app_with(|s| {
        accounts(s);
        s.streams = StreamLimits {
            per_principal: 3,
            per_address: 100,
        };
    })
    .await;
    add_user(&app, "alice", false).await;
    add_user(&app, "bob", false).await;
    let alice = sign_in(&app, "alice", PASSWORD).await;
    let bob = sign_in(&app, "bob", PASSWORD).await;
    let token = ok(
        &app,
        &alice,
        Method::POST,
        "/api/v1/tokens",
        json!({"name": "reader", "scope": "read"}),
    )
    .await;
    let reader = Auth::Bearer(token["secret"].as_str().expect("secret").to_owned());
    let run = ok(
        &app,
        &alice,
        Method::POST,
        "/api/v1/runs",
        json!({"experiment": "alices"}),
    )
    .await;
    let run = run["id"].as_str().expect("run id").to_owned();
    let experiment = ok(
        &app,
        &alice,
        Method::GET,
        &format!("/api/v1/runs/{run}"),
        json!({}),
    )
    .await["experiment_id"]
        .as_str()
        .expect("experiment id")
        .to_owned();
    // A sweep to follow (its controller is not started: nothing launches).
    let spec = json!({
        "name": "followed", "base": {"profile": "tiny"},
        "metric": {"name": "loss", "goal": "minimize"}, "method": "random", "max_trials": 2,
        "parameters": {"training.learning_rate": {"values": [0.001]}}
    });
    let sweep = app
        .state
        .store
        .create_sweep(&experiment, "followed", &spec, None)
        .await
        .expect("sweep")
        .id;

    let routes = [
        "/api/v1/events".to_owned(),
        format!("/api/v1/runs/{run}/events"),
        format!("/api/v1/runs/{run}/logs?follow=true"),
        format!("/api/v1/sweeps/{sweep}/events"),
    ];
    // The read token holds three streams, of three routes.
    let mut held = Vec::new();
    for path in &routes[..3] {
        let response = open(&app, &reader, path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        held.push(response);
    }
    // A fourth, on any route and through any credential of the same user, is refused.
    for path in &routes {
        assert_refused(open(&app, &reader, path).await, path).await;
    }
    assert_refused(open(&app, &alice, &routes[0]).await, &routes[0]).await;
    // Requests that are not streams are still answered.
    ok(&app, &reader, Method::GET, "/api/v1/runs", json!({})).await;
    // Another user is served from the same address.
    let bobs = open(&app, &bob, &routes[0]).await;
    assert_eq!(bobs.status(), StatusCode::OK);

    // A stream that closes gives its place back, on any route.
    drop(held.pop());
    let again = open_once_freed(&app, &reader, &routes[3], Ipv4Addr::LOCALHOST).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_refused(open(&app, &reader, &routes[0]).await, &routes[0]).await;
}

#[tokio::test]
async fn an_address_over_its_share_of_streams_gets_429_while_another_address_is_served() {
    // No accounts: every caller is the one local user, counted by its address alone.
    let app = spawn_app_with(|s| {
        s.streams = StreamLimits {
            per_principal: 100,
            per_address: 2,
        };
    })
    .await;
    let path = "/api/v1/events";
    let here = Ipv4Addr::LOCALHOST;
    let there = Ipv4Addr::new(127, 0, 0, 2);
    let mut held = Vec::new();
    for _ in 0..2 {
        let response = open_from(&app, &Auth::Nobody, path, here).await;
        assert_eq!(response.status(), StatusCode::OK);
        held.push(response);
    }
    assert_refused(open_from(&app, &Auth::Nobody, path, here).await, path).await;
    let elsewhere = open_from(&app, &Auth::Nobody, path, there).await;
    assert_eq!(
        elsewhere.status(),
        StatusCode::OK,
        "another address is served"
    );

    drop(held.pop());
    let again = open_once_freed(&app, &Auth::Nobody, path, here).await;
    assert_eq!(again.status(), StatusCode::OK);
}
