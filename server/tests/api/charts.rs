//! `GET /api/v1/runs/{id}/charts`: the chart layout the run page follows for live keys.

use serde_json::json;

use crate::helpers::spawn_app;

#[tokio::test]
async fn the_chart_layout_groups_a_runs_keys_as_its_page_does() {
    let app = spawn_app().await;
    let id = app.create_run("layout").await;
    let empty = app.get_json(&format!("/api/v1/runs/{id}/charts")).await;
    assert_eq!(empty, json!({"charts": [], "heatmaps": []}));
    app.post_points(
        &id,
        &[
            ("val/loss", 10, 2.0),
            ("train/loss", 10, 2.5),
            ("train/lr", 10, 3e-4),
            ("sys/rss_mb", 4, 120.0),
            ("moe/layer1/expert1", 10, 0.5),
            ("moe/layer1/expert0", 10, 0.5),
        ],
    )
    .await;
    let layout = app.get_json(&format!("/api/v1/runs/{id}/charts")).await;
    assert_eq!(
        layout["charts"],
        json!([
            {"id": "0:loss", "title": "Loss", "keys": ["train/loss", "val/loss"], "x_unit": "step"},
            {"id": "1:lr", "title": "Learning rate", "keys": ["train/lr"], "x_unit": "step"},
            {"id": "9:sys/rss_mb", "title": "sys/rss_mb", "keys": ["sys/rss_mb"], "x_unit": "seconds"},
        ])
    );
    assert_eq!(
        layout["heatmaps"],
        json!([{"layer": 1, "experts": 2, "keys": ["moe/layer1/expert0", "moe/layer1/expert1"]}])
    );
    let missing = app
        .get("/api/v1/runs/0123456789abcdef0123456789abcdef/charts")
        .await;
    assert_eq!(missing.status().as_u16(), 404);
}
