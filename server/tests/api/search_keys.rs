//! A search naming a param or metric key that no run has is refused with the nearest keys runs
//! do have, in `q` and in `sort` alike, instead of quietly finding nothing.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{assert_error, TestApp};
use crate::on_both_backends;

on_both_backends!(
    an_unknown_key_in_q_or_sort_is_refused_with_the_nearest_known_keys,
    a_key_only_other_experiments_have_is_unknown_in_a_search_of_this_one,
);

/// Two runs in `experiment` with a learning rate and a logged `val/loss`.
async fn two_runs(app: &TestApp, experiment: &str) {
    for (lr, loss) in [(0.1, 2.0), (0.01, 3.0)] {
        let run = app
            .create_run_with(json!({
                "experiment": experiment,
                "config": {"training": {"learning_rate": lr, "max_steps": 10}},
            }))
            .await;
        let id = run["id"].as_str().expect("id");
        app.post_points(id, &[("val/loss", 1, loss), ("train/loss", 1, loss)])
            .await;
    }
}

async fn search(app: &TestApp, query: &[(&str, &str)]) -> reqwest::Response {
    app.client
        .get(app.url("/api/v1/runs"))
        .query(query)
        .send()
        .await
        .expect("GET /api/v1/runs")
}

async fn an_unknown_key_in_q_or_sort_is_refused_with_the_nearest_known_keys(app: &TestApp) {
    two_runs(app, "keys").await;
    let cases: &[(&str, &str, &str, &[&str])] = &[
        (
            "q",
            "params.training.lr < 1",
            "params.training.lr",
            &["params.training.learning_rate"],
        ),
        (
            "q",
            "metrics.val/los < 2.5 and params.training.learning_rate > 0",
            "metrics.val/los",
            &["metrics.val/loss"],
        ),
        (
            "q",
            "metrics.loss is null",
            "metrics.loss",
            &["metrics.train/loss", "metrics.val/loss"],
        ),
        (
            "sort",
            "-metrics.val/los",
            "metrics.val/los",
            &["metrics.val/loss"],
        ),
        (
            "sort",
            "params.training.max_step",
            "params.training.max_step",
            &["params.training.max_steps"],
        ),
    ];
    for (field, value, unknown, nearest) in cases {
        let response = search(app, &[(field, value)]).await;
        let error = assert_error(
            response,
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some(field),
        )
        .await;
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("no run has `{unknown}")),
            "{value}: {message}"
        );
        for key in *nearest {
            assert!(message.contains(&format!("`{key}`")), "{value}: {message}");
        }
    }
    // Nothing near: said so, and nothing is offered.
    let response = search(app, &[("q", "params.optimizer.betas = 1")]).await;
    let error = assert_error(response, StatusCode::BAD_REQUEST, "bad_request", Some("q")).await;
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("no params key"), "{message}");
    assert!(!message.contains("did you mean"), "{message}");
    // The keys runs have still search as before.
    let page = app
        .get_query(
            "/api/v1/runs",
            &[
                (
                    "q",
                    "metrics.val/loss < 2.5 and params.training.learning_rate > 0",
                ),
                ("sort", "-params.training.max_steps"),
            ],
        )
        .await;
    assert_eq!(page["runs"].as_array().map(Vec::len), Some(1), "{page}");
}

async fn a_key_only_other_experiments_have_is_unknown_in_a_search_of_this_one(app: &TestApp) {
    two_runs(app, "with-metrics").await;
    let bare = app
        .create_run_with(json!({"experiment": "bare", "config": {"training": {"seed": 1}}}))
        .await;
    assert!(bare["id"].is_string());
    let query = [("experiment", "bare"), ("q", "metrics.val/loss < 2.5")];
    let response = search(app, &query).await;
    let error = assert_error(response, StatusCode::BAD_REQUEST, "bad_request", Some("q")).await;
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no run in experiment `bare` has `metrics.val/loss`"),
        "{message}"
    );
    assert!(message.contains("metrics yet"), "{message}");
    let query = [
        ("experiment", "bare"),
        ("sort", "params.training.learning_rate"),
    ];
    let response = search(app, &query).await;
    let error = assert_error(
        response,
        StatusCode::BAD_REQUEST,
        "bad_request",
        Some("sort"),
    )
    .await;
    let message: &str = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("no params key"), "{message}");
    // Across all experiments the key is known.
    let page: Value = app
        .get_query("/api/v1/runs", &[("q", "metrics.val/loss < 2.5")])
        .await;
    assert_eq!(page["runs"].as_array().map(Vec::len), Some(1), "{page}");
}
