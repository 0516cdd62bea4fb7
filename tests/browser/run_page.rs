//! The run page a person reads: opened before the run reports, it lists once-reported values
//! (data counts, parameter count) in a summary table instead of one-point chart cards, draws
//! the loss once (not again as a DPO loss), gives the expert heatmap a colour scale, and keeps
//! the header's duration going while the run runs.

use serde_json::json;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn the_run_page_shows_counts_in_a_summary_one_loss_chart_a_heatmap_scale_and_a_live_duration()
{
    let app = spawn_app().await;
    // As an MLflow client or `trainyard train --server` does: created, then running.
    let id = app
        .create_run(json!({"experiment": "read", "name": "dpo-moe"}))
        .await;
    app.patch(&id, json!({"status": "running"})).await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    let subtitle = b
        .eval("return document.querySelector('.subtitle').textContent.replace(/\\s+/g, ' ')")
        .await;
    assert!(
        !subtitle.as_str().unwrap_or_default().contains("live: live"),
        "{subtitle}"
    );
    let first = b
        .eval("return document.getElementById('run-duration').textContent")
        .await;
    // The duration goes on while the page is open (it stayed at what the render said).
    b.wait_for(
        &format!(
            "return document.getElementById('run-duration').textContent !== {first} && \
             !document.getElementById('run-duration-part').hidden"
        ),
        WAIT,
    )
    .await;

    // The run reports.
    let mut points = vec![
        json!({"key": "model/params", "step": 0, "value": 51000.0}),
        json!({"key": "data/documents", "step": 0, "value": 120.0}),
        json!({"key": "data/filter/exact_duplicates", "step": 0, "value": 7.0}),
    ];
    for step in 1..30i64 {
        let loss = 0.7 - step as f64 * 0.01;
        points.push(json!({"key": "train/loss", "step": step, "value": loss}));
        points.push(json!({"key": "dpo/loss", "step": step, "value": loss}));
        points.push(
            json!({"key": "dpo/reward_accuracy", "step": step, "value": 0.5 + step as f64 * 0.01}),
        );
        for e in 0..4 {
            points
                .push(json!({"key": format!("moe/layer0/expert{e}"), "step": step, "value": 0.25}));
        }
    }
    app.post_points(&id, serde_json::Value::Array(points)).await;
    b.wait_for(
        "const r = document.querySelector('#summary tr[data-summary-of=\"data/filter/exact_duplicates\"] td'); \
         return r && r.textContent === '7' && !document.getElementById('summary-section').hidden",
        WAIT,
    )
    .await;
    b.wait_for(
        "return [...document.querySelectorAll('#charts .chart-title')].some(t => t.textContent === 'DPO reward accuracy')",
        WAIT,
    )
    .await;
    let titles = b
        .eval(
            "return [...document.querySelectorAll('#charts .chart-title')].map(t => t.textContent)",
        )
        .await;
    let titles: Vec<String> = serde_json::from_value(titles).expect("titles");
    assert_eq!(
        titles.first().map(String::as_str),
        Some("Loss"),
        "{titles:?}"
    );
    assert!(
        !titles
            .iter()
            .any(|t| t == "DPO loss" || t.starts_with("data/") || t.starts_with("model/")),
        "no duplicate loss and no one-point charts: {titles:?}"
    );

    // Reloaded, the page says the same (and the heatmap has its scale).
    b.client.refresh().await.expect("reload");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    let summary = b
        .eval("return [...document.querySelectorAll('#summary tr')].map(r => r.dataset.summaryOf)")
        .await;
    assert_eq!(
        summary,
        json!([
            "data/documents",
            "data/filter/exact_duplicates",
            "model/params"
        ])
    );
    let reloaded = b
        .eval(
            "return [...document.querySelectorAll('#charts .chart-title')].map(t => t.textContent)",
        )
        .await;
    assert_eq!(reloaded, json!(titles));
    b.wait_for(
        "const s = document.querySelector('.heat-card .heat-scale-high'); return s && s.textContent === '25%'",
        WAIT,
    )
    .await;
    b.screenshot("run-summary").await;
    b.close().await;
}
