//! The compare page and the palette it shares with the browser modules.

use super::*;

/// The `background: #rrggbb` colours of the compare page's legend swatches, in page order.
fn swatch_colours(html: &str) -> Vec<String> {
    html.split("<i style=\"background: ")
        .skip(1)
        .map(|rest| rest.chars().take(7).collect())
        .collect()
}

#[tokio::test]
async fn the_browser_palette_module_holds_the_colours_the_compare_page_gives_its_runs() {
    let app = spawn_app().await;
    let a = app
        .create_run(json!({"experiment": "p", "name": "a"}))
        .await;
    let b = app
        .create_run(json!({"experiment": "p", "name": "b"}))
        .await;
    for id in [&a, &b] {
        app.post_points(id, loss_points("train/loss", 0..5)).await;
    }
    let (status, html) = get_text(&app, &format!("/compare?runs={a}&runs={b}")).await;
    assert_eq!(status, 200);
    let swatches = swatch_colours(&html);
    assert_eq!(swatches.len(), 2, "{html}");
    assert_ne!(swatches[0], swatches[1]);

    let res = app
        .http
        .get(app.url("/static/palette.js"))
        .send()
        .await
        .expect("get");
    assert_eq!(res.status().as_u16(), 200);
    let mime = res.headers()["content-type"]
        .to_str()
        .unwrap_or("")
        .to_string();
    assert!(mime.starts_with("text/javascript"), "{mime}");
    let module = res.text().await.expect("body");
    let listed: Vec<&str> = module
        .split('"')
        .filter(|s| s.starts_with('#') && s.len() == 7)
        .collect();
    assert!(listed.len() >= 2, "{module}");
    assert_eq!(listed[..2], [swatches[0].as_str(), swatches[1].as_str()]);
}

#[tokio::test]
async fn the_compare_page_charts_several_metrics_with_final_and_best_and_differing_params_first() {
    let app = spawn_app().await;
    let mut ids = vec![];
    for (name, lr) in [("a", "0.001"), ("b", "0.01")] {
        let id = app
            .create_run(json!({"experiment": "cmp", "name": name, "config": {
                "training": {"learning_rate": lr, "batch_size": 8},
            }}))
            .await;
        app.post_points(&id, loss_points("train/loss", 0..20)).await;
        app.post_points(
            &id,
            json!([
                {"key": "val/loss", "step": 5, "value": 2.0},
                {"key": "val/loss", "step": 10, "value": 1.5},
                {"key": "val/loss", "step": 15, "value": 1.75},
            ]),
        )
        .await;
        ids.push(id);
    }
    let (status, html) = get_text(
        &app,
        &format!(
            "/compare?runs={}&runs={}&key=train/loss&key=val/loss",
            ids[0], ids[1]
        ),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(html.matches("class=\"chart-box compare-chart\"").count(), 2);
    let summary = &html[html.find("id=\"summary-table\"").unwrap()..];
    assert!(
        summary.contains("1.750 @ 15") || summary.contains("1.75 @ 15"),
        "final value"
    );
    assert!(
        summary.contains(">1.500<") || summary.contains(">1.5<"),
        "best value"
    );
    let params = &html[html.find("id=\"params-table\"").unwrap()..];
    let lr = params.find("training.learning_rate").unwrap();
    let batch = params.find("training.batch_size").unwrap();
    assert!(lr < batch, "the differing key comes first");
}
