//! End-to-end tests in real headless Chromium (WebDriver): live charts, compare, launch, stop,
//! escaping. Each test saves screenshots under `target/screenshots/` (or where
//! `TRAINYARD_SCREENSHOTS` says, see tests/README.md).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

#[allow(dead_code)]
#[path = "../../server/tests/kit/mod.rs"]
mod kit;
#[allow(dead_code)] // shared with the page tests and the bench
mod support;

mod charts;
mod ended;
mod export;
mod finetune;
mod forms;
mod guide_options;
mod mlflow;
mod models;
mod resume;
mod run_page;
mod runs_table;
mod smaller;
mod sweep_controls;
mod sweeps;
mod teams;

use fantoccini::Locator;
use serde_json::json;
use std::time::Duration;
use support::*;

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test]
async fn a_run_page_shows_points_posted_after_it_loaded_without_a_reload() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "live", "name": "live-run",
            "config": {"training": {"learning_rate": 0.003, "batch_size": 8}, "model": {"d_model": 64}}}))
        .await;
    app.post_points(&id, loss_points("train/loss", 0..50)).await;
    app.post_points(&id, loss_points("val/loss", 0..5)).await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    let before = b
        .eval("return window.__trainyard.charts['train/loss'].points")
        .await;
    assert_eq!(before, json!(50));
    b.eval("window.__sameDocument = 'yes'; return null").await;

    app.post_points(&id, loss_points("train/loss", 50..60))
        .await;
    b.wait_for(
        "const c = window.__trainyard.charts['train/loss']; return c.points === 60 && c.lastStep === 59",
        WAIT,
    )
    .await;
    // The canvas drew them too: its box exposes the count it holds.
    b.wait_for(
        "return document.querySelector('.chart-box[data-keys*=\"train/loss\"]').dataset.points === '65'",
        WAIT,
    )
    .await;
    assert_eq!(
        b.eval("return window.__sameDocument").await,
        json!("yes"),
        "page reloaded"
    );
    b.screenshot("run").await;
    b.close().await;
}

