//! What a launch may name: every path of its config lies in a data root, or is a checkpoint of a
//! run the launcher may read; the token cache is the server's or a folder of the run. A user who
//! may launch (everyone may, in `Default`) cannot point a run at another user's files, the
//! database or the server's own `/proc` entry.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use trainyard::app::Settings;

use super::{accounts, add_user, send, sign_in, Auth, PASSWORD};
use crate::helpers::TestApp;
use crate::on_both_backends_with;

on_both_backends_with!(
    accounts_and_no_slots;
    a_user_cannot_launch_a_run_that_reads_or_writes_outside_the_data_roots,
    another_runs_checkpoint_starts_a_launch_only_for_those_who_may_read_that_run,
);

/// Accounts on; launches are admitted and queued, and nothing runs.
fn accounts_and_no_slots(s: &mut Settings) {
    accounts(s);
    s.launcher.gpus = Some(vec![]);
    s.launcher.cpu_slots = 0;
}

fn launch(overrides: Value) -> Value {
    json!({"launch": true, "profile": "tiny", "overrides": overrides})
}

/// A tracked run of `auth`'s in `experiment`, and its directory.
async fn run_of(app: &TestApp, auth: &Auth, experiment: &str) -> (String, std::path::PathBuf) {
    let response = send(
        app,
        auth,
        Method::POST,
        "/api/v1/runs",
        Some(&json!({"experiment": experiment})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let run: Value = response.json().await.expect("run");
    let id = run["id"].as_str().expect("id").to_string();
    let dir = app.state.launcher.data_dir().join("runs").join(&id);
    (id, dir)
}

async fn visible_runs(app: &TestApp, auth: &Auth) -> usize {
    let response = send(app, auth, Method::GET, "/api/v1/runs", None).await;
    let body: Value = response.json().await.expect("runs");
    body["runs"].as_array().map_or(0, Vec::len)
}

async fn a_user_cannot_launch_a_run_that_reads_or_writes_outside_the_data_roots(app: &TestApp) {
    add_user(app, "alice", false).await;
    add_user(app, "bob", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    // Alice's private run holds an artifact and a model directory.
    let (_, alice_dir) = run_of(app, &alice, "alice-private").await;
    let secret = alice_dir.join("artifacts/secret.txt");
    std::fs::create_dir_all(alice_dir.join("artifacts/model")).expect("artifacts");
    std::fs::write(&secret, "alice's private notes").expect("secret");
    std::fs::write(alice_dir.join("artifacts/model/config.json"), "{}").expect("config");
    let (_, bob_dir) = run_of(app, &bob, "Default").await;
    let before = visible_runs(app, &bob).await;

    let environ = format!("/proc/{}/environ", std::process::id());
    let secret = secret.display().to_string();
    let mut cases = vec![
        (
            json!({"data.dataset": secret}),
            "data.dataset",
            secret.clone(),
        ),
        (
            json!({"data.dataset": environ}),
            "data.dataset",
            environ.clone(),
        ),
        (
            json!({"data.tokenizer": secret}),
            "data.tokenizer",
            secret.clone(),
        ),
        (
            json!({"training.init_from": format!("hf:{}", alice_dir.join("artifacts/model").display())}),
            "training.init_from",
            "artifacts/model".to_string(),
        ),
        (
            json!({"training.init_from": alice_dir.join("artifacts").display().to_string()}),
            "training.init_from",
            "artifacts".to_string(),
        ),
        (
            json!({"data.cache_dir": bob_dir.join("artifacts/leak").display().to_string()}),
            "data.cache_dir",
            "token cache".to_string(),
        ),
        (
            json!({"data.cache_dir": "../../cache-elsewhere"}),
            "data.cache_dir",
            "token cache".to_string(),
        ),
    ];
    let database = app.state.launcher.data_dir().join("trainyard.db");
    if database.exists() {
        let database = database.display().to_string();
        cases.push((
            json!({"data.dataset": database}),
            "data.dataset",
            database.clone(),
        ));
    }
    let roots = app.state.launcher.roots().describe();
    for (overrides, field, needle) in cases {
        let response = send(
            app,
            &bob,
            Method::POST,
            "/api/v1/runs",
            Some(&launch(overrides.clone())),
        )
        .await;
        assert_eq!(
            response.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{overrides}"
        );
        let body: Value = response.json().await.expect("error body");
        assert_eq!(body["error"]["field"], field, "{overrides}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&needle), "{overrides}: {message}");
        if field != "data.cache_dir" {
            assert!(
                message.contains("outside the data roots") && message.contains(&roots),
                "{overrides}: {message}"
            );
        }
        assert!(!message.contains("alice's private notes"));
    }
    assert_eq!(visible_runs(app, &bob).await, before, "no run was created");
    // A file in the data root is fine.
    let root = &app.state.launcher.roots().paths()[0];
    std::fs::write(root.join("corpus.txt"), "shared text ".repeat(50)).expect("corpus");
    let mut inside = launch(json!({"data.dataset": "corpus.txt"}));
    inside["working_dir"] = json!(root.display().to_string());
    let response = send(app, &bob, Method::POST, "/api/v1/runs", Some(&inside)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
}

async fn another_runs_checkpoint_starts_a_launch_only_for_those_who_may_read_that_run(
    app: &TestApp,
) {
    add_user(app, "alice", false).await;
    add_user(app, "bob", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    let (_, dir) = run_of(app, &alice, "alice-private").await;
    let best = dir.join("checkpoints/best");
    std::fs::create_dir_all(&best).expect("checkpoint");
    let body = launch(json!({"training.init_from": best.display().to_string()}));

    // Bob may not read Alice's run: refused in the words of any other path, naming no run.
    let response = send(app, &bob, Method::POST, "/api/v1/runs", Some(&body)).await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let error: Value = response.json().await.expect("error body");
    assert_eq!(error["error"]["field"], "training.init_from");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("outside the data roots"), "{message}");

    // Alice may: her fine-tune is admitted and will be allowed to read that checkpoint.
    let mut mine = body.clone();
    mine["experiment"] = json!("alice-private");
    let response = send(app, &alice, Method::POST, "/api/v1/runs", Some(&mine)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let run: Value = response.json().await.expect("run");
    let id = run["id"].as_str().expect("id");
    let record: Value = serde_json::from_slice(
        &std::fs::read(
            app.state
                .launcher
                .data_dir()
                .join("runs")
                .join(id)
                .join("launch.json"),
        )
        .expect("launch.json"),
    )
    .expect("record");
    let canonical = std::fs::canonicalize(&best).expect("canonical");
    assert_eq!(record["read"], json!([canonical.display().to_string()]));
}
