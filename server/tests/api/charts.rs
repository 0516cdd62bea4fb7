//! `GET /api/v1/runs/{id}/charts`: the chart layout the run page follows for live keys.

use serde_json::json;

use crate::helpers::spawn_app;

#[tokio::test]
async fn the_chart_layout_groups_a_runs_keys_as_its_page_does() {
    let app = spawn_app().await;
    let id = app.create_run("layout").await;
    let empty = app.get_json(&format!("/api/v1/runs/{id}/charts")).await;
    assert_eq!(
        empty,
        json!({"charts": [], "heatmaps": [], "next_cursor": null, "total_charts": 0})
    );
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
            {"id": "0:loss", "title": "Loss", "keys": ["train/loss", "val/loss"], "total_keys": 2,
             "x_unit": "step", "section": "training"},
            {"id": "1:lr", "title": "Learning rate", "keys": ["train/lr"], "total_keys": 1,
             "x_unit": "step", "section": "training"},
            {"id": "9:sys/rss_mb", "title": "sys/rss_mb", "keys": ["sys/rss_mb"], "total_keys": 1,
             "x_unit": "seconds", "section": "system"},
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

#[tokio::test]
async fn a_dpo_runs_preference_metrics_get_charts_of_their_own() {
    let app = spawn_app().await;
    let id = app.create_run("dpo").await;
    // What a DPO run reports: its loss as the loss, and the preference statistics of the train
    // and validation splits.
    let stats: Vec<(String, f64)> = ["dpo/", "val/dpo/"]
        .iter()
        .flat_map(|prefix| {
            [
                ("loss", 0.69),
                ("reward_accuracy", 0.5),
                ("chosen_reward", 0.01),
                ("rejected_reward", -0.01),
                ("margin", 0.02),
            ]
            .map(|(leaf, value)| (format!("{prefix}{leaf}"), value))
        })
        .collect();
    let mut points = vec![("train/loss", 5, 0.69), ("val/loss", 5, 0.7)];
    points.extend(stats.iter().map(|(k, v)| (k.as_str(), 5, *v)));
    app.post_points(&id, &points).await;
    let layout = app.get_json(&format!("/api/v1/runs/{id}/charts")).await;
    let charts: Vec<(String, Vec<String>)> = layout["charts"]
        .as_array()
        .expect("charts")
        .iter()
        .map(|c| {
            let keys = c["keys"].as_array().expect("keys");
            let keys = keys.iter().map(|k| k.as_str().expect("key").to_string());
            (
                c["title"].as_str().expect("title").to_string(),
                keys.collect(),
            )
        })
        .collect();
    let want = [
        ("Loss", vec!["train/loss", "val/loss"]),
        // `dpo/loss` is the objective `train/loss` already draws: no second loss chart.
        (
            "DPO reward accuracy",
            vec!["dpo/reward_accuracy", "val/dpo/reward_accuracy"],
        ),
        (
            "DPO rewards (chosen, rejected, margin)",
            vec![
                "dpo/chosen_reward",
                "dpo/margin",
                "dpo/rejected_reward",
                "val/dpo/chosen_reward",
                "val/dpo/margin",
                "val/dpo/rejected_reward",
            ],
        ),
    ];
    let want: Vec<(String, Vec<String>)> = want
        .iter()
        .map(|(t, ks)| (t.to_string(), ks.iter().map(|k| k.to_string()).collect()))
        .collect();
    assert_eq!(charts, want);
}

#[tokio::test]
async fn a_chart_larger_than_the_size_cap_is_refused_naming_the_parameter() {
    use trainyard::http::api::charts::MAX_CHART_PX;
    let app = spawn_app().await;
    let id = app.create_run("sizes").await;
    app.post_points(&id, &[("train/loss", 1, 2.0), ("train/loss", 2, 1.5)])
        .await;
    let chart = |query: String| format!("/api/v1/runs/{id}/charts/train/loss.png?{query}");
    let over = MAX_CHART_PX + 1;
    for (query, field) in [
        (format!("width={over}"), "width"),
        (format!("height={over}"), "height"),
        ("width=4000&height=4000".to_string(), "width"),
    ] {
        let response = app.get(&chart(query.clone())).await;
        assert_eq!(response.status().as_u16(), 400, "{query}");
        let body: serde_json::Value = response.json().await.expect("json");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&MAX_CHART_PX.to_string()), "{message}");
    }
    let compare = format!("/api/v1/charts/compare.png?runs={id}&key=train/loss&height={over}");
    assert_eq!(app.get(&compare).await.status().as_u16(), 400);
    let largest = app
        .get(&chart(format!(
            "width={MAX_CHART_PX}&height={MAX_CHART_PX}"
        )))
        .await;
    assert_eq!(largest.status().as_u16(), 200);
}

#[tokio::test]
async fn a_chart_request_past_the_render_pools_places_gets_503_with_retry_after() {
    use trainyard::http::api::charts::pool::CHART_RETRY_AFTER_S;
    let app = spawn_app().await;
    let id = app.create_run("pool").await;
    app.post_points(&id, &[("train/loss", 1, 2.0)]).await;
    let pool = &app.state.chart_pool;
    assert_eq!(
        pool.permits(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        "one render permit per core"
    );
    // Every place taken (as by that many requests rendering or waiting).
    let held: Vec<_> = (0..pool.capacity())
        .map(|_| pool.admit().expect("a free place"))
        .collect();
    for path in [
        format!("/api/v1/runs/{id}/charts/train/loss.png"),
        format!("/api/v1/charts/compare.svg?runs={id}&key=train/loss"),
    ] {
        let response = app.get(&path).await;
        assert_eq!(response.status().as_u16(), 503, "{path}");
        assert_eq!(
            response.headers()["retry-after"].to_str().expect("ascii"),
            CHART_RETRY_AFTER_S.to_string()
        );
        let body: serde_json::Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "unavailable", "{body}");
    }
    drop(held);
    let response = app
        .get(&format!("/api/v1/runs/{id}/charts/train/loss.png"))
        .await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(pool.idle_permits(), pool.permits(), "the permit came back");
}
