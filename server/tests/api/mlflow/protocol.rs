//! The MLflow protocol request by request: one store behind both APIs, the errors the client
//! expects, soft deletion, numeric experiment ids and artifacts.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{call, ok};
use crate::helpers::TestApp;

async fn mlflow_run(app: &TestApp, experiment_id: &str, name: &str) -> String {
    let body = ok(
        app,
        Method::POST,
        "runs/create",
        json!({"experiment_id": experiment_id, "run_name": name, "start_time": 1,
               "tags": [{"key": "team", "value": "nlp"}]}),
    )
    .await;
    body["run"]["info"]["run_id"]
        .as_str()
        .expect("run id")
        .to_owned()
}

fn pairs(list: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|kv| {
            (
                kv["key"].as_str().unwrap_or("").to_owned(),
                kv["value"]
                    .as_str()
                    .map_or(kv["value"].to_string(), str::to_owned),
            )
        })
        .collect();
    out.sort();
    out
}

async fn a_launched_run_reads_back_through_mlflow_with_its_flattened_config(app: &TestApp) {
    let created = app
        .post_json(
            "/api/v1/runs",
            &json!({"experiment": "native", "name": "gpt-small",
                    "config": {"training": {"learning_rate": 0.001}, "model": {"n_layer": 2}}}),
        )
        .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let run: Value = created.json().await.expect("run");
    let id = run["id"].as_str().expect("id");
    let points = json!({"points": [
        {"key": "train/loss", "step": 1, "value": 3.5},
        {"key": "train/loss", "step": 2, "value": 3.25},
    ]});
    let posted = app
        .post_json(&format!("/api/v1/runs/{id}/metrics"), &points)
        .await;
    assert!(posted.status().is_success());

    let got = ok(app, Method::GET, "runs/get", json!({"run_id": id})).await;
    let info = &got["run"]["info"];
    assert_eq!(info["run_name"], "gpt-small");
    assert_eq!(info["status"], "SCHEDULED", "a created run has not started");
    assert_eq!(info["lifecycle_stage"], "active");
    let experiment = info["experiment_id"].as_str().expect("experiment id");
    assert!(
        experiment.parse::<u64>().is_ok(),
        "numeric id, got {experiment}"
    );
    assert_eq!(
        info["artifact_uri"],
        format!("mlflow-artifacts:/{experiment}/{id}/artifacts")
    );
    assert_eq!(
        pairs(&got["run"]["data"]["params"]),
        [
            ("model.n_layer".to_owned(), "2".to_owned()),
            ("training.learning_rate".to_owned(), "0.001".to_owned())
        ]
    );
    let metrics = &got["run"]["data"]["metrics"];
    assert_eq!(metrics[0]["key"], "train/loss");
    assert_eq!(metrics[0]["step"], 2);
    assert_eq!(metrics[0]["value"], 3.25);
    let history = ok(
        app,
        Method::GET,
        "metrics/get-history",
        json!({"run_id": id, "metric_key": "train/loss"}),
    )
    .await;
    let steps: Vec<i64> = history["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .map(|m| m["step"].as_i64().expect("step"))
        .collect();
    assert_eq!(steps, [1, 2]);
}

async fn an_mlflow_run_is_a_trainyard_run(app: &TestApp) {
    let id = mlflow_run(app, "0", "from-mlflow").await;
    ok(
        app,
        Method::POST,
        "runs/log-batch",
        json!({"run_id": id,
               "metrics": [{"key": "val/loss", "value": 1.5, "timestamp": "1700000000000",
                            "step": "10"}],
               "params": [{"key": "lr", "value": "0.01"}],
               "tags": [{"key": "mlflow.note.content", "value": "a note"}]}),
    )
    .await;
    let native: Value = app
        .get(&format!("/api/v1/runs/{id}"))
        .await
        .json()
        .await
        .expect("run");
    assert_eq!(native["name"], "from-mlflow");
    assert_eq!(native["status"], "running");
    assert_eq!(native["notes"], "a note");
    assert_eq!(native["params"]["lr"], "0.01");
    assert_eq!(native["tags"]["team"], "nlp");
    assert_eq!(native["latest_metrics"]["val/loss"]["step"], 10);
    assert_eq!(
        native["latest_metrics"]["val/loss"]["time"],
        1_700_000_000_000_i64
    );
    let found = app
        .get_query(
            "/api/v1/runs",
            &[("q", "metrics.val/loss < 2 and params.lr = '0.01'")],
        )
        .await;
    assert_eq!(found["runs"][0]["id"], id.as_str());
    // The run ends through MLflow with KILLED: Trainyard's `stopped`.
    let info = ok(
        app,
        Method::POST,
        "runs/update",
        json!({"run_id": id, "status": "KILLED", "end_time": 5}),
    )
    .await;
    assert_eq!(info["run_info"]["status"], "KILLED");
    let native: Value = app
        .get(&format!("/api/v1/runs/{id}"))
        .await
        .json()
        .await
        .expect("run");
    assert_eq!(native["status"], "stopped");
}

async fn bad_requests_answer_with_the_codes_the_client_expects(app: &TestApp) {
    let id = mlflow_run(app, "0", "target").await;
    ok(
        app,
        Method::POST,
        "runs/log-parameter",
        json!({"run_id": id, "key": "lr", "value": "0.1"}),
    )
    .await;
    ok(
        app,
        Method::POST,
        "experiments/create",
        json!({"name": "taken"}),
    )
    .await;
    let metrics: Vec<Value> = (0..1001)
        .map(|i| json!({"key": "m", "value": 1.0, "timestamp": 1, "step": i}))
        .collect();
    let missing = "0123456789abcdef0123456789abcdef";
    let cases: Vec<(Method, &str, Value, StatusCode, &str, &str)> = vec![
        (
            Method::GET,
            "runs/get",
            json!({"run_id": missing}),
            StatusCode::NOT_FOUND,
            "RESOURCE_DOES_NOT_EXIST",
            "not found",
        ),
        (
            Method::GET,
            "runs/get",
            json!({}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "run_id",
        ),
        (
            Method::POST,
            "experiments/create",
            json!({"name": "taken"}),
            StatusCode::BAD_REQUEST,
            "RESOURCE_ALREADY_EXISTS",
            "taken",
        ),
        (
            Method::GET,
            "experiments/get-by-name",
            json!({"experiment_name": "nope"}),
            StatusCode::NOT_FOUND,
            "RESOURCE_DOES_NOT_EXIST",
            "nope",
        ),
        (
            Method::POST,
            "runs/log-batch",
            json!({"run_id": id, "metrics": metrics}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "at most 1000 metrics",
        ),
        (
            Method::POST,
            "runs/log-parameter",
            json!({"run_id": id, "key": "lr", "value": "0.2"}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "write-once",
        ),
        (
            Method::POST,
            "runs/search",
            json!({"experiment_ids": ["0"], "filter": "metrics.a >"}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "filter",
        ),
        (
            Method::POST,
            "runs/search",
            json!({"experiment_ids": ["0"], "run_view_type": "SOME"}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "run_view_type",
        ),
        (
            Method::POST,
            "runs/search",
            json!({"experiment_ids": ["0"], "max_results": 50001}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "max_results",
        ),
        (
            Method::POST,
            "runs/log-metric",
            json!({"run_id": id, "key": "bad\u{1}key", "value": 1, "timestamp": 1}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "metrics[0].key",
        ),
        (
            Method::POST,
            "runs/log-metric",
            json!({"run_id": id, "key": "loss", "value": 1, "step": -1}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "step",
        ),
        (
            Method::POST,
            "runs/log-metric",
            json!({"run_id": id, "key": "loss", "value": "high"}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "not a number",
        ),
        (
            Method::POST,
            "runs/update",
            json!({"run_id": id, "run_name": "a\nb"}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "run_name",
        ),
        (
            Method::POST,
            "experiments/delete",
            json!({"experiment_id": "0"}),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            "cannot be deleted",
        ),
        (
            Method::GET,
            "no/such-endpoint",
            json!({}),
            StatusCode::NOT_FOUND,
            "ENDPOINT_NOT_FOUND",
            "no MLflow endpoint",
        ),
    ];
    for (method, path, body, status, code, words) in cases {
        let (got, json) = call(app, method, path, body.clone()).await;
        assert_eq!(got, status, "{path} {body}: {json}");
        assert_eq!(json["error_code"], code, "{path} {body}: {json}");
        let message = json["message"].as_str().unwrap_or("");
        assert!(
            message.contains(words),
            "{path}: `{message}` should say `{words}`"
        );
        assert!(!message.contains("Some("), "{message}");
    }
    // Bad JSON syntax, and a refused batch stored nothing of itself.
    let raw = app
        .send_raw(
            Method::POST,
            "/api/2.0/mlflow/runs/log-batch",
            "{\"run_id\": ",
        )
        .await;
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    let got = ok(app, Method::GET, "runs/get", json!({"run_id": id})).await;
    assert_eq!(got["run"]["data"]["metrics"], json!([]));
    assert_eq!(
        pairs(&got["run"]["data"]["params"]),
        [("lr".to_owned(), "0.1".to_owned())]
    );
}

async fn deleted_runs_and_experiments_leave_the_lists_until_restored(app: &TestApp) {
    let created = ok(
        app,
        Method::POST,
        "experiments/create",
        json!({"name": "trash"}),
    )
    .await;
    let experiment = created["experiment_id"].as_str().expect("id").to_owned();
    assert!(
        experiment.parse::<u64>().is_ok_and(|n| n >= 1),
        "{experiment}"
    );
    let run = mlflow_run(app, &experiment, "doomed").await;
    ok(app, Method::POST, "runs/delete", json!({"run_id": run})).await;
    let listed = app
        .get_query("/api/v1/runs", &[("experiment", experiment.as_str())])
        .await;
    assert_eq!(
        listed["runs"],
        json!([]),
        "a deleted run leaves the runs table"
    );
    let (status, json) = call(
        app,
        Method::POST,
        "runs/log-metric",
        json!({"run_id": run, "key": "x", "value": 1, "timestamp": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    let deleted = ok(
        app,
        Method::POST,
        "runs/search",
        json!({"experiment_ids": [experiment], "run_view_type": "DELETED_ONLY"}),
    )
    .await;
    assert_eq!(deleted["runs"][0]["info"]["lifecycle_stage"], "deleted");
    ok(app, Method::POST, "runs/restore", json!({"run_id": run})).await;
    let listed = app
        .get_query("/api/v1/runs", &[("experiment", experiment.as_str())])
        .await;
    assert_eq!(listed["runs"][0]["id"], run.as_str());

    ok(
        app,
        Method::POST,
        "experiments/delete",
        json!({"experiment_id": experiment}),
    )
    .await;
    let native: Value = app
        .get("/api/v1/experiments")
        .await
        .json()
        .await
        .expect("list");
    assert!(
        !native["experiments"]
            .as_array()
            .expect("experiments")
            .iter()
            .any(|e| e["id"] == experiment.as_str()),
        "{native}"
    );
    let (status, json) = call(
        app,
        Method::POST,
        "runs/create",
        json!({"experiment_id": experiment}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert!(
        json["message"].as_str().unwrap_or("").contains("deleted"),
        "{json}"
    );
    ok(
        app,
        Method::POST,
        "experiments/restore",
        json!({"experiment_id": experiment}),
    )
    .await;
    mlflow_run(app, &experiment, "after restore").await;
}

async fn artifacts_are_uploaded_listed_downloaded_and_kept_inside_the_run(app: &TestApp) {
    let run = mlflow_run(app, "0", "with files").await;
    let base = format!("/api/2.0/mlflow-artifacts/artifacts/0/{run}/artifacts");
    let put = app
        .client
        .put(app.url(&format!("{base}/plots/loss.txt")))
        .body("hello")
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), StatusCode::OK);
    let listed = ok(app, Method::GET, "artifacts/list", json!({"run_id": run})).await;
    assert_eq!(listed["files"][0]["path"], "plots");
    assert_eq!(listed["files"][0]["is_dir"], true);
    let inner = app
        .get_query(
            "/api/2.0/mlflow-artifacts/artifacts",
            &[("path", &format!("0/{run}/artifacts/plots"))],
        )
        .await;
    assert_eq!(inner["files"][0]["path"], "loss.txt");
    assert_eq!(inner["files"][0]["file_size"], 5);
    let got = app.get(&format!("{base}/plots/loss.txt")).await;
    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(got.text().await.expect("body"), "hello");
    // The run page serves the same file.
    let page = app
        .get(&format!("/runs/{run}/artifacts/plots/loss.txt"))
        .await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.text().await.expect("body"), "hello");
    let html = app
        .get(&format!("/runs/{run}"))
        .await
        .text()
        .await
        .expect("page");
    assert!(
        html.contains("plots/loss.txt"),
        "the run page lists the artifact"
    );
    // A name longer than the file system takes is the client's mistake, named, not a 500.
    let long = format!("plots/{}.txt", "n".repeat(300));
    let r = app
        .client
        .put(app.url(&format!("{base}/{long}")))
        .body("x")
        .send()
        .await
        .expect("put");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let error: serde_json::Value = r.json().await.expect("error body");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("path:") && message.contains("255"),
        "{error}"
    );
    // Paths never leave the run's folder, and a file of another experiment's path is refused.
    for bad in ["..%2F..%2Ftrainyard.db", "a/..%2F..%2Fx"] {
        let r = app
            .client
            .put(app.url(&format!("{base}/{bad}")))
            .body("x")
            .send()
            .await
            .expect("put");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    let elsewhere = app
        .get(&format!(
            "/api/2.0/mlflow-artifacts/artifacts/7/{run}/artifacts/plots/loss.txt"
        ))
        .await;
    assert_eq!(elsewhere.status(), StatusCode::NOT_FOUND);
}

/// A link planted in a run's artifacts (the run's own process can write there) never lets an
/// upload make a folder or a file outside the run: it is refused before anything is made.
async fn an_upload_through_a_planted_link_is_refused_before_anything_is_made(app: &TestApp) {
    let run = mlflow_run(app, "0", "with a link").await;
    let base = format!("/api/2.0/mlflow-artifacts/artifacts/0/{run}/artifacts");
    let put = |path: String| {
        app.client
            .put(app.url(&format!("{base}/{path}")))
            .body("x")
            .send()
    };
    assert_eq!(
        put("plots/loss.txt".into()).await.expect("put").status(),
        StatusCode::OK
    );
    let root = trainyard::launcher::run_dir(&app.state.settings.data_dir, &run).join("artifacts");
    let outside = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(outside.path(), root.join("escape")).expect("link");
    for path in ["escape/made/f.txt", "escape/f.txt", "escape/a/b/c/f.txt"] {
        let r = put(path.into()).await.expect("put");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path}");
        let body: Value = r.json().await.expect("json");
        assert_eq!(body["error_code"], "INVALID_PARAMETER_VALUE", "{body}");
    }
    let made: Vec<_> = std::fs::read_dir(outside.path())
        .expect("read dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(made.is_empty(), "made outside the run: {made:?}");

    // A link that stays inside the run's artifacts is followed.
    std::os::unix::fs::symlink(root.join("plots"), root.join("alias")).expect("link");
    assert_eq!(
        put("alias/new/x.txt".into()).await.expect("put").status(),
        StatusCode::OK
    );
    assert!(root.join("plots/new/x.txt").is_file());

    // A run whose artifact folder itself is a link to elsewhere: refused, nothing made there.
    let other = mlflow_run(app, "0", "linked folder").await;
    let other_dir = trainyard::launcher::run_dir(&app.state.settings.data_dir, &other);
    std::fs::create_dir_all(&other_dir).expect("run dir");
    std::os::unix::fs::symlink(outside.path(), other_dir.join("artifacts")).expect("link");
    let r = app
        .client
        .put(app.url(&format!(
            "/api/2.0/mlflow-artifacts/artifacts/0/{other}/artifacts/sub/f.txt"
        )))
        .body("x")
        .send()
        .await
        .expect("put");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        std::fs::read_dir(outside.path()).expect("read dir").count(),
        0
    );
}

/// MLflow's browser UI calls the same routes under `/ajax-api/`, with the same answers and the
/// same access check.
async fn the_ajax_api_prefix_serves_the_same_routes(app: &TestApp) {
    let id = mlflow_run(app, "0", "via ajax").await;
    for prefix in ["/api/2.0/mlflow", "/ajax-api/2.0/mlflow"] {
        let got = app
            .get_query(&format!("{prefix}/runs/get"), &[("run_id", id.as_str())])
            .await;
        assert_eq!(got["run"]["info"]["run_name"], "via ajax", "{prefix}");
    }
    let missing = app
        .get("/ajax-api/2.0/mlflow/runs/get?run_id=0123456789abcdef0123456789abcdef")
        .await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let body: Value = missing.json().await.expect("json");
    assert_eq!(body["error_code"], "RESOURCE_DOES_NOT_EXIST");
}

crate::on_both_backends!(
    the_ajax_api_prefix_serves_the_same_routes,
    a_launched_run_reads_back_through_mlflow_with_its_flattened_config,
    an_mlflow_run_is_a_trainyard_run,
    bad_requests_answer_with_the_codes_the_client_expects,
    deleted_runs_and_experiments_leave_the_lists_until_restored,
    artifacts_are_uploaded_listed_downloaded_and_kept_inside_the_run,
    an_upload_through_a_planted_link_is_refused_before_anything_is_made,
);
