//! The official `mlflow` Python client (pinned in `scripts/mlflow-venv.sh`, which
//! `scripts/test.sh` runs) drives a real server through `server/tests/mlflow/scenario.py`: runs
//! with names and tags, params, metrics over many steps, artifacts, searches, nested runs, every
//! end status, deletion, experiments and errors. Every case of the script asserts what it got
//! back; the test fails with the script's output when one fails.

use std::process::Command;

use reqwest::Method;
use serde_json::{json, Value};

use crate::access::{accounts, add_user, send, sign_in, PASSWORD};
use crate::helpers::TestApp;
use crate::kit;

/// A personal write token of a new user `alice` on a server with accounts.
async fn alices_token(app: &TestApp) -> String {
    add_user(app, "alice", false).await;
    let session = sign_in(app, "alice", PASSWORD).await;
    let r = send(
        app,
        &session,
        Method::POST,
        "/api/v1/tokens",
        Some(&json!({"name": "mlflow", "scope": "write"})),
    )
    .await;
    let body: Value = r.json().await.expect("token");
    body["secret"].as_str().expect("secret").to_owned()
}

async fn run_scenario(app: &TestApp, token: Option<String>) {
    let address = app.address.clone();
    let output = tokio::task::spawn_blocking(move || {
        let mut command = Command::new(kit::mlflow_python());
        command
            .arg(kit::mlflow_scenario())
            .arg(&address)
            .env("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            .env_remove("MLFLOW_TRACKING_USERNAME")
            .env_remove("MLFLOW_TRACKING_PASSWORD");
        match token {
            Some(t) => command.env("MLFLOW_TRACKING_TOKEN", t),
            None => command.env_remove("MLFLOW_TRACKING_TOKEN"),
        };
        command.output().expect("the scenario starts")
    })
    .await
    .expect("scenario");
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "the MLflow scenario failed:\n{said}"
    );
    assert!(said.contains("all 22 cases passed"), "{said}");
}

/// The single-user server of a laptop: no credentials at all.
async fn the_mlflow_client_runs_its_scenario_against_a_local_server(app: &TestApp) {
    run_scenario(app, None).await;
}

/// A team server: the client authenticates with a personal token in `MLFLOW_TRACKING_TOKEN`,
/// and every request goes through the access check (its experiments are the user's own; the
/// Default experiment lets every user add runs).
async fn the_mlflow_client_runs_its_scenario_with_a_personal_token(app: &TestApp) {
    let token = alices_token(app).await;
    run_scenario(app, Some(token)).await;
    // Its runs are alice's, in the native search and through MLflow's `user_id`.
    let runs = app
        .get_query("/api/v1/runs", &[("q", "user = 'alice'")])
        .await;
    let runs = runs["runs"].as_array().expect("runs");
    assert!(!runs.is_empty());
    let experiment = runs[0]["experiment_id"].as_str().expect("experiment");
    let found = super::ok(
        app,
        Method::POST,
        "runs/search",
        json!({"experiment_ids": [experiment], "filter": "attributes.user_id = 'alice'"}),
    )
    .await;
    assert!(
        found["runs"].as_array().is_some_and(|r| !r.is_empty()),
        "{found}"
    );
    assert_eq!(found["runs"][0]["info"]["user_id"], "alice");
}

crate::on_both_backends!(the_mlflow_client_runs_its_scenario_against_a_local_server);
crate::on_both_backends_with!(accounts; the_mlflow_client_runs_its_scenario_with_a_personal_token);
