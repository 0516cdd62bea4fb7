//! `GET /api/v1/runs/{id}/export/hf`: a finished run's model as the Hugging Face directory
//! `trainyard export --format hf` writes, in a tar archive; refusals that say why; and a launch
//! with `training.init_from: hf:PATH` starting from what was downloaded.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::Device;
use reqwest::StatusCode;
use serde_json::{json, Value};
use trainer::config::{Config, ModelConfig, NormKind};
use trainer::train::Trainer;
use trainyard::app::Settings;

use crate::helpers::{assert_error, spawn_app, spawn_app_with, TestApp};

const HF_FILES: [&str; 4] = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// A GPT-2-shaped model small enough to train a step in a moment.
pub(crate) fn small_model() -> ModelConfig {
    ModelConfig {
        vocab_size: 256,
        d_model: 32,
        n_layers: 2,
        n_heads: 4,
        d_ff: 64,
        max_seq_len: 32,
        ..ModelConfig::default()
    }
}

/// Trains `model` for one step on the synthetic data and saves its checkpoint in `run_dir`, as a
/// launched run's trainer does.
pub(crate) fn write_checkpoint(run_dir: &Path, model: ModelConfig, cache: &Path) {
    let mut cfg = Config {
        model,
        ..Config::default()
    };
    cfg.training.batch_size = 2;
    cfg.training.seq_len = 16;
    cfg.training.max_steps = 10;
    cfg.training.warmup_steps = 0;
    cfg.training.device = "cpu".parse().expect("the CPU device");
    cfg.training.eval_iters = 1;
    cfg.data.cache_dir = cache.display().to_string();
    cfg.validate().expect("a valid config");
    let mut trainer = Trainer::new(cfg, Device::Cpu).expect("trainer");
    trainer.step().expect("step");
    trainer.save_checkpoint(run_dir).expect("checkpoint");
}

async fn set_status(app: &TestApp, id: &str, status: &str) {
    let response = app
        .patch_json(&format!("/api/v1/runs/{id}"), &json!({ "status": status }))
        .await;
    assert_eq!(response.status(), StatusCode::OK, "setting status {status}");
}

