use reqwest::StatusCode;

use crate::helpers::{assert_error, TestApp};
use crate::on_both_backends;

on_both_backends!(
    expert_utilization_is_served_as_a_steps_by_experts_matrix_per_layer,
    a_dense_run_has_no_expert_utilization_layers,
    expert_utilization_rejects_a_bad_max_steps_and_an_unknown_run,
);

async fn expert_utilization_is_served_as_a_steps_by_experts_matrix_per_layer(app: &TestApp) {
    let id = app.create_run("moe").await;
    // Two layers of 4 experts reported at steps 0 and 10; layer 1 also reports drops.
    let mut points = Vec::new();
    let shares = [[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]];
    for (row, step) in [0_i64, 10].into_iter().enumerate() {
        for layer in 0..2 {
            for (e, share) in shares[row].iter().enumerate() {
                points.push((format!("moe/layer{layer}/expert{e}"), step, *share));
            }
        }
        points.push(("moe/layer1/dropped".to_string(), step, 0.05 * row as f64));
    }
    let borrowed: Vec<(&str, i64, f64)> = points
        .iter()
        .map(|(k, s, v)| (k.as_str(), *s, *v))
        .collect();
    app.post_points(&id, &borrowed).await;

    let body = app
        .get_json(&format!("/api/v1/runs/{id}/expert-utilization"))
        .await;
    let layers = body["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 2);
    let l1 = &layers[1];
    assert_eq!(l1["layer"], 1);
    assert_eq!(l1["experts"], 4);
    assert_eq!(l1["steps"], serde_json::json!([0, 10]));
    assert_eq!(l1["fractions"][0], serde_json::json!([0.4, 0.3, 0.2, 0.1]));
    assert_eq!(
        l1["fractions"][1],
        serde_json::json!([0.25, 0.25, 0.25, 0.25])
    );
    assert_eq!(l1["dropped"], serde_json::json!([0.0, 0.05]));
    assert_eq!(l1["entropy"], serde_json::json!([null, null]));
    assert_eq!(layers[0]["dropped"], serde_json::json!([null, null]));
}

async fn a_dense_run_has_no_expert_utilization_layers(app: &TestApp) {
    let id = app.create_run("dense").await;
    app.post_points(&id, &[("train/loss", 0, 2.0)]).await;
    let body = app
        .get_json(&format!("/api/v1/runs/{id}/expert-utilization"))
        .await;
    assert_eq!(body["layers"], serde_json::json!([]));
}

async fn expert_utilization_rejects_a_bad_max_steps_and_an_unknown_run(app: &TestApp) {
    let id = app.create_run("moe").await;
    for bad in ["0", "abc", "10001"] {
        let response = app
            .get(&format!(
                "/api/v1/runs/{id}/expert-utilization?max_steps={bad}"
            ))
            .await;
        assert_error(
            response,
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some("max_steps"),
        )
        .await;
    }
    let response = app
        .get("/api/v1/runs/0123456789abcdef0123456789abcdef/expert-utilization")
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}
