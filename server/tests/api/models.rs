//! The model registry through Trainyard's own API: a run's checkpoint registered as a version,
//! an alias on it, the models listing and a model's versions with their runs, and a launch whose
//! `training.init_from` is `model:NAME@ALIAS`, admitted as the checkpoint it names.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::export::{small_model, write_checkpoint};
use crate::helpers::{assert_error, TestApp};
use crate::on_both_backends;

on_both_backends!(
    a_registered_checkpoint_is_aliased_listed_and_launched_from_by_its_alias,
    a_launch_from_a_model_reference_that_names_no_checkpoint_is_refused_naming_the_key,
);

async fn send(app: &TestApp, method: Method, path: &str, body: &Value) -> reqwest::Response {
    app.send_raw(method, path, &body.to_string()).await
}

/// A tiny launch (admitted only: this server's launcher runs nothing in these tests) that
/// starts from `init_from`.
fn launch_from(init_from: &str) -> Value {
    json!({
        "launch": true, "experiment": "models", "profile": "tiny",
        // The model the checkpoint was trained with (`small_model`): a fine-tune keeps it.
        "overrides": {"training.init_from": init_from, "training.max_steps": 1,
                      "training.warmup_steps": 0, "training.device": "cpu",
                      "model.vocab_size": 256, "model.d_model": 32, "model.n_layers": 2,
                      "model.n_heads": 4, "model.d_ff": 64, "model.max_seq_len": 32,
                      "training.seq_len": 16, "training.batch_size": 2},
    })
}

async fn a_registered_checkpoint_is_aliased_listed_and_launched_from_by_its_alias(app: &TestApp) {
    let scratch = tempfile::tempdir().expect("scratch");
    let run = app.create_run("models").await;
    write_checkpoint(
        &app.state.launcher.run_dir(&run),
        small_model(),
        &scratch.path().join("cache"),
    );
    let listed = app
        .get_json(&format!("/api/v1/runs/{run}/checkpoints"))
        .await;
    let name = listed["checkpoints"][0]["name"]
        .as_str()
        .expect("a checkpoint")
        .to_owned();
    let r = app
        .post_json(
            &format!("/api/v1/runs/{run}/checkpoints/{name}/register"),
            &json!({"model": "lm", "description": "first try"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let version: Value = r.json().await.expect("version");
    assert_eq!(version["version"], 1, "{version}");
    assert_eq!(version["run_id"], run.as_str(), "{version}");
    let source = version["source"].as_str().expect("source").to_owned();
    assert!(source.starts_with("checkpoint:step-"), "{version}");
    let missing = app
        .post_json(
            &format!("/api/v1/runs/{run}/checkpoints/step-999/register"),
            &json!({"model": "lm"}),
        )
        .await;
    assert_error(missing, StatusCode::NOT_FOUND, "not_found", None).await;

    let aliased = send(
        app,
        Method::PUT,
        "/api/v1/models/lm/aliases/champion",
        &json!({"version": 1}),
    )
    .await;
    assert_eq!(aliased.status(), StatusCode::OK);
    let nowhere = send(
        app,
        Method::PUT,
        "/api/v1/models/lm/aliases/champion",
        &json!({"version": 7}),
    )
    .await;
    assert_error(nowhere, StatusCode::NOT_FOUND, "not_found", None).await;

    let listed = app.get_json("/api/v1/models").await;
    assert_eq!(listed["models"][0]["name"], "lm", "{listed}");
    assert_eq!(listed["models"][0]["aliases"]["champion"], 1, "{listed}");
    let detail = app.get_json("/api/v1/models/lm").await;
    assert_eq!(detail["versions"][0]["run_id"], run.as_str(), "{detail}");
    assert_eq!(
        detail["versions"][0]["aliases"],
        json!(["champion"]),
        "{detail}"
    );
    // The registry's changes are in the audit log.
    let audit = app.get_json("/api/v1/audit").await;
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert!(
        actions.contains(&"model_version_create") && actions.contains(&"model_alias"),
        "{audit}"
    );

    let launched = app
        .post_json("/api/v1/runs", &launch_from("model:lm@champion"))
        .await;
    let status = launched.status();
    let launched: Value = launched.json().await.expect("run");
    assert_eq!(status, StatusCode::CREATED, "{launched}");
    let checkpoint = source.trim_start_matches("checkpoint:");
    let init = launched["config"]["training"]["init_from"]
        .as_str()
        .expect("init_from");
    assert!(
        init.ends_with(&format!("runs/{run}/checkpoints/{checkpoint}")),
        "the alias resolved to the checkpoint: {launched}"
    );
    assert_eq!(
        launched["tags"]["trainyard.init_model"], "model:lm@champion -> version 1",
        "{launched}"
    );
}

async fn a_launch_from_a_model_reference_that_names_no_checkpoint_is_refused_naming_the_key(
    app: &TestApp,
) {
    let before = app.get_json("/api/v1/runs").await["runs"]
        .as_array()
        .map_or(0, Vec::len);
    for (reference, says) in [
        ("model:nope@champion", "no registered model `nope`"),
        ("model:lm", "not a model reference"),
    ] {
        let refused = app.post_json("/api/v1/runs", &launch_from(reference)).await;
        let error = assert_error(
            refused,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            Some("training.init_from"),
        )
        .await;
        assert!(
            error["message"].as_str().is_some_and(|m| m.contains(says)),
            "{reference}: {error}"
        );
    }
    // A version made of MLflow artifacts is not a checkpoint to start from.
    let run = app.create_run("models").await;
    let store = &app.state.store;
    store
        .create_model(trainyard::store::models::NewModel {
            name: "mlflow-lm".into(),
            experiment_id: "0".into(),
            ..Default::default()
        })
        .await
        .expect("model");
    store
        .create_version(
            "mlflow-lm",
            trainyard::store::models::NewVersion {
                run_id: Some(run.clone()),
                source: format!("mlflow-artifacts:/0/{run}/artifacts/model"),
                ..Default::default()
            },
        )
        .await
        .expect("version");
    let refused = app
        .post_json("/api/v1/runs", &launch_from("model:mlflow-lm/latest"))
        .await;
    let error = assert_error(
        refused,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unprocessable",
        Some("training.init_from"),
    )
    .await;
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("not a checkpoint")),
        "{error}"
    );
    let after = app.get_json("/api/v1/runs").await["runs"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(after, before + 1, "only the one tracked run was created");
}
