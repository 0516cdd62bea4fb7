//! The Hugging Face download on the run page: a person watching a run sees its size once it
//! reports it, and the download once it finishes, without a reload; the link gives the archive.

use candle_core::Device;
use serde_json::json;
use std::time::Duration;
use trainer::config::{Config, ModelConfig};
use trainer::train::Trainer;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);

/// One trained step of a small GPT-2-shaped model, saved as the run's checkpoint.
fn write_checkpoint(run_dir: &std::path::Path, cache: &std::path::Path) {
    let mut cfg = Config {
        model: ModelConfig {
            vocab_size: 256,
            d_model: 32,
            n_layers: 2,
            n_heads: 4,
            d_ff: 64,
            max_seq_len: 32,
            ..ModelConfig::default()
        },
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