/// Downloads the export of run `id`, checks the archive's length, and unpacks it with the
/// system's tar into `into`; returns the unpacked folder.
async fn download_export(app: &TestApp, id: &str, into: &Path) -> PathBuf {
    let response = app.get(&format!("/api/v1/runs/{id}/export/hf")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "application/x-tar");
    let disposition = headers["content-disposition"].to_str().expect("ascii");
    assert!(
        disposition.contains(&format!("{id}-hf.tar")),
        "{disposition}"
    );
    let length: u64 = headers["content-length"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a number");
    let bytes = response.bytes().await.expect("the archive");
    assert_eq!(bytes.len() as u64, length, "the announced length");
    let tar = into.join("export.tar");
    std::fs::write(&tar, &bytes).expect("write the archive");
    let status = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .current_dir(into)
        .status()
        .expect("tar");
    assert!(status.success(), "tar unpacks the archive");
    std::fs::remove_file(&tar).expect("remove the archive");
    into.join(format!("{id}-hf"))
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("a directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// What a download leaves in the run directory: the export's own folder is removed once the
/// download has ended (just after its last byte), so this waits for that a while.
async fn exports_left(run_dir: &Path) -> Vec<String> {
    let exports = run_dir.join(".exports");
    for _ in 0..200 {
        if !exports.exists() || names_in(&exports).is_empty() {
            return Vec::new();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    names_in(&exports)
}

#[tokio::test]
async fn a_finished_runs_model_downloads_as_the_directory_the_hugging_face_exporter_writes() {
    let app = spawn_app().await;
    let scratch = tempfile::tempdir().expect("scratch");
    let id = app.create_run("export").await;
    let run_dir = app.state.launcher.run_dir(&id);
    write_checkpoint(&run_dir, small_model(), &scratch.path().join("cache"));
    set_status(&app, &id, "running").await;
    set_status(&app, &id, "finished").await;

    let unpacked = download_export(&app, &id, scratch.path()).await;
    assert_eq!(names_in(&unpacked), HF_FILES);
    // The same files, byte for byte, as `trainyard export --format hf RUN_DIR OUT_DIR` writes.
    let direct = scratch.path().join("direct");
    trainer::hf::export::export(&run_dir, &direct, true).expect("export");
    for name in HF_FILES {
        let got = std::fs::read(unpacked.join(name)).expect("downloaded file");
        let want = std::fs::read(direct.join(name)).expect("exported file");
        assert!(got == want, "{name} differs from the exporter's");
    }
    let config: Value =
        serde_json::from_slice(&std::fs::read(unpacked.join("config.json")).expect("config"))
            .expect("config.json is JSON");
    assert_eq!(config["architectures"], json!(["GPT2LMHeadModel"]));
    assert_eq!(config["n_embd"], 32, "{config}");

    // The export is written for the download and removed after it: the run keeps only its
    // checkpoint, and a second download exports again.
    assert_eq!(exports_left(&run_dir).await, Vec::<String>::new());
    let checkpoints = app
        .get_json(&format!("/api/v1/runs/{id}/checkpoints"))
        .await;
    assert_eq!(checkpoints["checkpoints"].as_array().map(Vec::len), Some(1));
    let again = scratch.path().join("again");
    std::fs::create_dir(&again).expect("dir");
    let unpacked = download_export(&app, &id, &again).await;
    assert_eq!(names_in(&unpacked), HF_FILES);
}

/// What a refused export's run is like.
enum Setup {
    /// A GPT-2-shaped checkpoint, then these statuses.
    Checkpoint(&'static [&'static str]),
    /// No checkpoint at all, finished.
    NoCheckpoint,
    /// A finished run whose model (learned positions with RMSNorm) no architecture fits.
    Unfit,
}

#[tokio::test]
async fn an_export_is_refused_with_the_reason_when_the_run_has_none_to_give() {
    let app = spawn_app().await;
    let scratch = tempfile::tempdir().expect("scratch");
    let cache = scratch.path().join("cache");
    let data_dir = app.state.launcher.data_dir().display().to_string();
    let cases = [
        (Setup::Checkpoint(&["running"]), "has status running"),
        (
            Setup::Checkpoint(&["running", "failed"]),
            "has status failed",
        ),
        (
            Setup::Checkpoint(&["running", "stopped"]),
            "has status stopped",
        ),
        (Setup::NoCheckpoint, "no checkpoint"),
        (Setup::Unfit, "cannot be exported to Hugging Face format"),
    ];
    for (setup, needle) in cases {
        let id = app.create_run("refused").await;
        let run_dir = app.state.launcher.run_dir(&id);
        let statuses: &[&str] = match setup {
            Setup::Checkpoint(statuses) => {
                write_checkpoint(&run_dir, small_model(), &cache);
                statuses
            }
            Setup::NoCheckpoint => &["running", "finished"],
            Setup::Unfit => {
                let model = ModelConfig {
                    norm: NormKind::RmsNorm,
                    ..small_model()
                };
                write_checkpoint(&run_dir, model, &cache);
                &["running", "finished"]
            }
        };
        for status in statuses {
            set_status(&app, &id, status).await;
        }
        let response = app.get(&format!("/api/v1/runs/{id}/export/hf")).await;
        let error = assert_error(response, StatusCode::CONFLICT, "conflict", None).await;
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{needle}: {message}");
        assert!(!message.contains(&data_dir), "no server path in: {message}");
        assert_eq!(exports_left(&run_dir).await, Vec::<String>::new());
    }
    // Ids that are no run's: unknown, malformed, or trying to leave the runs directory.
    for id in [
        "0123456789abcdef0123456789abcdef",
        "not-an-id",
        "..%2F..%2Ftrainyard.db",
        "%2E%2E",
    ] {
        let response = app.get(&format!("/api/v1/runs/{id}/export/hf")).await;
        let status = response.status();
        assert!(status.is_client_error(), "{id}: {status}");
        let body: Value = response.json().await.expect("a JSON error");
        assert!(body["error"]["message"].is_string(), "{id}: {body}");
    }
}

/// Launched runs run this build's `trainyard train` on CPU slots.
fn with_the_trainer(settings: &mut Settings) {
    settings.launcher.gpus = Some(vec![]);
    settings.launcher.cpu_slots = 1;
    settings.launcher.trainer_bin = Some(PathBuf::from(env!("CARGO_BIN_EXE_trainyard")));
}

/// A tiny CPU launch from `working_dir`, with extra overrides.
fn tiny_launch(working_dir: &Path, extra: Value) -> Value {
    let mut overrides = json!({
        "data.dataset": "demo",
        "data.tokenizer": "bytes",
        "data.val_fraction": 0.3,
        "model.d_model": 32,
        "model.d_ff": 64,
        "training.max_steps": 3,
        "training.save_steps": 1000,
        "training.eval_steps": 0,
        "training.batch_size": 2,
        "training.seq_len": 16,
        "training.warmup_steps": 1,
        "training.device": "cpu",
        "training.threads": 1,
        "logging.flush_interval_ms": 100,
    });
    for (k, v) in extra.as_object().expect("an object") {
        overrides[k] = v.clone();
    }
    json!({
        "launch": true,
        "profile": "tiny",
        "working_dir": working_dir.display().to_string(),
        "overrides": overrides,
    })
}

async fn launch(app: &TestApp, body: &Value) -> Value {
    let response = app.post_json("/api/v1/runs", body).await;
    let status = response.status();
    let run: Value = response.json().await.expect("run");
    assert_eq!(status, StatusCode::CREATED, "{run}");
    run
}

async fn wait_until_finished(app: &TestApp, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let run = app.get_json(&format!("/api/v1/runs/{id}")).await;
        if matches!(
            run["status"].as_str(),
            Some("finished" | "failed" | "stopped")
        ) {
            let log = app
                .get(&format!("/api/v1/runs/{id}/logs"))
                .await
                .text()
                .await
                .expect("log");
            assert_eq!(run["status"], "finished", "{run}\n{log}");
            return run;
        }
        assert!(Instant::now() < deadline, "run {id} did not end: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_launched_run_offers_its_hugging_face_download_once_finished_and_a_launch_starts_from_it()
{
    let app = spawn_app_with(with_the_trainer).await;
    let here = app.project_dir();
    let first = launch(&app, &tiny_launch(here.path(), json!({}))).await;
    let id = first["id"].as_str().expect("id").to_string();
    let first = wait_until_finished(&app, &id).await;
    let params = first["latest_metrics"]["model/params"]["value"]
        .as_f64()
        .expect("model/params reported");

    // The run page offers the download and says the model's size.
    let html = app
        .get(&format!("/runs/{id}"))
        .await
        .text()
        .await
        .expect("page");
    assert!(
        html.contains(&format!("href=\"/api/v1/runs/{id}/export/hf\"")),
        "the download is offered"
    );
    assert!(html.contains("Download for Hugging Face"));
    assert!(html.contains("parameters (") && html.contains(" trainable)"));

    let unpacked = download_export(&app, &id, here.path()).await;
    assert_eq!(names_in(&unpacked), HF_FILES);

    // A launch from the download, written relative to the working directory.
    let folder = format!("{id}-hf");
    let second = launch(
        &app,
        &tiny_launch(
            here.path(),
            json!({ "training.init_from": format!("hf:{folder}") }),
        ),
    )
    .await;
    let want = format!("hf:{}", here.path().join(&folder).display());
    assert_eq!(second["params"]["training.init_from"], want.as_str());
    let second_id = second["id"].as_str().expect("id").to_string();
    let second = wait_until_finished(&app, &second_id).await;
    assert_eq!(
        second["latest_metrics"]["model/params"]["value"].as_f64(),
        Some(params),
        "the imported model has the exported one's shape"
    );

    // A Hugging Face path that holds no model is refused at admission, naming the key.
    std::fs::create_dir(here.path().join("empty")).expect("dir");
    let cases = [
        ("hf:missing", "does not exist"),
        ("hf:empty", "config.json does not exist"),
    ];
    for (written, needle) in cases {
        let response = app
            .post_json(
                "/api/v1/runs",
                &tiny_launch(here.path(), json!({ "training.init_from": written })),
            )
            .await;
        let error = assert_error(
            response,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            Some("training.init_from"),
        )
        .await;
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{written}: {message}");
    }
}

/// A model whose export (about 25 MB) is more than the sockets between a server and an unread
/// client buffer, so an unread download stays open on the server.
fn large_model() -> ModelConfig {
    ModelConfig {
        vocab_size: 256,
        d_model: 512,
        n_layers: 2,
        n_heads: 8,
        d_ff: 2048,
        max_seq_len: 32,
        ..ModelConfig::default()
    }
}

/// Bytes of the files under `dir`, and the export folders directly in it.
fn disk_use(dir: &Path) -> (u64, usize) {
    fn bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir).map_or(0, |entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
    }
    let folders = std::fs::read_dir(dir).map_or(0, |entries| entries.flatten().count());
    (bytes(dir), folders)
}

#[tokio::test]
async fn unread_downloads_of_a_run_share_one_export_and_one_past_the_bound_is_told_to_wait() {
    use trainyard::checkpoints::exports::{EXPORT_RETRY_AFTER_S, MAX_EXPORTS_PER_PRINCIPAL};
    let app = spawn_app().await;
    let scratch = tempfile::tempdir().expect("scratch");
    let id = app.create_run("export-bounds").await;
    let run_dir = app.state.launcher.run_dir(&id);
    write_checkpoint(&run_dir, large_model(), &scratch.path().join("cache"));
    set_status(&app, &id, "running").await;
    set_status(&app, &id, "finished").await;
    let path = format!("/api/v1/runs/{id}/export/hf");

    // As many downloads as one credential may have open, none of them read.
    let mut open = Vec::new();
    for _ in 0..MAX_EXPORTS_PER_PRINCIPAL {
        let response = app.get(&path).await;
        assert_eq!(response.status(), StatusCode::OK);
        open.push(response);
    }
    let archive_len: u64 = open[0].headers()["content-length"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a number");
    let (bytes, folders) = disk_use(&run_dir.join(".exports"));
    assert_eq!(folders, 1, "one export for every open download");
    assert!(
        bytes > 0 && bytes <= archive_len,
        "{bytes} bytes on disk; one export is {archive_len}"
    );

    // One more is refused at once, with when to retry, and writes nothing.
    let refused = app.get(&path).await;
    assert_eq!(
        refused.headers()["retry-after"].to_str().expect("ascii"),
        EXPORT_RETRY_AFTER_S.to_string()
    );
    let error = assert_error(
        refused,
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_requests",
        None,
    )
    .await;
    let message = error["message"].as_str().unwrap_or_default();
    let bound = format!("at most {MAX_EXPORTS_PER_PRINCIPAL}");
    assert!(message.contains(&bound), "{message}");
    assert_eq!(disk_use(&run_dir.join(".exports")), (bytes, 1));

    // Once the downloads are gone, their export is removed and the credential may export again.
    drop(open);
    assert_eq!(exports_left(&run_dir).await, Vec::<String>::new());
    let into = scratch.path().join("after");
    std::fs::create_dir(&into).expect("dir");
    let unpacked = download_export(&app, &id, &into).await;
    assert_eq!(names_in(&unpacked), HF_FILES);
}

#[tokio::test]
async fn an_export_the_disk_has_no_room_for_is_refused_with_507_before_anything_is_written() {
    let app = spawn_app().await;
    let scratch = tempfile::tempdir().expect("scratch");
    let id = app.create_run("export-disk").await;
    let run_dir = app.state.launcher.run_dir(&id);
    write_checkpoint(&run_dir, small_model(), &scratch.path().join("cache"));
    set_status(&app, &id, "running").await;
    set_status(&app, &id, "finished").await;
    let margin = app.state.exports.free_margin();
    assert_eq!(margin, trainyard::checkpoints::exports::FREE_MARGIN_BYTES);

    // A margin no disk has: every export is "short" of space.
    app.state.exports.set_free_margin(u64::MAX / 2);
    let response = app.get(&format!("/api/v1/runs/{id}/export/hf")).await;
    assert!(response.headers().contains_key("retry-after"));
    let error = assert_error(
        response,
        StatusCode::INSUFFICIENT_STORAGE,
        "insufficient_storage",
        None,
    )
    .await;
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("not enough disk space"), "{message}");
    assert_eq!(disk_use(&run_dir.join(".exports")).0, 0);

    app.state.exports.set_free_margin(0);
    let unpacked = download_export(&app, &id, scratch.path()).await;
    assert_eq!(names_in(&unpacked), HF_FILES);
}
