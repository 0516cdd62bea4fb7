//! Pages at scale (prints numbers, asserts nothing; see docs/benchmarks.md, "Dashboard at
//! scale"): the runs table of an experiment with 200 runs shown on one page (`?limit=200`), and
//! the page of one run that logged 50,000 metric keys. For each: the HTML's size in bytes, the
//! server's answer time over loopback, and in headless Chromium the time from navigation to
//! the page's script being ready and to its first chart holding points (polled every 20 ms
//! through WebDriver, so a figure is late by up to one poll).
//!
//! Run: `cargo bench -p trainyard --bench page_scale` (needs Debian's chromium +
//! chromium-driver).

#![allow(clippy::unwrap_used, clippy::expect_used)] // bench code: a failed setup step is a failed run

#[allow(dead_code)]
#[path = "../tests/kit/mod.rs"]
mod kit;
#[allow(dead_code)]
#[path = "../../tests/browser/support.rs"]
mod support;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::*;
use trainyard::store::{MetricPoint, NewRun};

const RUNS: usize = 200;
const KEYS: usize = 50_000;
const LOADS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Bytes of the page's HTML and the median answer time (after 2 warm-ups).
async fn fetch(app: &TestApp, path: &str) -> (usize, f64) {
    let mut ms = Vec::new();
    let mut bytes = 0;
    for i in 0..LOADS + 2 {
        let t = Instant::now();
        let res = app.http.get(app.url(path)).send().await.expect("get");
        assert!(res.status().is_success(), "{path}: {}", res.status());
        bytes = res.bytes().await.expect("body").len();
        if i >= 2 {
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    (bytes, median(ms))
}

/// Median ms from navigation start to the page's load event and to `first` (a script
/// returning true once the page shows what is measured), over fresh loads of `path`.
async fn in_browser(b: &Browser, app: &TestApp, path: &str, first: &str) -> (f64, f64, usize) {
    let (mut ready, mut shown, mut transferred) = (Vec::new(), Vec::new(), 0);
    for i in 0..LOADS + 1 {
        b.client.goto("about:blank").await.expect("blank");
        b.client.goto(&app.url(path)).await.expect("goto");
        let r = b
            .wait_for(
                "const n = performance.getEntriesByType('navigation')[0]; return !!n && n.loadEventEnd > 0 && n.loadEventEnd",
                Duration::from_secs(60),
            )
            .await;
        let f = b
            .wait_for(
                &format!("return ({first}) && performance.now()"),
                Duration::from_secs(60),
            )
            .await;
        let nav: Value = b
            .eval("const n = performance.getEntriesByType('navigation')[0]; return n.transferSize")
            .await;
        // The first load warms the browser's module cache.
        if i > 0 {
            ready.push(r.as_f64().unwrap_or(f64::NAN));
            shown.push(f.as_f64().unwrap_or(f64::NAN));
            transferred = nav.as_u64().unwrap_or(0) as usize;
        }
    }
    (median(ready), median(shown), transferred)
}

#[tokio::main]
async fn main() {
    let (app, store) = spawn_app_with_store().await;

    // 200 runs of one experiment, as a sweep leaves them: params that vary, tags, a few
    // metrics with a curve each.
    let t = Instant::now();
    let exp = store.resolve_experiment("scale").await.expect("experiment");
    let mut tasks = Vec::new();
    for i in 0..RUNS {
        let store = store.clone();
        let exp = exp.id.clone();
        tasks.push(tokio::spawn(async move {
            let config = json!({
                "training": {"learning_rate": 1e-4 * (1 + i % 37) as f64, "batch_size": 8 << (i % 4),
                    "warmup_steps": 10 * (i % 5), "weight_decay": 0.01 * (i % 3) as f64},
                "model": {"d_model": 64 * (1 + i % 8), "n_layer": 2 + i % 6, "dropout": 0.05 * (i % 4) as f64}});
            let run = store
                .create_run(NewRun {
                    experiment_id: exp,
                    name: Some(format!("trial-{i:03}")),
                    config: Some(config),
                    tags: BTreeMap::from([("sweep".to_string(), "scale".to_string())]),
                    status: None,
                    created_by: None,
                })
                .await
                .expect("create run");
            let mut points = Vec::new();
            for step in 0..100i64 {
                for key in ["train/loss", "val/loss", "train/lr", "train/tokens_per_sec"] {
                    points.push(MetricPoint {
                        key: key.into(),
                        step,
                        value: 2.0 + (i % 17) as f64 / 17.0 - step as f64 / 200.0,
                        time: None,
                    });
                }
            }
            store
                .append_points(&run.id, &points, trainyard::store::now_ms())
                .await
                .expect("points");
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    println!(
        "seeded {RUNS} runs (7 params, 4 metrics of 100 points each) in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // One run with 50,000 keys (per-layer, per-head statistics, 4 points each) and its loss.
    let t = Instant::now();
    let wide = app
        .create_run(json!({"experiment": "scale", "name": "fifty-thousand-keys"}))
        .await;
    let mut points = Vec::new();
    for k in 0..KEYS {
        let key = format!(
            "stats/layer{:02}/head{:02}/m{:02}",
            k / 2500,
            (k / 50) % 50,
            k % 50
        );
        for step in 0..4i64 {
            points.push(MetricPoint {
                key: key.clone(),
                step,
                value: (k % 101) as f64 + step as f64,
                time: None,
            });
        }
    }
    for step in 0..1000i64 {
        points.push(MetricPoint {
            key: "train/loss".into(),
            step,
            value: 3.0 - step as f64 / 1000.0,
            time: None,
        });
    }
    for chunk in points.chunks(10_000) {
        store
            .append_points(&wide, chunk, trainyard::store::now_ms())
            .await
            .expect("points");
    }
    println!(
        "seeded a run with {KEYS} keys ({} points) in {:.1} s",
        points.len(),
        t.elapsed().as_secs_f64()
    );

    let runs_page = format!("/experiments/{}?limit={RUNS}", exp.id);
    let run_page = format!("/runs/{wide}");
    let (runs_bytes, runs_ms) = fetch(&app, &runs_page).await;
    let (run_bytes, run_ms) = fetch(&app, &run_page).await;
    let b = browser().await;
    let (runs_ready, runs_rows, _) = in_browser(
        &b,
        &app,
        &runs_page,
        &format!("document.querySelectorAll('[data-run-row]').length === {RUNS}"),
    )
    .await;
    let (run_ready, run_chart, _) = in_browser(
        &b,
        &app,
        &run_page,
        "Object.values(window.__trainyard.charts || {}).some(c => c.points > 0)",
    )
    .await;
    let charts = b
        .eval("return document.querySelectorAll('#charts .chart-card').length")
        .await;
    b.close().await;

    println!("\n| page | HTML | server answer (median of {LOADS}) | load event | first content |");
    println!("|---|---|---|---|---|");
    println!(
        "| runs table, {RUNS} runs on one page | {runs_bytes} B | {runs_ms:.1} ms | {runs_ready:.0} ms | all {RUNS} rows: {runs_rows:.0} ms |"
    );
    println!(
        "| run page, {KEYS} keys ({charts} chart cards drawn) | {run_bytes} B | {run_ms:.1} ms | {run_ready:.0} ms | first chart with points: {run_chart:.0} ms |"
    );
}
