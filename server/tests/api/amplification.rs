//! What one run holds does not make pages and lists grow with it: a runs list item carries a
//! bounded number of latest metrics (saying how many there are), the run page draws its first
//! charts and pages the rest through the chart layout API, with a limit and a cursor.

use std::collections::BTreeSet;

use serde_json::Value;
use trainyard::http::api::charts::layout::{DEFAULT_CHART_PAGE, MAX_CHART_PAGE};
use trainyard::http::api::runs::LIST_METRICS;

use crate::helpers::{assert_error, TestApp};
use crate::on_both_backends;

/// Keys that each get a chart of their own.
const KEYS: usize = 2_000;

/// A run with `n` metric keys `custom/mNNNN` (one chart each) besides `train/loss`.
async fn run_with_keys(app: &TestApp, name: &str, n: usize) -> String {
    let id = app.create_run(name).await;
    let keys: Vec<String> = (0..n).map(|i| format!("custom/m{i:04}")).collect();
    let mut points: Vec<(&str, i64, f64)> = keys.iter().map(|k| (k.as_str(), 1, 0.5)).collect();
    points.push(("train/loss", 1, 2.0));
    app.post_points(&id, &points).await;
    id
}

async fn a_runs_list_item_carries_a_bounded_number_of_latest_metrics(app: &TestApp) {
    let many = run_with_keys(app, "many-keys", KEYS).await;
    let few = run_with_keys(app, "few-keys", 3).await;
    let list = app.get_json("/api/v1/runs?experiment=many-keys").await;
    let item = &list["runs"][0];
    assert_eq!(item["id"], many.as_str());
    let metrics = item["latest_metrics"].as_object().map(|m| m.len());
    assert_eq!(metrics, Some(LIST_METRICS));
    assert_eq!(item["latest_metrics_total"], KEYS + 1);
    assert_eq!(item["latest_metrics_truncated"], true);
    let size = item.to_string().len();
    assert!(size < LIST_METRICS * 120, "a list item of {size} bytes");

    // The metric a search sorts by is among those listed, however many the run has.
    let sorted = app
        .get_query(
            "/api/v1/runs",
            &[
                ("experiment", "many-keys"),
                ("sort", "-metrics.custom/m0007"),
            ],
        )
        .await;
    let listed = &sorted["runs"][0]["latest_metrics"];
    assert!(listed.get("custom/m0007").is_some(), "{listed}");

    // The whole run is one request away, and a run with few keys lists them all.
    let whole = app.get_json(&format!("/api/v1/runs/{many}")).await;
    assert_eq!(
        whole["latest_metrics"].as_object().map(|m| m.len()),
        Some(KEYS + 1)
    );
    let list = app.get_json("/api/v1/runs?experiment=few-keys").await;
    let item = &list["runs"][0];
    assert_eq!(item["id"], few.as_str());
    assert_eq!(item["latest_metrics"].as_object().map(|m| m.len()), Some(4));
    assert_eq!(item["latest_metrics_total"], 4);
    assert_eq!(item["latest_metrics_truncated"], false);
}

fn chart_ids(layout: &Value) -> Vec<String> {
    layout["charts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["id"].as_str().unwrap_or_default().to_string())
        .collect()
}

async fn the_run_page_draws_the_first_charts_and_pages_the_rest_through_the_api(app: &TestApp) {
    let id = run_with_keys(app, "page-keys", KEYS).await;
    let html = app
        .get(&format!("/runs/{id}"))
        .await
        .text()
        .await
        .expect("page");
    assert_eq!(
        html.matches("class=\"chart-card\"").count(),
        DEFAULT_CHART_PAGE
    );
    assert!(
        html.contains("id=\"charts-more\""),
        "the rest load on demand"
    );
    assert!(html.contains(&format!(
        "{DEFAULT_CHART_PAGE} of {} charts shown",
        KEYS + 1
    )));
    assert!(html.len() < 100_000, "a run page of {} bytes", html.len());

    // The first page is what the page drew; the cursor pages through every chart once.
    let first = app.get_json(&format!("/api/v1/runs/{id}/charts")).await;
    assert_eq!(first["total_charts"], KEYS + 1);
    let mut seen = chart_ids(&first);
    assert_eq!(seen.len(), DEFAULT_CHART_PAGE);
    assert_eq!(seen[0], "0:loss");
    let mut cursor = first["next_cursor"].as_str().map(str::to_string);
    let mut pages = 1;
    while let Some(c) = cursor {
        let page = app
            .get_query(
                &format!("/api/v1/runs/{id}/charts"),
                &[("cursor", &c), ("limit", &MAX_CHART_PAGE.to_string())],
            )
            .await;
        let size = page.to_string().len();
        assert!(size < MAX_CHART_PAGE * 200, "a layout page of {size} bytes");
        seen.extend(chart_ids(&page));
        cursor = page["next_cursor"].as_str().map(str::to_string);
        pages += 1;
        assert!(pages <= KEYS, "paging does not end");
    }
    assert_eq!(seen.len(), KEYS + 1);
    assert_eq!(seen.iter().collect::<BTreeSet<_>>().len(), KEYS + 1);

    // A bad page is refused naming the parameter.
    let path = format!("/api/v1/runs/{id}/charts");
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("cursor=nonsense", "cursor"),
    ] {
        let response = app.get(&format!("{path}?{query}")).await;
        assert_error(
            response,
            reqwest::StatusCode::BAD_REQUEST,
            "bad_request",
            Some(field),
        )
        .await;
    }
}

on_both_backends!(
    a_runs_list_item_carries_a_bounded_number_of_latest_metrics,
    the_run_page_draws_the_first_charts_and_pages_the_rest_through_the_api,
);
