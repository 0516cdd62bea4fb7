//! Every class of client mistake gets a 4xx in the one error shape, naming the field at fault.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, spawn_app, spawn_app_with};

const UNKNOWN: &str = "0123456789abcdef0123456789abcdef";

#[tokio::test]
async fn every_endpoint_answers_404_for_an_unknown_run() {
    let app = spawn_app().await;
    let cases: [(Method, String, Option<Value>); 6] = [
        (Method::GET, format!("/api/v1/runs/{UNKNOWN}"), None),
        (
            Method::PATCH,
            format!("/api/v1/runs/{UNKNOWN}"),
            Some(json!({ "notes": "x" })),
        ),
        (
            Method::POST,
            format!("/api/v1/runs/{UNKNOWN}/metrics"),
            Some(json!({ "points": [{ "key": "loss", "step": 0, "value": 1.0 }] })),
        ),
        (
            Method::GET,
            format!("/api/v1/runs/{UNKNOWN}/metrics?key=loss"),
            None,
        ),
        (
            Method::GET,
            format!("/api/v1/runs/{UNKNOWN}/metric-keys"),
            None,
        ),
        (Method::GET, format!("/api/v1/runs/{UNKNOWN}/events"), None),
    ];
    for (method, path, body) in cases {
        let mut request = app.client.request(method.clone(), app.url(&path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request");
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{method} {path}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(
            body["error"]["code"], "not_found",
            "{method} {path}: {body}"
        );
    }
}

#[tokio::test]
async fn malformed_json_bodies_are_rejected_as_bad_requests() {
    let app = spawn_app().await;
    let run = app.create_run("errors").await;
    let cases = [
        (Method::POST, "/api/v1/experiments".to_string(), "{"),
        (Method::POST, "/api/v1/runs".to_string(), "not json"),
        (Method::PATCH, format!("/api/v1/runs/{run}"), "{\"name\": }"),
        (
            Method::POST,
            format!("/api/v1/runs/{run}/metrics"),
            "{\"points\": [}",
        ),
        // JSON has no NaN or infinity; a client that writes them gets a clear 400.
        (
            Method::POST,
            format!("/api/v1/runs/{run}/metrics"),
            "{\"points\": [{\"key\": \"loss\", \"step\": 0, \"value\": NaN}]}",
        ),
    ];
    for (method, path, body) in cases {
        let response = app.send_raw(method.clone(), &path, body).await;
        assert_error(response, StatusCode::BAD_REQUEST, "bad_request", None).await;
    }
}

#[tokio::test]
async fn a_body_without_a_json_content_type_is_unsupported() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/api/v1/experiments"))
        .body("{\"name\": \"x\"}")
        .send()
        .await
        .expect("request");
    assert_error(
        response,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        None,
    )
    .await;
}

#[tokio::test]
async fn wrong_types_and_invalid_values_are_unprocessable_naming_the_field() {
    let app = spawn_app().await;
    let run = app.create_run("errors").await;
    let metrics = format!("/api/v1/runs/{run}/metrics");
    let patch = format!("/api/v1/runs/{run}");
    let point = |key: Value, step: Value, value: Value| json!({ "points": [{ "key": "ok", "step": 0, "value": 1.0 }, { "key": key, "step": step, "value": value }] });
    let cases: Vec<(Method, &str, Value, &str)> = vec![
        (
            Method::POST,
            "/api/v1/experiments",
            json!({ "name": 5 }),
            "name",
        ),
        (
            Method::POST,
            "/api/v1/experiments",
            json!({ "name": "  " }),
            "name",
        ),
        (Method::POST, "/api/v1/runs", json!({ "tags": "x" }), "tags"),
        (
            Method::POST,
            "/api/v1/runs",
            json!({ "config": [1, 2] }),
            "config",
        ),
        (Method::POST, "/api/v1/runs", json!({ "name": "" }), "name"),
        (
            Method::POST,
            &metrics,
            point(json!("a"), json!("x"), json!(1.0)),
            "points[1].step",
        ),
        (
            Method::POST,
            &metrics,
            point(json!("a"), json!(0), json!("1.0")),
            "points[1].value",
        ),
        (
            Method::POST,
            &metrics,
            point(json!("a"), json!(-1), json!(1.0)),
            "points[1].step",
        ),
        (
            Method::POST,
            &metrics,
            point(json!(""), json!(0), json!(1.0)),
            "points[1].key",
        ),
        (
            Method::POST,
            &metrics,
            point(json!("a\u{7}b"), json!(0), json!(1.0)),
            "points[1].key",
        ),
        (
            Method::POST,
            &metrics,
            // null is a NaN point (as is "NaN"); any other text is no number.
            point(json!("a"), json!(0), json!("high")),
            "points[1].value",
        ),
        (Method::POST, &metrics, json!({ "points": 3 }), "points"),
        (
            Method::PATCH,
            &patch,
            json!({ "status": "bogus" }),
            "status",
        ),
        (Method::PATCH, &patch, json!({ "notes": 7 }), "notes"),
        (
            Method::PATCH,
            &patch,
            json!({ "reason": "no status" }),
            "reason",
        ),
        (Method::PATCH, &patch, json!({ "config": "x" }), "config"),
    ];
    for (method, path, body, field) in cases {
        let response = app.send_raw(method.clone(), path, &body.to_string()).await;
        assert_eq!(
            response.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{method} {path} {body}"
        );
        let error: Value = response.json().await.expect("json");
        assert_eq!(error["error"]["code"], "unprocessable", "{body}: {error}");
        assert_eq!(error["error"]["field"], field, "{body}: {error}");
    }
    // Nothing of the rejected batches was stored, not even their valid first point.
    let keys = app
        .get_json(&format!("/api/v1/runs/{run}/metric-keys"))
        .await;
    assert_eq!(keys["keys"], json!([]));
}

#[tokio::test]
async fn an_out_of_range_number_is_rejected_not_stored_as_infinity() {
    let app = spawn_app().await;
    let run = app.create_run("errors").await;
    let body = "{\"points\": [{\"key\": \"loss\", \"step\": 0, \"value\": 1e999}]}";
    let response = app
        .send_raw(Method::POST, &format!("/api/v1/runs/{run}/metrics"), body)
        .await;
    assert!(response.status().is_client_error(), "{}", response.status());
    let keys = app
        .get_json(&format!("/api/v1/runs/{run}/metric-keys"))
        .await;
    assert_eq!(keys["keys"], json!([]));
}

#[tokio::test]
async fn more_than_ten_thousand_points_in_one_request_are_refused() {
    let app = spawn_app().await;
    let run = app.create_run("errors").await;
    let points: Vec<Value> = (0..10_001)
        .map(|s| json!({ "key": "loss", "step": s, "value": 1.0 }))
        .collect();
    let response = app
        .post_json(
            &format!("/api/v1/runs/{run}/metrics"),
            &json!({ "points": points }),
        )
        .await;
    let error = assert_error(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unprocessable",
        Some("points"),
    )
    .await;
    assert!(
        error["message"].as_str().unwrap_or("").contains("10000"),
        "{error}"
    );
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_413() {
    let app = spawn_app().await;
    let run = app.create_run("errors").await;
    let body = format!(
        "{{\"points\": [], \"padding\": \"{}\"}}",
        "x".repeat(17 * 1024 * 1024)
    );
    let response = app
        .send_raw(Method::POST, &format!("/api/v1/runs/{run}/metrics"), &body)
        .await;
    assert_error(
        response,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        None,
    )
    .await;
}

#[tokio::test]
async fn the_body_limit_comes_from_the_settings() {
    let app = spawn_app_with(|s| s.body_limit = 1024).await;
    let body = json!({ "name": "x".repeat(2048) });
    let response = app.post_json("/api/v1/experiments", &body).await;
    assert_error(
        response,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        None,
    )
    .await;
}

#[tokio::test]
async fn bad_search_parameters_are_rejected_naming_the_parameter() {
    let app = spawn_app().await;
    let cases = [
        ("sort", "bogus"),
        ("sort", "params."),
        ("status", "sleeping"),
        ("limit", "0"),
        ("limit", "1001"),
        ("limit", "many"),
        ("cursor", "not-a-cursor"),
    ];
    for (param, value) in cases {
        let response = app
            .client
            .get(app.url("/api/v1/runs"))
            .query(&[(param, value)])
            .send()
            .await
            .expect("request");
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "{param}={value}"
        );
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["field"], param, "{param}={value}: {body}");
    }
}