#[tokio::test]
async fn the_runs_table_selects_two_runs_and_the_compare_page_overlays_them() {
    let app = spawn_app().await;
    let a = app
        .create_run(json!({"experiment": "sweep", "name": "lr-3e-3",
            "config": {"training": {"learning_rate": 0.003, "batch_size": 8}}, "tags": {"sweep": "lr"}}))
        .await;
    let b_id = app
        .create_run(json!({"experiment": "sweep", "name": "lr-1e-3",
            "config": {"training": {"learning_rate": 0.001, "batch_size": 8}}, "tags": {"sweep": "lr"}}))
        .await;
    app.post_points(&a, loss_points("train/loss", 0..80)).await;
    let slower: Vec<_> = (0..60)
        .map(|s| json!({"key": "train/loss", "step": s, "value": 3.2 / (1.0 + s as f64 * 0.03)}))
        .collect();
    app.post_points(&b_id, serde_json::Value::Array(slower))
        .await;
    let b = browser().await;
    b.client.goto(&app.url("/")).await.expect("goto");
    b.wait_for(
        "return document.querySelectorAll('#runs-table tbody tr').length === 2",
        WAIT,
    )
    .await;
    b.screenshot("runs").await;
    for id in [&a, &b_id] {
        b.client
            .find(Locator::Css(&format!("input[name=runs][value='{id}']")))
            .await
            .expect("checkbox")
            .click()
            .await
            .expect("click");
    }
    b.client
        .find(Locator::Id("compare-button"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    let series = b.eval("return window.__trainyard.compare.series").await;
    let points: Vec<i64> = series
        .as_array()
        .expect("series")
        .iter()
        .map(|s| s["points"].as_i64().unwrap_or(-1))
        .collect();
    assert_eq!(points.len(), 2);
    assert!(points.contains(&80) && points.contains(&60), "{series}");
    let differing = b
        .eval("return [...document.querySelectorAll('#params-table tr.differs th')].map(e => e.textContent)")
        .await;
    assert_eq!(differing, json!(["training.learning_rate"]));
    b.screenshot("compare").await;
    // The same comparison rendered server-side (plotters), as the README shows it.
    for ext in ["svg", "png"] {
        let res = app
            .http
            .get(app.url(&format!(
                "/api/v1/charts/compare.{ext}?runs={a},{b_id}&key=train/loss&width=800&height=360"
            )))
            .send()
            .await
            .expect("chart");
        assert_eq!(res.status().as_u16(), 200);
        let bytes = res.bytes().await.expect("bytes");
        std::fs::write(
            screenshots_dir().join(format!("compare-chart.{ext}")),
            bytes,
        )
        .expect("write chart");
    }
    b.close().await;
}

#[tokio::test]
async fn a_hostile_run_name_and_a_quoted_tag_render_as_text_on_every_page() {
    let app = spawn_app().await;
    let name = "<img src=x onerror=alert(1)>";
    let tag = r#"say "hi" & 'bye'"#;
    let id = app
        .create_run(
            json!({"experiment": "<b>exp</b>", "name": name, "tags": {"quote": tag},
            "config": {"training": {"learning_rate": 0.001}}}),
        )
        .await;
    app.post_points(&id, loss_points("train/loss", 0..10)).await;
    let b = browser().await;
    for (page, path) in [
        ("escaping-runs", "/".to_string()),
        ("escaping-run", format!("/runs/{id}")),
        ("escaping-compare", format!("/compare?runs={id}")),
    ] {
        b.client.goto(&app.url(&path)).await.expect("goto");
        // An alert would make this fail with "unexpected alert open".
        let injected = b
            .eval("return document.querySelectorAll('img[src=\"x\"], b').length")
            .await;
        assert_eq!(injected, json!(0), "markup injected on {path}");
        let text = b.eval("return document.body.innerText").await;
        let text = text.as_str().unwrap_or_default();
        assert!(text.contains(name), "{path} does not show the name as text");
        if page != "escaping-compare" {
            assert!(
                text.contains(&format!("quote={tag}")),
                "{path} does not show the tag"
            );
        }
        b.screenshot(page).await;
    }
    b.close().await;
}

#[tokio::test]
async fn a_moe_run_page_draws_an_expert_utilisation_heatmap_per_layer() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "moe", "name": "tiny-moe"}))
        .await;
    let mut points = vec![];
    for step in 0..40i64 {
        for layer in 0..2 {
            for e in 0..4 {
                let skew = if e == 0 {
                    0.1 * (step as f64 / 40.0)
                } else {
                    0.0
                };
                points.push(json!({"key": format!("moe/layer{layer}/expert{e}"), "step": step, "value": 0.25 + skew - skew / 3.0 * f64::from(e != 0)}));
            }
        }
        points.push(json!({"key": "train/loss", "step": step, "value": 4.0 - step as f64 * 0.05}));
    }
    app.post_points(&id, serde_json::Value::Array(points)).await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    let layers = b
        .eval("return document.querySelectorAll('.heat-box').length")
        .await;
    assert_eq!(layers, json!(2));
    b.wait_for(
        "return document.querySelector('.heat-box').dataset.cells === '160'",
        WAIT,
    )
    .await;
    app.post_points(
        &id,
        json!([{"key": "moe/layer0/expert1", "step": 40, "value": 0.5}]),
    )
    .await;
    b.wait_for(
        "return document.querySelector('.heat-box').dataset.cells === '161'",
        WAIT,
    )
    .await;
    b.screenshot("run-moe").await;
    b.close().await;
}

#[tokio::test]
async fn the_launch_form_shows_a_validation_error_at_the_offending_yaml_line() {
    let app = spawn_app().await;
    let b = browser().await;
    b.client
        .goto(&app.url("/launch?profile=tiny"))
        .await
        .expect("goto");
    let yaml = b
        .eval("return document.getElementById('l-yaml').value")
        .await;
    let yaml = yaml.as_str().expect("yaml").to_string();
    assert!(yaml.contains("n_heads: 4"), "profile YAML loaded: {yaml}");
    let bad = yaml.replace("n_heads: 4", "n_heads: 5");
    b.client
        .execute(
            "document.getElementById('l-yaml').value = arguments[0]; return null",
            vec![json!(bad)],
        )
        .await
        .expect("set yaml");
    b.client
        .find(Locator::Id("launch-submit"))
        .await
        .expect("submit")
        .click()
        .await
        .expect("click");
    b.wait_for(
        "return document.getElementById('launch-error') !== null",
        WAIT,
    )
    .await;
    let line = b
        .eval("const d = document.querySelector('[data-error-line]'); return d && d.textContent")
        .await;
    let line = line.as_str().unwrap_or_default();
    assert!(
        line.contains("n_heads: 5") || line.contains("d_model"),
        "error shown at: {line}"
    );
    assert!(line.contains("model."), "message names the key: {line}");
    b.screenshot("launch-error").await;
    b.close().await;
}

