//! Dashboard benchmarks (prints numbers, asserts nothing; see docs/benchmarks.md):
//! 1. runs-table page time with 10,000 runs (SQLite), default and metric-sorted pages;
//! 2. metric POST → point painted in headless Chromium's chart, p50/p95 over 100 points.
//!
//! Run: `cargo bench -p trainyard --bench dashboard` (needs Debian's chromium + chromium-driver).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

#[allow(dead_code)]
#[path = "../tests/kit/mod.rs"]
mod kit;
#[allow(dead_code)]
#[path = "../../tests/browser/support.rs"]
mod support;

use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::*;
use trainyard::store::{MetricPoint, NewRun};

const RUNS: usize = 10_000;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn time_page(app: &TestApp, path: &str, reps: usize) -> (f64, f64, usize) {
    let mut ms = Vec::with_capacity(reps);
    let mut rows = 0;
    for _ in 0..reps + 2 {
        let t = Instant::now();
        let res = app.http.get(app.url(path)).send().await.expect("get");
        assert!(res.status().is_success(), "{path}: {}", res.status());
        let body = res.text().await.expect("body");
        rows = body.matches("data-run-row=").count();
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let mut ms = ms.split_off(2); // warm-up
    ms.sort_by(f64::total_cmp);
    (percentile(&ms, 0.5), percentile(&ms, 0.95), rows)
}

#[tokio::main]
async fn main() {
    let (app, store) = spawn_app_with_store().await;
    let t = Instant::now();
    let exp = store.resolve_experiment("bench").await.expect("experiment");
    let mut ids = Vec::with_capacity(RUNS);
    for chunk in 0..RUNS / 100 {
        let mut tasks = Vec::new();
        for i in chunk * 100..(chunk + 1) * 100 {
            let store = store.clone();
            let exp = exp.id.clone();
            tasks.push(tokio::spawn(async move {
                let config = json!({"training": {"learning_rate": 1e-4 * (1 + i % 30) as f64,
                    "batch_size": 8 << (i % 4)}, "model": {"d_model": 64 * (1 + i % 8)}});
                let run = store
                    .create_run(NewRun {
                        experiment_id: exp,
                        name: Some(format!("bench-run-{i:05}")),
                        config: Some(config),
                        tags: BTreeMap::from([("sweep".to_string(), format!("s{}", i % 10))]),
                        status: None,
                        created_by: None,
                    })
                    .await
                    .expect("create run");
                let points: Vec<MetricPoint> = ["train/loss", "val/loss"]
                    .iter()
                    .map(|k| MetricPoint {
                        key: k.to_string(),
                        step: 100,
                        value: 1.0 + (i % 997) as f64 / 997.0,
                        time: None,
                    })
                    .collect();
                store
                    .append_points(&run.id, &points, trainyard::store::now_ms())
                    .await
                    .expect("points");
                run.id
            }));
        }
        for t in tasks {
            ids.push(t.await.expect("task"));
        }
    }
    println!(
        "seeded {RUNS} runs with params, tags and 2 metrics each in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    println!("\n## Runs table with {RUNS} runs (GET, 50 rows per page, median / p95 of 20)");
    for (label, path) in [
        ("home, newest first", "/".to_string()),
        (
            "sorted by metrics.val/loss",
            "/?sort=metrics.val%2Floss".to_string(),
        ),
        ("filtered by tag sweep=s3", "/?tag=sweep%3Ds3".to_string()),
        (
            "q: metrics.val/loss < 1.5",
            "/?q=metrics.val%2Floss+%3C+1.5".to_string(),
        ),
        ("one experiment", format!("/experiments/{}", exp.id)),
    ] {
        let (p50, p95, rows) = time_page(&app, &path, 20).await;
        println!("| {label} | {rows} | {p50:.1} ms | {p95:.1} ms |");
    }
    // Page 2 via the cursor in the first page's next link.
    let html = app
        .http
        .get(app.url("/"))
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("body");
    if let Some(next) = html
        .split("rel=\"next\"")
        .next()
        .and_then(|h| h.rsplit("href=\"").next())
    {
        let next = next
            .trim_end_matches(['"', ' '])
            .replace("&#38;", "&")
            .replace("&amp;", "&");
        let (p50, p95, rows) = time_page(&app, &next, 20).await;
        println!("| next page (cursor) | {rows} | {p50:.1} ms | {p95:.1} ms |");
    }

    println!("\n## Metric POST → point painted in the browser chart (100 single-point posts)");
    let run = app
        .create_run(json!({"experiment": "latency", "name": "latency"}))
        .await;
    app.post_points(&run, loss_points("train/loss", 0..1000))
        .await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{run}")))
        .await
        .expect("goto");
    b.wait_for(
        "return document.body.dataset.ready === 'true'",
        Duration::from_secs(20),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut lat = Vec::new();
    for i in 0..100i64 {
        let step = 1000 + i;
        let t0 = trainyard::store::now_ms();
        app.post_points(
            &run,
            json!([{"key": "train/loss", "step": step, "value": 1.0}]),
        )
        .await;
        let script = format!(
            "const c = window.__trainyard.charts['train/loss']; return c.lastStep === {step} && c.paintedAt"
        );
        let painted = b.wait_for(&script, Duration::from_secs(10)).await;
        let painted = painted.as_i64().expect("paintedAt");
        lat.push((painted - t0) as f64);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lat.sort_by(f64::total_cmp);
    println!(
        "POST → painted: p50 {:.0} ms, p95 {:.0} ms, max {:.0} ms (wall clock, ms resolution)",
        percentile(&lat, 0.5),
        percentile(&lat, 0.95),
        lat[lat.len() - 1]
    );

    println!("\n## Canvas chart with a 1,000,000-point series (in the run page's Chromium)");
    let script = r#"
        const done = arguments[0];
        import('/static/chart.js').then(({ LineChart }) => {
          const box = document.createElement('div');
          box.style.cssText = 'position:relative;width:800px;height:240px';
          document.body.append(box);
          const chart = new LineChart(box, { smoothing: 0.6 });
          const s = chart.addSeries('big');
          let t = performance.now();
          for (let i = 0; i < 1000000; i++) s.append(i, Math.sin(i / 5000) + (i % 997 === 0 ? 3 : 0), i);
          const append = performance.now() - t;
          const frames = [];
          for (let k = 0; k < 20; k++) { t = performance.now(); chart.draw(); frames.push(performance.now() - t); }
          frames.sort((a, b) => a - b);
          done({ append, median: frames[10], max: frames[19] });
        });
    "#;
    let r = b
        .client
        .execute_async(script, vec![])
        .await
        .expect("chart timing");
    println!(
        "append 1M points: {:.0} ms total; full redraw (smoothed + raw): median {:.1} ms, max {:.1} ms",
        r["append"].as_f64().unwrap_or(f64::NAN),
        r["median"].as_f64().unwrap_or(f64::NAN),
        r["max"].as_f64().unwrap_or(f64::NAN)
    );
    b.close().await;
}