#[tokio::test]
async fn a_filter_syntax_error_reports_its_position() {
    let app = spawn_app().await;
    let response = app
        .client
        .get(app.url("/api/v1/runs"))
        .query(&[("q", "metrics.val/loss < and")])
        .send()
        .await
        .expect("request");
    let error = assert_error(
        response,
        StatusCode::BAD_REQUEST,
        "invalid_filter",
        Some("q"),
    )
    .await;
    assert!(
        error["message"].as_str().unwrap_or("").contains("position"),
        "{error}"
    );
}

#[tokio::test]
async fn bad_series_parameters_are_rejected_naming_the_parameter() {
    let app = spawn_app().await;
    let run = app.create_run("errors").await;
    let cases = [
        ("", "key"),
        ("key=loss&max_points=1", "max_points"),
        ("key=loss&max_points=lots", "max_points"),
        ("key=loss&start_step=x", "start_step"),
        ("key=loss&end_step=1.5", "end_step"),
        ("key=loss&start_step=9&end_step=3", "start_step"),
    ];
    for (query, field) in cases {
        let response = app
            .get(&format!("/api/v1/runs/{run}/metrics?{query}"))
            .await;
        assert_error(
            response,
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some(field),
        )
        .await;
    }
}

#[tokio::test]
async fn bad_event_stream_positions_are_rejected() {
    let app = spawn_app().await;
    let run = app.create_run("errors").await;
    let path = format!("/api/v1/runs/{run}/events");
    let response = app
        .client
        .get(app.url(&path))
        .header("last-event-id", "garbage")
        .send()
        .await
        .expect("request");
    assert_error(
        response,
        StatusCode::BAD_REQUEST,
        "bad_request",
        Some("Last-Event-ID"),
    )
    .await;
    let response = app.get(&format!("{path}?after_step=soon")).await;
    assert_error(
        response,
        StatusCode::BAD_REQUEST,
        "bad_request",
        Some("after_step"),
    )
    .await;
}

#[tokio::test]
async fn an_unknown_route_is_a_json_404() {
    let app = spawn_app().await;
    for path in ["/api/v1/nothing-here", "/nothing-here"] {
        let response = app.get(path).await;
        assert_error(response, StatusCode::NOT_FOUND, "not_found", None).await;
    }
}

#[tokio::test]
async fn a_method_a_path_does_not_serve_is_a_json_405() {
    let app = spawn_app().await;
    let response = app
        .client
        .delete(app.url("/api/v1/experiments"))
        .send()
        .await
        .expect("request");
    assert_error(
        response,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        None,
    )
    .await;
}
