//! The Hugging Face download on the run page: a person watching a run sees its size once it
//! reports it, and the download once it finishes, without a reload; the link gives the archive.

use candle_core::Device;
use serde_json::json;
use std::time::Duration;
use trainer::config::{Activation, Config, ModelConfig, MoeConfig, NormKind, PositionKind};
use trainer::train::Trainer;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);

/// A small GPT-2-shaped model.
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

/// One trained step of a small GPT-2-shaped model, saved as the run's checkpoint.
pub(crate) fn write_checkpoint(run_dir: &std::path::Path, cache: &std::path::Path) {
    write_checkpoint_of(small_model(), run_dir, cache);
}

/// One trained step of `model`, saved as the run's checkpoint.
fn write_checkpoint_of(model: ModelConfig, run_dir: &std::path::Path, cache: &std::path::Path) {
    let mut cfg = Config {
        model,
        ..Config::default()
    };
    cfg.training.batch_size = 2;
    cfg.training.seq_len = 16;
    cfg.training.warmup_steps = 0;
    cfg.training.device = "cpu".parse().expect("the CPU device");
    cfg.data.cache_dir = cache.display().to_string();
    let mut trainer = Trainer::new(cfg, Device::Cpu).expect("trainer");
    trainer.step().expect("step");
    trainer.save_checkpoint(run_dir).expect("checkpoint");
}

#[tokio::test]
async fn a_watched_run_offers_its_hugging_face_download_when_it_finishes_without_a_reload() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "export", "name": "exportable"}))
        .await;
    app.patch(&id, json!({"status": "running"})).await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for(
        "return document.getElementById('live-state').textContent === 'live'",
        WAIT,
    )
    .await;
    let before = b
        .eval("return document.getElementById('run-model').textContent.trim()")
        .await;
    assert_eq!(before, json!(""), "nothing to say yet");
    b.eval("window.__sameDocument = 'yes'; return null").await;

    // The run reports its size, trains, saves its checkpoint and finishes.
    app.post_points(
        &id,
        json!([
            {"key": "model/params", "step": 1, "value": 40000.0},
            {"key": "model/trainable_params", "step": 1, "value": 40000.0},
            {"key": "train/loss", "step": 1, "value": 5.5},
        ]),
    )
    .await;
    let cache = tempfile::tempdir().expect("cache");
    write_checkpoint(&app.data_dir.join("runs").join(&id), cache.path());
    app.patch(&id, json!({"status": "finished"})).await;

    let href = b
        .wait_for(
            "const a = document.getElementById('export-hf'); return a && a.getAttribute('href')",
            WAIT,
        )
        .await;
    assert_eq!(href, json!(format!("/api/v1/runs/{id}/export/hf")));
    let shown = b
        .eval("return document.getElementById('run-model').textContent.replace(/\\s+/g, ' ')")
        .await;
    let shown = shown.as_str().unwrap_or_default();
    assert!(
        shown.contains("40.0k parameters (40.0k trainable)")
            && shown.contains("Download for Hugging Face"),
        "{shown}"
    );
    assert_eq!(
        b.eval("return window.__sameDocument || null").await,
        json!("yes"),
        "no reload"
    );

    // What the link gives, fetched as the browser follows it: a tar archive of the model's
    // folder, its first entry the config.
    let got = b
        .wait_for(
            "if (!window.__export) { window.__export = 'pending'; \
               fetch(document.getElementById('export-hf').href).then(async (r) => { \
                 const bytes = new Uint8Array(await r.arrayBuffer()); \
                 const name = new TextDecoder().decode(bytes.slice(0, 100)).replace(/\\0.*$/s, ''); \
                 window.__export = {status: r.status, type: r.headers.get('content-type'), \
                   length: bytes.length, first: name}; }); } \
             return window.__export !== 'pending' && window.__export",
            WAIT,
        )
        .await;
    assert_eq!(got["status"], 200, "{got}");
    assert_eq!(got["type"], "application/x-tar", "{got}");
    assert_eq!(got["first"], format!("{id}-hf/config.json"), "{got}");
    assert!(got["length"].as_u64().unwrap_or(0) > 10_000, "{got}");
    b.close().await;
}

/// A Mixtral-shaped model that drops tokens (capacity_factor 1.25) has no Hugging Face
/// architecture: the page, opened while the run runs, shows the download disabled with the
/// export's reason when the run finishes, and offers no link that would start a failing
/// download. (Before, the link appeared and its click started `hf.json`, a 409, and cancelled.)
#[tokio::test]
async fn a_finished_moe_run_that_cannot_be_exported_shows_why_instead_of_a_download() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "export", "name": "moe-drops-tokens"}))
        .await;
    app.patch(&id, json!({"status": "running"})).await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for(
        "return document.getElementById('live-state').textContent === 'live'",
        WAIT,
    )
    .await;

    let model = ModelConfig {
        position: PositionKind::Rope,
        norm: NormKind::RmsNorm,
        activation: Activation::Swiglu,
        moe: Some(MoeConfig {
            num_experts: 4,
            capacity_factor: 1.25,
            ..MoeConfig::default()
        }),
        ..small_model()
    };
    let cache = tempfile::tempdir().expect("cache");
    write_checkpoint_of(model, &app.data_dir.join("runs").join(&id), cache.path());
    app.patch(&id, json!({"status": "finished"})).await;

    let why = b
        .wait_for(
            "const w = document.getElementById('export-hf-why'); return w && w.textContent",
            WAIT,
        )
        .await;
    let why = why.as_str().unwrap_or_default().to_string();
    assert!(
        why.contains("model.moe.capacity_factor must be 0"),
        "the reason names the key: {why}"
    );
    assert_eq!(
        b.eval("const d = document.getElementById('export-hf-disabled'); return d && d.disabled")
            .await,
        json!(true),
        "the download is shown disabled"
    );
    assert_eq!(
        b.eval("return document.getElementById('export-hf') === null")
            .await,
        json!(true),
        "no link to a download that fails"
    );
    // The page said what the API answers: one check decides both.
    let res = app
        .http
        .get(app.url(&format!("/api/v1/runs/{id}/export/hf")))
        .send()
        .await
        .expect("export");
    assert_eq!(res.status().as_u16(), 409);
    let body: serde_json::Value = res.json().await.expect("json");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains(message), "page: {why}; API: {message}");
    b.screenshot("export-unavailable").await;
    b.close().await;
}
