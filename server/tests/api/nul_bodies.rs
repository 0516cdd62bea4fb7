//! A NUL character in any string or key of a request body is refused once, at the edge, naming
//! the field (no stored text can hold one: Postgres refuses it, and on SQLite it would cut names
//! short elsewhere), before sign-in and after it, on the API, MLflow and form routes alike.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::access::{accounts, ADMIN_TOKEN, PASSWORD};
use crate::helpers::TestApp;
use crate::on_both_backends_with;

on_both_backends_with!(accounts; a_nul_in_any_body_field_is_a_422_naming_it_and_nothing_is_stored);

const NUL: &str = "a\u{0}b";

/// What the server holds, as its readers see it: unchanged by refused requests.
async fn snapshot(app: &TestApp) -> Vec<Value> {
    let mut seen = Vec::new();
    for path in [
        "/api/v1/experiments",
        "/api/v1/runs",
        "/api/v1/users",
        "/api/v1/teams",
        "/api/v1/sweeps",
        "/api/v1/experiments/0/grants",
    ] {
        seen.push(app.get_json(path).await);
    }
    seen
}

async fn send(app: &TestApp, method: Method, path: &str, body: &Value, signed_in: bool) -> Value {
    let mut request = app
        .client
        .request(method.clone(), app.url(path))
        .header("content-type", "application/json")
        .body(body.to_string());
    if signed_in {
        request = request.bearer_auth(ADMIN_TOKEN);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let text = response.text().await.expect("body");
    let is_mlflow = path.starts_with("/api/2.0/");
    let expected = if is_mlflow {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    assert_eq!(status, expected, "{method} {path} {body}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: not JSON: {text}"))
}

async fn a_nul_in_any_body_field_is_a_422_naming_it_and_nothing_is_stored(app: &TestApp) {
    let run = app.create_run("kept").await;
    let before = snapshot(app).await;
    let sweep = |name: &str, metric: &str| {
        json!({
            "name": name, "experiment": "sweeps", "base": {"profile": "tiny"},
            "metric": {"name": metric}, "method": "random", "max_trials": 2,
            "parameters": {"training.learning_rate": {"distribution": "log_uniform",
                                                     "min": 1.0e-4, "max": 1.0e-2}}
        })
    };
    let dataset = json!({"name": NUL, "digest": "d", "source_type": "local", "source": "s"});
    // (method, path, body, field named, signed in)
    let cases: Vec<(Method, String, Value, &str, bool)> = vec![
        (
            Method::POST,
            "/api/v1/session".into(),
            json!({"name": NUL, "password": "x"}),
            "name",
            false,
        ),
        (
            Method::POST,
            "/api/v1/users".into(),
            json!({"name": NUL, "password": PASSWORD}),
            "name",
            true,
        ),
        (
            Method::POST,
            "/api/v1/teams".into(),
            json!({"name": NUL}),
            "name",
            true,
        ),
        (
            Method::POST,
            "/api/v1/tokens".into(),
            json!({"name": NUL, "scope": "read"}),
            "name",
            true,
        ),
        (
            Method::PUT,
            "/api/v1/experiments/0/grants".into(),
            json!({"user": NUL, "level": "read"}),
            "user",
            true,
        ),
        (
            Method::PUT,
            "/api/v1/experiments/0/grants".into(),
            json!({"team": NUL, "level": "read"}),
            "team",
            true,
        ),
        (
            Method::POST,
            "/api/v1/experiments".into(),
            json!({"name": NUL}),
            "name",
            true,
        ),
        (
            Method::POST,
            "/api/v1/runs".into(),
            json!({"experiment": "e", "tags": {"foo": NUL}}),
            "tags.foo",
            true,
        ),
        (
            Method::POST,
            "/api/v1/runs".into(),
            json!({"experiment": "e", "tags": {NUL: "v"}}),
            "tags.a\\u0000b",
            true,
        ),
        (
            Method::PATCH,
            format!("/api/v1/runs/{run}"),
            json!({"notes": NUL}),
            "notes",
            true,
        ),
        (
            Method::POST,
            format!("/api/v1/runs/{run}/metrics"),
            json!({"points": [{"key": "loss", "step": 0, "value": 1.0},
                              {"key": NUL, "step": 0, "value": 1.0}]}),
            "points[1].key",
            true,
        ),
        (
            Method::POST,
            "/api/v1/sweeps".into(),
            sweep(NUL, "loss"),
            "name",
            true,
        ),
        (
            Method::POST,
            "/api/v1/sweeps".into(),
            sweep("s", NUL),
            "metric.name",
            true,
        ),
        (
            Method::POST,
            "/api/2.0/mlflow/experiments/create".into(),
            json!({"name": NUL}),
            "name",
            true,
        ),
        (
            Method::POST,
            "/api/2.0/mlflow/runs/create".into(),
            json!({"experiment_id": NUL}),
            "experiment_id",
            true,
        ),
        (
            Method::POST,
            "/api/2.0/mlflow/runs/update".into(),
            json!({"run_id": NUL, "status": "FINISHED"}),
            "run_id",
            true,
        ),
        (
            Method::POST,
            "/api/2.0/mlflow/runs/search".into(),
            json!({"experiment_ids": ["0"], "filter": format!("tags.k = '{NUL}'")}),
            "filter",
            true,
        ),
        (
            Method::POST,
            "/api/2.0/mlflow/runs/set-tag".into(),
            json!({"run_id": run, "key": NUL, "value": "v"}),
            "key",
            true,
        ),
        (
            Method::POST,
            "/api/2.0/mlflow/runs/log-inputs".into(),
            json!({"run_id": run, "datasets": [{"dataset": dataset}]}),
            "datasets[0].dataset.name",
            true,
        ),
    ];
    for (method, path, body, field, signed_in) in cases {
        let answer = send(app, method.clone(), &path, &body, signed_in).await;
        if path.starts_with("/api/2.0/") {
            assert_eq!(answer["error_code"], "INVALID_PARAMETER_VALUE", "{path}");
            let message = answer["message"].as_str().unwrap_or_default();
            assert!(
                message.starts_with(&format!("{field}:")),
                "{path}: {message}"
            );
            assert!(message.contains("NUL"), "{path}: {message}");
        } else {
            assert_eq!(answer["error"]["code"], "unprocessable", "{path}: {answer}");
            assert_eq!(answer["error"]["field"], field, "{method} {path}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("NUL"), "{path}: {message}");
        }
    }
    // A form body (the dashboard's sign-in) is held to the same rule.
    let form = app
        .client
        .post(app.url("/sign-in"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("name=a%00b&password=x")
        .send()
        .await
        .expect("form");
    assert_eq!(form.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let answer: Value = form.json().await.expect("JSON error");
    assert_eq!(answer["error"]["field"], "name", "{answer}");

    assert_eq!(
        snapshot(app).await,
        before,
        "a refused request stored nothing"
    );
    let stored = app.get_json(&format!("/api/v1/runs/{run}")).await;
    assert_eq!(stored["notes"], "");
    assert_eq!(stored["tags"], json!({}));
    let keys = app
        .get_json(&format!("/api/v1/runs/{run}/metric-keys"))
        .await;
    assert!(!keys.to_string().contains("loss"), "{keys}");
}
