//! The trainer's instability guard as the run page shows it: a real (tiny, CPU) training run
//! whose forced divergence rolls back reports to this server, and the page lists the skipped
//! updates and the rollback.

use std::time::Duration;

use super::*;
use trainer::train::guard::FaultPlan;
use trainer::train::{run, RunOptions};

/// A tiny run of 12 steps that checkpoints every 5, with the guard rolling back after two
/// skipped updates in a row.
fn guarded_config() -> trainer::config::Config {
    let mut cfg = trainer::config::Config::from_profile("tiny").expect("tiny profile");
    let overrides: Vec<String> = [
        "training.device=cpu",
        "training.threads=1",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.max_seq_len=16",
        "training.seq_len=16",
        "training.batch_size=2",
        "training.max_steps=12",
        "training.save_steps=5",
        "training.eval_steps=0",
        "training.eval_iters=1",
        "training.instability_guard.rollback_after=2",
        "logging.progress=never",
        "logging.flush_interval_ms=50",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    cfg.apply_overrides(&overrides).expect("overrides");
    cfg.validate().expect("valid config");
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_divergence_rolls_back_and_the_run_page_lists_the_guard_events() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "guard", "name": "diverging"}))
        .await;
    let out = tempfile::tempdir().expect("run dir");
    let opts = RunOptions {
        out_dir: out.path().to_path_buf(),
        server: Some(trainer::report::ServerTarget {
            url: app.address.clone(),
            run_id: id.clone(),
            token: None,
            flush_interval: Duration::from_millis(50),
            final_flush_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(30),
        }),
        // Steps 7 and 8 get a NaN loss: two skips in a row, then the rollback to step 5.
        faults: FaultPlan {
            loss_factors: [(7, f64::NAN), (8, f64::NAN)].into_iter().collect(),
        },
        ..RunOptions::default()
    };
    let outcome = tokio::task::spawn_blocking(move || run(guarded_config(), &opts))
        .await
        .expect("trainer thread")
        .expect("the guarded run finishes");
    assert_eq!(outcome.steps, 12);

    // The final status is sent after the last points, so the page has them all now.
    let run_json = app.run(&id).await;
    assert_eq!(run_json["status"], "finished");
    let (status, html) = get_text(&app, &format!("/runs/{id}")).await;
    assert_eq!(status, 200);
    assert!(
        html.contains("id=\"guard-panel\""),
        "the panel is on the page"
    );
    assert!(!html.contains("id=\"guard-panel\" aria-labelledby=\"guard-h\" hidden"));
    assert!(
        html.contains("rolled back to the checkpoint of step 5; learning rate now x0.5"),
        "the rollback is listed"
    );
    assert!(
        html.contains("step 7"),
        "the first skipped update is listed"
    );
    assert!(
        html.contains("Updates skipped by the instability guard"),
        "its chart"
    );

    // The live page swaps the same panel in from /panels.
    let (status, panels) = get_text(&app, &format!("/runs/{id}/panels")).await;
    assert_eq!(status, 200);
    assert!(panels.contains("rolled back to the checkpoint of step 5"));
}

#[tokio::test]
async fn a_run_without_guard_points_keeps_the_guard_panel_hidden() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "guard", "name": "calm"}))
        .await;
    app.post_points(&id, json!([{"key": "train/loss", "step": 1, "value": 2.0}]))
        .await;
    let (_, html) = get_text(&app, &format!("/runs/{id}")).await;
    assert!(html.contains("id=\"guard-panel\" aria-labelledby=\"guard-h\" hidden"));
    assert!(!html.contains("rolled back"));
}
