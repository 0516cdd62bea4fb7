//! `runs/log-inputs` is bounded: every stored field within its limit (400
//! INVALID_PARAMETER_VALUE naming it), only MLflow's fields kept, and a run's inputs as a whole
//! bounded in count and bytes, so `runs/get` stays small whatever a client logs.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use trainyard::validate::inputs::{
    MAX_DATASET_DIGEST_LEN, MAX_DATASET_NAME_LEN, MAX_DATASET_PROFILE_LEN, MAX_DATASET_SCHEMA_LEN,
    MAX_DATASET_SOURCE_LEN, MAX_DATASET_SOURCE_TYPE_LEN, MAX_INPUTS_PER_RUN,
    MAX_INPUT_BYTES_PER_RUN, MAX_INPUT_TAG_KEY_LEN, MAX_INPUT_TAG_VALUE_LEN,
};

use super::{call, ok};
use crate::helpers::TestApp;
use crate::on_both_backends;

async fn new_run(app: &TestApp) -> String {
    let body = ok(
        app,
        Method::POST,
        "runs/create",
        json!({"experiment_id": "0", "run_name": "inputs", "start_time": 1}),
    )
    .await;
    body["run"]["info"]["run_id"]
        .as_str()
        .expect("run id")
        .to_owned()
}

fn dataset(name: &str, extra: Value) -> Value {
    let mut dataset = json!({"name": name, "digest": "abc123", "source_type": "local",
        "source": "{\"uri\": \"/data/train.csv\"}"});
    for (k, v) in extra.as_object().expect("object") {
        dataset[k] = v.clone();
    }
    json!({"dataset": dataset, "tags": [{"key": "mlflow.data.context", "value": "train"}]})
}

async fn log(app: &TestApp, run: &str, datasets: Vec<Value>) -> (StatusCode, Value) {
    let body = json!({"run_id": run, "datasets": datasets});
    call(app, Method::POST, "runs/log-inputs", body).await
}

/// Asserts MLflow's error shape: 400, INVALID_PARAMETER_VALUE, a message naming `field`.
fn assert_refused(answer: (StatusCode, Value), field: &str) {
    let (status, body) = answer;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {body}");
    assert_eq!(body["error_code"], "INVALID_PARAMETER_VALUE", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.starts_with(field), "{field}: {message}");
}

async fn run_get_len(app: &TestApp, run: &str) -> (usize, Value) {
    let body = ok(app, Method::GET, "runs/get", json!({"run_id": run})).await;
    (body.to_string().len(), body)
}

async fn each_field_over_its_limit_is_refused_naming_it(app: &TestApp) {
    let run = new_run(app).await;
    let cases = [
        ("name", MAX_DATASET_NAME_LEN),
        ("digest", MAX_DATASET_DIGEST_LEN),
        ("source_type", MAX_DATASET_SOURCE_TYPE_LEN),
        ("source", MAX_DATASET_SOURCE_LEN),
        ("schema", MAX_DATASET_SCHEMA_LEN),
        ("profile", MAX_DATASET_PROFILE_LEN),
    ];
    for (key, max) in cases {
        let over = dataset("train", json!({ key: "x".repeat(max + 1) }));
        assert_refused(
            log(app, &run, vec![over]).await,
            &format!("datasets[0].dataset.{key}"),
        );
    }
    let tag = |key: String, value: String| json!({"dataset": {"name": "t", "digest": "d"}, "tags": [{"key": key, "value": value}]});
    let long_key = tag("k".repeat(MAX_INPUT_TAG_KEY_LEN + 1), "v".into());
    assert_refused(
        log(app, &run, vec![long_key]).await,
        "datasets[0].tags[0].key",
    );
    let long_value = tag("k".into(), "v".repeat(MAX_INPUT_TAG_VALUE_LEN + 1));
    assert_refused(
        log(app, &run, vec![long_value]).await,
        "datasets[0].tags[0].value",
    );
    // Nothing of the refused requests was stored.
    let (_, body) = run_get_len(app, &run).await;
    assert_eq!(body["run"]["inputs"]["dataset_inputs"], json!([]), "{body}");

    // A dataset at every limit is taken, and given back with MLflow's fields only.
    let mut at_limit = dataset("train", json!({"schema": "s".repeat(1000)}));
    at_limit["dataset"]["padding"] = json!("p".repeat(100_000));
    at_limit["unknown"] = json!({"a": 1});
    ok(
        app,
        Method::POST,
        "runs/log-inputs",
        json!({"run_id": run, "datasets": [at_limit]}),
    )
    .await;
    let (len, body) = run_get_len(app, &run).await;
    let inputs = &body["run"]["inputs"]["dataset_inputs"];
    assert_eq!(inputs[0]["dataset"]["name"], "train", "{body}");
    assert_eq!(
        inputs[0]["dataset"]["schema"].as_str().map(str::len),
        Some(1000)
    );
    assert_eq!(inputs[0]["tags"][0]["value"], "train");
    assert!(inputs[0]["dataset"].get("padding").is_none() && inputs[0].get("unknown").is_none());
    assert!(len < 10_000, "runs/get is {len} bytes");
}

async fn a_runs_inputs_are_bounded_in_count_and_bytes_so_runs_get_stays_small(app: &TestApp) {
    // Large datasets, each within the field limits: they fit until the run's byte budget is
    // spent, then one more is refused, and runs/get answers at most the budget.
    let run = new_run(app).await;
    let profile = "p".repeat(MAX_DATASET_PROFILE_LEN);
    let mut stored = 0;
    let refused = loop {
        let big = dataset(
            &format!("big-{stored}"),
            json!({"profile": profile, "schema": "s".repeat(MAX_DATASET_SCHEMA_LEN)}),
        );
        let answer = log(app, &run, vec![big]).await;
        if answer.0 != StatusCode::OK {
            break answer;
        }
        stored += 1;
        assert!(stored <= 10, "the run took {stored} inputs of 2 MiB");
    };
    assert!(stored >= 1, "one large dataset fits");
    assert_refused(refused, "datasets");
    let (len, _) = run_get_len(app, &run).await;
    assert!(
        len <= MAX_INPUT_BYTES_PER_RUN + 16 * 1024,
        "runs/get is {len} bytes"
    );

    // Many small datasets: at most the per-run count; the same dataset again is no new input.
    let run = new_run(app).await;
    let all: Vec<Value> = (0..MAX_INPUTS_PER_RUN)
        .map(|i| dataset(&format!("d{i}"), json!({})))
        .collect();
    assert_eq!(log(app, &run, all).await.0, StatusCode::OK);
    assert_eq!(
        log(app, &run, vec![dataset("d0", json!({}))]).await.0,
        StatusCode::OK
    );
    assert_refused(
        log(app, &run, vec![dataset("one-more", json!({}))]).await,
        "datasets",
    );
    let (_, body) = run_get_len(app, &run).await;
    let inputs = body["run"]["inputs"]["dataset_inputs"]
        .as_array()
        .map(Vec::len);
    assert_eq!(inputs, Some(MAX_INPUTS_PER_RUN));
}

on_both_backends!(
    each_field_over_its_limit_is_refused_naming_it,
    a_runs_inputs_are_bounded_in_count_and_bytes_so_runs_get_stays_small,
);