#[tokio::test]
async fn a_run_launched_from_the_form_lands_on_its_live_page() {
    let app = spawn_app().await;
    let b = browser().await;
    b.client
        .goto(&app.url("/launch?profile=tiny"))
        .await
        .expect("goto");
    b.client
        .find(Locator::Id("l-name"))
        .await
        .expect("name")
        .send_keys("from-the-form")
        .await
        .expect("type");
    b.client
        .find(Locator::Id("l-overrides"))
        .await
        .expect("overrides")
        .send_keys("training.max_steps=20")
        .await
        .expect("type");
    b.screenshot("launch").await;
    b.client
        .find(Locator::Id("launch-submit"))
        .await
        .expect("submit")
        .click()
        .await
        .expect("click");
    let id = b
        .wait_for(
            "const m = document.querySelector('main[data-run-id]'); return m && m.dataset.runId",
            WAIT,
        )
        .await;
    let id = id.as_str().expect("run id").to_string();
    let url = b.client.current_url().await.expect("url");
    assert_eq!(url.path(), format!("/runs/{id}"));
    let run = app.run(&id).await;
    assert_eq!(run["name"], "from-the-form");
    assert_eq!(
        run["params"]["training.max_steps"], "20",
        "override applied: {run}"
    );
    // The launcher picks it up: the badge leaves `queued` live, without a reload.
    b.wait_for("return !['created', 'queued'].includes(document.getElementById('status-badge').dataset.status || document.getElementById('status-badge').textContent)", WAIT)
        .await;
    // It really trains on the CPU: the badge reaches `finished` live, every step is recorded,
    // and the reloaded page charts the whole loss curve.
    b.wait_for(
        "const s = document.getElementById('status-badge'); return (s.dataset.status || s.textContent.trim()) === 'finished'",
        Duration::from_secs(180),
    )
    .await;
    let run = app.run(&id).await;
    assert_eq!(run["status"], "finished", "{run}");
    assert_eq!(run["latest_metrics"]["train/loss"]["step"], 20, "{run}");
    assert!(
        run["latest_metrics"]["val/loss"]["value"].is_number(),
        "{run}"
    );
    // The page opened before the run's first metric: its charts appeared live, no reload.
    b.wait_for(
        "const c = window.__trainyard.charts['train/loss']; return !document.getElementById('charts-empty') && !!c && c.points === 20 && c.lastStep === 20",
        WAIT,
    )
    .await;
    let header = b
        .eval("return document.querySelector('[data-latest-of=\"train/loss\"]').textContent")
        .await;
    assert!(
        header.as_str().is_some_and(|h| h.ends_with("@ 20")),
        "the loss header follows the stream: {header}"
    );
    b.client.refresh().await.expect("reload");
    b.wait_for(
        "const c = window.__trainyard && window.__trainyard.charts['train/loss']; return !!c && c.points === 20 && c.lastStep === 20",
        WAIT,
    )
    .await;
    b.screenshot("run-launched").await;
    b.close().await;
}

#[tokio::test]
async fn the_stop_button_stops_a_running_run_and_the_badge_follows() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "stop", "name": "long-job", "launch": true, "command": "sleep 120"}))
        .await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for(
        "return document.getElementById('status-badge').textContent === 'running'",
        WAIT,
    )
    .await;
    b.client
        .find(Locator::Id("stop-button"))
        .await
        .expect("stop")
        .click()
        .await
        .expect("click");
    b.wait_for(
        "return document.getElementById('status-badge').textContent === 'stopped'",
        WAIT,
    )
    .await;
    assert_eq!(app.run(&id).await["status"], "stopped");
    b.screenshot("run-stopped").await;
    b.close().await;
}
