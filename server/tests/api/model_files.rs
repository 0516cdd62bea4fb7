//! A registered model version's files through the native API: the checkpoint it points at as a
//! tar archive, the same checkpoint as a Hugging Face directory, and the refusals for a version
//! that is not a checkpoint, a version that does not exist and a version that is not a number.

use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::json;

use crate::export::{small_model, write_checkpoint};
use crate::helpers::{assert_error, TestApp};
use crate::on_both_backends;

on_both_backends!(
    a_checkpoint_version_downloads_as_its_checkpoint_and_as_a_hugging_face_directory,
    a_version_that_is_not_a_checkpoint_here_says_why_it_has_no_download,
);

/// Downloads `path` (a tar archive holding the folder `root`) and unpacks it under `into`.
async fn unpack(app: &TestApp, path: &str, root: &str, into: &Path) -> PathBuf {
    let response = app.get(path).await;
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "application/x-tar");
    let disposition = headers["content-disposition"].to_str().expect("ascii");
    assert!(
        disposition.contains(&format!("\"{root}.tar\"")),
        "{disposition}"
    );
    let length: u64 = headers["content-length"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a number");
    let bytes = response.bytes().await.expect("the archive");
    assert_eq!(bytes.len() as u64, length, "the announced length");
    std::fs::create_dir_all(into).expect("dir");
    let tar = into.join("download.tar");
    std::fs::write(&tar, &bytes).expect("write the archive");
    let status = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .current_dir(into)
        .status()
        .expect("tar");
    assert!(status.success(), "tar unpacks the archive");
    std::fs::remove_file(&tar).expect("remove the archive");
    into.join(root)
}

/// The plain, visible files of `dir` with their bytes, by name.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("a directory")
        .map(|e| e.expect("entry"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .map(|n| {
            let bytes = std::fs::read(dir.join(&n)).expect("file");
            (n, bytes)
        })
        .collect();
    out.sort();
    out
}

async fn a_checkpoint_version_downloads_as_its_checkpoint_and_as_a_hugging_face_directory(
    app: &TestApp,
) {
    let scratch = tempfile::tempdir().expect("scratch");
    let run = app.create_run("models").await;
    let run_dir = app.state.launcher.run_dir(&run);
    write_checkpoint(&run_dir, small_model(), &scratch.path().join("cache"));
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
            &json!({"model": "tiny-lm"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let checkpoint_dir = trainer::checkpoint::checkpoints_dir(&run_dir).join(&name);

    let got = unpack(
        app,
        "/api/v1/models/tiny-lm/versions/1/archive",
        "tiny-lm-v1",
        &scratch.path().join("archive"),
    )
    .await;
    let want = files(&checkpoint_dir);
    assert!(!want.is_empty());
    assert!(
        files(&got) == want,
        "the archive holds the checkpoint's files"
    );

    let got = unpack(
        app,
        "/api/v1/models/tiny-lm/versions/1/export/hf",
        "tiny-lm-v1-hf",
        &scratch.path().join("hf"),
    )
    .await;
    let direct = scratch.path().join("direct");
    trainer::hf::export::export(&checkpoint_dir, &direct, true).expect("export");
    let names: Vec<String> = files(&got).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    assert!(files(&got) == files(&direct), "the exporter's files");
    // The export's working copy is gone once the download is read, and the checkpoint is
    // untouched.
    let exports = run_dir.join(".exports");
    for _ in 0..200 {
        let left = std::fs::read_dir(&exports).map_or(0, |d| d.count());
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(std::fs::read_dir(&exports).map_or(0, |d| d.count()), 0);
    assert!(files(&checkpoint_dir) == want);
}

async fn a_version_that_is_not_a_checkpoint_here_says_why_it_has_no_download(app: &TestApp) {
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
    store
        .create_version(
            "mlflow-lm",
            trainyard::store::models::NewVersion {
                run_id: Some(run.clone()),
                source: "checkpoint:step-000007".into(),
                ..Default::default()
            },
        )
        .await
        .expect("version");
    for (path, says) in [
        (
            "/api/v1/models/mlflow-lm/versions/1/archive",
            "not a checkpoint",
        ),
        (
            "/api/v1/models/mlflow-lm/versions/1/export/hf",
            "not a checkpoint",
        ),
        (
            "/api/v1/models/mlflow-lm/versions/2/archive",
            "no longer on this server",
        ),
        ("/api/v1/models/mlflow-lm/versions/9/archive", "not found"),
    ] {
        let error = assert_error(
            app.get(path).await,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        )
        .await;
        assert!(
            error["message"].as_str().is_some_and(|m| m.contains(says)),
            "{path}: {error}"
        );
    }
    let refused = app
        .get("/api/v1/models/mlflow-lm/versions/latest/archive")
        .await;
    assert_error(
        refused,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unprocessable",
        Some("version"),
    )
    .await;
}
