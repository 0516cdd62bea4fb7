use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{assert_error, TestApp};
use crate::on_both_backends;

on_both_backends!(
    posting_a_batch_returns_how_many_points_were_accepted,
    posting_a_batch_twice_stores_each_point_once,
    a_full_batch_of_ten_thousand_points_is_accepted,
    a_short_series_is_returned_whole_and_in_step_order,
    a_downsampled_series_keeps_the_spike,
    a_step_range_limits_the_series,
    metric_keys_lists_every_key_with_its_count,
    a_step_past_the_documented_range_is_a_422_naming_the_step,
    a_resent_point_with_another_value_is_reported_in_the_response,
);

async fn posting_a_batch_returns_how_many_points_were_accepted(app: &TestApp) {
    let id = app.create_run("m").await;
    let accepted = app
        .post_points(&id, &[("loss", 0, 2.0), ("loss", 1, 1.5), ("lr", 0, 0.1)])
        .await;
    assert_eq!(accepted["accepted"], 3);
    assert_eq!(accepted["stored"], 3);
}

async fn posting_a_batch_twice_stores_each_point_once(app: &TestApp) {
    let id = app.create_run("m").await;
    app.post_points(&id, &[("loss", 0, 2.0), ("loss", 1, 1.5)])
        .await;
    let again = app
        .post_points(&id, &[("loss", 0, 9.0), ("loss", 1, 9.0)])
        .await;
    assert_eq!(again["accepted"], 2);
    assert_eq!(again["stored"], 0);
    let series = app
        .get_json(&format!("/api/v1/runs/{id}/metrics?key=loss"))
        .await;
    assert_eq!(series["total"], 2);
    let values: Vec<f64> = series["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| p["value"].as_f64().expect("value"))
        .collect();
    assert_eq!(values, vec![2.0, 1.5], "the first value wins");
}

async fn a_full_batch_of_ten_thousand_points_is_accepted(app: &TestApp) {
    let id = app.create_run("m").await;
    let points: Vec<Value> = (0..10_000)
        .map(|s| json!({ "key": "train/loss", "step": s, "value": 1.0 / (1.0 + s as f64) }))
        .collect();
    let response = app
        .post_json(
            &format!("/api/v1/runs/{id}/metrics"),
            &json!({ "points": points }),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["accepted"], 10_000);
    let keys = app
        .get_json(&format!("/api/v1/runs/{id}/metric-keys"))
        .await;
    assert_eq!(keys["keys"][0]["count"], 10_000);
}

async fn a_short_series_is_returned_whole_and_in_step_order(app: &TestApp) {
    let id = app.create_run("m").await;
    app.post_points(&id, &[("loss", 2, 1.0), ("loss", 0, 3.0), ("loss", 1, 2.0)])
        .await;
    let series = app
        .get_json(&format!("/api/v1/runs/{id}/metrics?key=loss&max_points=10"))
        .await;
    assert_eq!(series["key"], "loss");
    assert_eq!(series["total"], 3);
    assert_eq!(series["downsampled"], false);
    let steps: Vec<i64> = series["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| p["step"].as_i64().expect("step"))
        .collect();
    assert_eq!(steps, vec![0, 1, 2]);
}

async fn a_downsampled_series_keeps_the_spike(app: &TestApp) {
    let id = app.create_run("m").await;
    let points: Vec<Value> = (0..5_000)
        .map(|s| {
            let value = match s {
                3_333 => 100.0,
                1_234 => -50.0,
                _ => 1.0,
            };
            json!({ "key": "loss", "step": s, "value": value })
        })
        .collect();
    let response = app
        .post_json(
            &format!("/api/v1/runs/{id}/metrics"),
            &json!({ "points": points }),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let series = app
        .get_json(&format!(
            "/api/v1/runs/{id}/metrics?key=loss&max_points=100"
        ))
        .await;
    assert_eq!(series["total"], 5_000);
    assert_eq!(series["downsampled"], true);
    let points = series["points"].as_array().expect("points");
    assert!(points.len() <= 100, "{} points", points.len());
    let values: Vec<f64> = points
        .iter()
        .map(|p| p["value"].as_f64().expect("v"))
        .collect();
    assert!(values.contains(&100.0), "the maximum survives");
    assert!(values.contains(&-50.0), "the minimum survives");
}

async fn a_step_range_limits_the_series(app: &TestApp) {
    let id = app.create_run("m").await;
    let points: Vec<(&str, i64, f64)> = (0..20).map(|s| ("loss", s, s as f64)).collect();
    app.post_points(&id, &points).await;
    let series = app
        .get_json(&format!(
            "/api/v1/runs/{id}/metrics?key=loss&start_step=5&end_step=9"
        ))
        .await;
    assert_eq!(series["total"], 5);
    let steps: Vec<i64> = series["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| p["step"].as_i64().expect("step"))
        .collect();
    assert_eq!(steps, vec![5, 6, 7, 8, 9]);
}

async fn metric_keys_lists_every_key_with_its_count(app: &TestApp) {
    let id = app.create_run("m").await;
    app.post_points(
        &id,
        &[("loss", 0, 2.0), ("loss", 1, 1.0), ("val/ppl", 1, 7.0)],
    )
    .await;
    let keys = app
        .get_json(&format!("/api/v1/runs/{id}/metric-keys"))
        .await;
    let mut listed: Vec<(String, i64)> = keys["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| {
            (
                k["key"].as_str().expect("key").to_string(),
                k["count"].as_i64().expect("count"),
            )
        })
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        vec![("loss".to_string(), 2), ("val/ppl".to_string(), 1)]
    );
}

async fn a_step_past_the_documented_range_is_a_422_naming_the_step(app: &TestApp) {
    let id = app.create_run("m").await;
    let path = format!("/api/v1/runs/{id}/metrics");
    let largest = 9_007_199_254_740_992i64; // 2^53
    for step in [largest + 1, i64::MAX] {
        let body = json!({ "points": [
            { "key": "loss", "step": 1, "value": 1.0 },
            { "key": "loss", "step": step, "value": 1.0 },
        ] });
        let error = assert_error(
            app.post_json(&path, &body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            Some("points[1].step"),
        )
        .await;
        let message = error["message"].as_str().expect("message");
        assert!(message.contains(&largest.to_string()), "{message}");
    }
    let accepted = app.post_points(&id, &[("loss", largest, 1.0)]).await;
    assert_eq!(accepted["stored"], 1);
    let keys = app
        .get_json(&format!("/api/v1/runs/{id}/metric-keys"))
        .await;
    assert_eq!(
        keys["keys"][0]["count"], 1,
        "nothing of a refused batch is stored"
    );
}

async fn a_resent_point_with_another_value_is_reported_in_the_response(app: &TestApp) {
    let id = app.create_run("m").await;
    let first: Vec<(&str, i64, f64)> = (0..20).map(|s| ("loss", s, 1.0)).collect();
    let accepted = app.post_points(&id, &first).await;
    assert_eq!(accepted["conflicts"], 0);
    assert_eq!(accepted["first_conflicts"], json!([]));
    // Steps 0-14 with another value, 15-19 as before, 20 new.
    let resent: Vec<(&str, i64, f64)> = (0..21)
        .map(|s| ("loss", s, if s < 15 { 2.0 } else { 1.0 }))
        .collect();
    let accepted = app.post_points(&id, &resent).await;
    assert_eq!(accepted["accepted"], 21);
    assert_eq!(accepted["stored"], 1);
    assert_eq!(accepted["conflicts"], 15);
    let listed = accepted["first_conflicts"]
        .as_array()
        .expect("first_conflicts");
    assert_eq!(listed.len(), 10, "only the first ten are listed");
    for (i, c) in listed.iter().enumerate() {
        assert_eq!(
            c,
            &json!({"key": "loss", "step": i, "stored_value": 1.0, "sent_value": 2.0})
        );
    }
    let series = app
        .get_json(&format!("/api/v1/runs/{id}/metrics?key=loss"))
        .await;
    let values: Vec<f64> = series["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| p["value"].as_f64().expect("value"))
        .collect();
    assert_eq!(values, vec![1.0; 21], "the stored values are kept");
    let doc = app.get_json("/api/v1/openapi.json").await;
    let properties = &doc["components"]["schemas"]["Accepted"]["properties"];
    assert!(properties["conflicts"].is_object(), "{properties}");
    assert!(properties["first_conflicts"].is_object(), "{properties}");
    assert!(doc["components"]["schemas"]["Conflict"]["properties"]["stored_value"].is_object());
}
