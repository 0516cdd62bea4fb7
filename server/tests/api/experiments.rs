use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{assert_error, TestApp};
use crate::on_both_backends;

on_both_backends!(
    creating_an_experiment_returns_201_and_it_appears_in_the_list,
    a_duplicate_experiment_name_is_a_conflict,
    the_default_experiment_always_exists,
    health_reports_ok_and_the_backend,
);

async fn creating_an_experiment_returns_201_and_it_appears_in_the_list(app: &TestApp) {
    let response = app
        .post_json("/api/v1/experiments", &json!({ "name": "gpt-tiny" }))
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: serde_json::Value = response.json().await.expect("json");
    assert_eq!(created["name"], "gpt-tiny");
    let id = created["id"].as_str().expect("string id");

    let list = app.get_json("/api/v1/experiments").await;
    let found = list["experiments"]
        .as_array()
        .expect("array")
        .iter()
        .any(|e| e["id"] == id && e["name"] == "gpt-tiny");
    assert!(found, "{list}");
}

async fn a_duplicate_experiment_name_is_a_conflict(app: &TestApp) {
    let body = json!({ "name": "twice" });
    assert_eq!(
        app.post_json("/api/v1/experiments", &body).await.status(),
        StatusCode::CREATED
    );
    let response = app.post_json("/api/v1/experiments", &body).await;
    assert_error(response, StatusCode::CONFLICT, "conflict", None).await;
}

async fn the_default_experiment_always_exists(app: &TestApp) {
    let list = app.get_json("/api/v1/experiments").await;
    assert!(
        list["experiments"]
            .as_array()
            .expect("array")
            .iter()
            .any(|e| e["name"] == "Default"),
        "{list}"
    );
}

async fn health_reports_ok_and_the_backend(app: &TestApp) {
    let health = app.get_json("/healthz").await;
    assert_eq!(health["status"], "ok");
    assert!(["sqlite", "postgres"].contains(&health["backend"].as_str().unwrap_or("")));
}
