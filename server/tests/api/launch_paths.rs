//! Paths in a launched run's config: relative ones resolve against the request's `working_dir`
//! (else the server's working directory) and are stored absolute, what the run reads must exist
//! at admission, and every launched run shares the server's one token cache.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use trainyard::app::Settings;

use crate::helpers::{assert_error, TestApp};
use crate::{on_both_backends, on_both_backends_with};

on_both_backends!(a_launch_whose_data_is_missing_is_refused_naming_the_key_and_creates_no_run);

on_both_backends_with!(
    with_the_trainer;
    relative_data_paths_resolve_against_working_dir_and_launched_runs_share_one_token_cache,
);

/// Launched runs run this build's `trainyard train` on CPU slots.
fn with_the_trainer(settings: &mut Settings) {
    settings.launcher.gpus = Some(vec![]);
    settings.launcher.cpu_slots = 2;
    settings.launcher.trainer_bin = Some(PathBuf::from(env!("CARGO_BIN_EXE_trainyard")));
}

/// A directory of a few short text files, each one document.
fn corpus(root: &Path) {
    let dir = root.join("corpus");
    std::fs::create_dir_all(&dir).expect("corpus dir");
    for i in 0..12 {
        let text = format!("document {i}: the quick brown fox jumps over the lazy dog. ").repeat(8);
        std::fs::write(dir.join(format!("doc{i:02}.txt")), text).expect("write doc");
    }
}

/// A tiny CPU launch reading `dataset`.
fn tiny_launch(dataset: &str, working_dir: Option<&Path>) -> Value {
    let mut body = json!({
        "launch": true,
        "profile": "tiny",
        "overrides": {
            "data.dataset": dataset,
            "data.tokenizer": "bytes",
            "data.val_fraction": 0.3,
            "training.max_steps": 3,
            "training.save_steps": 1000,
            "training.eval_steps": 0,
            "training.batch_size": 2,
            "training.seq_len": 16,
            "training.warmup_steps": 1,
            "training.device": "cpu",
            "training.threads": 1,
            "logging.flush_interval_ms": 100,
        },
    });
    if let Some(dir) = working_dir {
        body["working_dir"] = json!(dir.display().to_string());
    }
    body
}

async fn wait_until_ended(app: &TestApp, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let run = app.get_json(&format!("/api/v1/runs/{id}")).await;
        if matches!(
            run["status"].as_str(),
            Some("finished" | "failed" | "stopped")
        ) {
            return run;
        }
        assert!(Instant::now() < deadline, "run {id} did not end: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn relative_data_paths_resolve_against_working_dir_and_launched_runs_share_one_token_cache(
    app: &TestApp,
) {
    let here = app.project_dir();
    corpus(here.path());
    let expected = here.path().join("corpus").display().to_string();
    let cache = app.state.launcher.data_dir().join("cache").join("tokens");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let response = app
            .post_json("/api/v1/runs", &tiny_launch("corpus", Some(here.path())))
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let run: Value = response.json().await.expect("run");
        let id = run["id"].as_str().expect("id").to_string();
        assert_eq!(run["params"]["data.dataset"], expected.as_str(), "{run}");
        assert_eq!(
            run["params"]["data.cache_dir"],
            cache.display().to_string().as_str(),
            "{run}"
        );
        // The run's config file says the same.
        let run_dir = app.state.launcher.data_dir().join("runs").join(&id);
        let config: Value = serde_json::from_slice(
            &std::fs::read(run_dir.join("config.json")).expect("config.json"),
        )
        .expect("config JSON");
        assert_eq!(config["data"]["dataset"], expected.as_str());
        ids.push(id);
    }
    for id in &ids {
        let run = wait_until_ended(app, id).await;
        let log = app
            .get(&format!("/api/v1/runs/{id}/logs"))
            .await
            .text()
            .await
            .expect("log");
        assert_eq!(run["status"], "finished", "{run}\n{log}");
        let run_dir = app.state.launcher.data_dir().join("runs").join(id);
        assert!(
            !run_dir.join(".trainyard-cache").exists(),
            "no token cache inside the run directory"
        );
    }
    // Both runs tokenized the same corpus into the one shared cache: one entry.
    let entries: Vec<String> = std::fs::read_dir(&cache)
        .expect("the server's token cache exists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with('.'))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
}

async fn run_count(app: &TestApp) -> usize {
    app.get_json("/api/v1/runs").await["runs"]
        .as_array()
        .expect("runs")
        .len()
}

async fn a_launch_whose_data_is_missing_is_refused_naming_the_key_and_creates_no_run(
    app: &TestApp,
) {
    let here = app.project_dir();
    let root = here.path().display().to_string();
    let server_dir = std::env::current_dir().expect("cwd").display().to_string();
    let mut tokenizer = tiny_launch("demo", Some(here.path()));
    tokenizer["overrides"]["data.tokenizer"] = json!("tok/tokenizer.json");
    let mut not_absolute = tiny_launch("demo", None);
    not_absolute["working_dir"] = json!("some/dir");
    let cases = [
        (
            tiny_launch("corpus/train.txt", Some(here.path())),
            "data.dataset",
            format!("{root}/corpus/train.txt does not exist"),
        ),
        (
            tiny_launch("shards/*.jsonl", Some(here.path())),
            "data.dataset",
            format!("no file matches {root}/shards/*.jsonl"),
        ),
        (
            tokenizer,
            "data.tokenizer",
            format!("{root}/tok/tokenizer.json does not exist"),
        ),
        // Without working_dir, against the server's own working directory.
        (
            tiny_launch("no-such-corpus.txt", None),
            "data.dataset",
            format!("{server_dir}/no-such-corpus.txt does not exist"),
        ),
        (not_absolute, "working_dir", "absolute".to_string()),
    ];
    for (body, field, needle) in cases {
        let response = app.post_json("/api/v1/runs", &body).await;
        let error = assert_error(
            response,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            Some(field),
        )
        .await;
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(&needle), "{message}");
        assert!(!message.contains("os error"), "{message}");
    }
    assert_eq!(run_count(app).await, 0, "no run may be created");
}
