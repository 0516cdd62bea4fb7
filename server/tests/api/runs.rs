use std::collections::BTreeSet;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{assert_error, TestApp};
use crate::on_both_backends;

on_both_backends!(
    creating_a_run_in_a_new_experiment_name_creates_the_experiment,
    a_run_can_be_created_by_experiment_id_with_config_and_tags,
    a_run_shows_the_latest_value_of_each_metric,
    patching_a_run_changes_name_tags_and_notes,
    a_reported_status_change_is_recorded_with_its_timestamps,
    the_config_is_write_once,
    search_filters_by_experiment_status_and_tag,
    search_filters_on_params_and_latest_metrics,
    search_sorts_by_a_metric,
    cursor_pagination_visits_every_run_exactly_once,
);

async fn creating_a_run_in_a_new_experiment_name_creates_the_experiment(app: &TestApp) {
    let run = app.create_run_with(json!({ "experiment": "fresh" })).await;
    assert_eq!(run["status"], "created");
    assert_eq!(run["id"].as_str().map(str::len), Some(32));
    let experiments = app.get_json("/api/v1/experiments").await;
    let fresh = experiments["experiments"]
        .as_array()
        .expect("array")
        .iter()
        .find(|e| e["name"] == "fresh")
        .cloned()
        .expect("experiment `fresh` was created");
    assert_eq!(run["experiment_id"], fresh["id"]);
}

async fn a_run_can_be_created_by_experiment_id_with_config_and_tags(app: &TestApp) {
    let created: Value = app
        .post_json("/api/v1/experiments", &json!({ "name": "by-id" }))
        .await
        .json()
        .await
        .expect("json");
    let run = app
        .create_run_with(json!({
            "experiment": created["id"],
            "name": "first",
            "config": { "training": { "lr": 0.001 } },
            "tags": { "team": "nlp" },
        }))
        .await;
    assert_eq!(run["experiment_id"], created["id"]);
    let fetched = app
        .get_json(&format!("/api/v1/runs/{}", run["id"].as_str().expect("id")))
        .await;
    assert_eq!(fetched["name"], "first");
    assert_eq!(fetched["params"]["training.lr"], "0.001");
    assert_eq!(fetched["tags"]["team"], "nlp");
}

async fn a_run_shows_the_latest_value_of_each_metric(app: &TestApp) {
    let id = app.create_run("latest").await;
    app.post_points(&id, &[("loss", 0, 3.0), ("loss", 5, 2.0), ("acc", 1, 0.5)])
        .await;
    app.post_points(&id, &[("loss", 3, 2.5)]).await;
    let run = app.get_json(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(run["latest_metrics"]["loss"]["step"], 5);
    assert_eq!(run["latest_metrics"]["loss"]["value"], 2.0);
    assert_eq!(run["latest_metrics"]["acc"]["value"], 0.5);
}

async fn patching_a_run_changes_name_tags_and_notes(app: &TestApp) {
    let id = app
        .create_run_with(json!({ "experiment": "patch", "tags": { "a": "1" } }))
        .await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let response = app
        .patch_json(
            &format!("/api/v1/runs/{id}"),
            &json!({ "name": "renamed", "tags": { "b": "2" }, "notes": "looks good" }),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let run = app.get_json(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(run["name"], "renamed");
    assert_eq!(run["notes"], "looks good");
    assert_eq!(run["tags"], json!({ "a": "1", "b": "2" }));
}

async fn a_reported_status_change_is_recorded_with_its_timestamps(app: &TestApp) {
    let id = app.create_run("status").await;
    let path = format!("/api/v1/runs/{id}");
    let running: Value = app
        .patch_json(&path, &json!({ "status": "running" }))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(running["status"], "running");
    assert!(running["started_at"].is_i64(), "{running}");
    let finished: Value = app
        .patch_json(&path, &json!({ "status": "finished", "reason": "done" }))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(finished["status"], "finished");
    assert!(finished["ended_at"].is_i64(), "{finished}");
}

async fn the_config_is_write_once(app: &TestApp) {
    let id = app.create_run("config").await;
    let path = format!("/api/v1/runs/{id}");
    let config = json!({ "model": { "n_layer": 4 } });
    let first = app.patch_json(&path, &json!({ "config": config })).await;
    assert_eq!(first.status(), StatusCode::OK);
    let same = app.patch_json(&path, &json!({ "config": config })).await;
    assert_eq!(
        same.status(),
        StatusCode::OK,
        "re-sending the same config is fine"
    );
    let different = app
        .patch_json(&path, &json!({ "config": { "model": { "n_layer": 8 } } }))
        .await;
    assert_error(different, StatusCode::CONFLICT, "conflict", None).await;
    let run = app.get_json(&path).await;
    assert_eq!(run["params"]["model.n_layer"], "4");
}

fn run_ids(page: &Value) -> BTreeSet<String> {
    page["runs"]
        .as_array()
        .expect("runs array")
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_string())
        .collect()
}

async fn search_filters_by_experiment_status_and_tag(app: &TestApp) {
    let a = app
        .create_run_with(json!({ "experiment": "search-a", "tags": { "kind": "base" } }))
        .await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let b = app.create_run("search-a").await;
    let c = app.create_run("search-b").await;
    app.patch_json(
        &format!("/api/v1/runs/{b}"),
        &json!({ "status": "running" }),
    )
    .await;

    let by_experiment = app.get_json("/api/v1/runs?experiment=search-a").await;
    assert_eq!(
        run_ids(&by_experiment),
        BTreeSet::from([a.clone(), b.clone()])
    );
    let by_status = app.get_json("/api/v1/runs?status=running").await;
    assert_eq!(run_ids(&by_status), BTreeSet::from([b.clone()]));
    let by_tag = app.get_json("/api/v1/runs?tag=kind%3Dbase").await;
    assert_eq!(run_ids(&by_tag), BTreeSet::from([a.clone()]));
    let everything = app.get_json("/api/v1/runs").await;
    assert!(run_ids(&everything).is_superset(&BTreeSet::from([a, b, c])));
}

async fn search_filters_on_params_and_latest_metrics(app: &TestApp) {
    let mut ids = Vec::new();
    for (lr, loss) in [(0.001, 2.0), (0.001, 3.0), (0.01, 2.0)] {
        let run = app
            .create_run_with(json!({
                "experiment": "q",
                "config": { "training": { "lr": lr } },
            }))
            .await;
        let id = run["id"].as_str().expect("id").to_string();
        app.post_points(&id, &[("val/loss", 10, loss)]).await;
        ids.push(id);
    }
    let q = "metrics.val/loss < 2.5 and params.training.lr = 0.001";
    let page = app
        .get_query("/api/v1/runs", &[("experiment", "q"), ("q", q)])
        .await;
    assert_eq!(run_ids(&page), BTreeSet::from([ids[0].clone()]), "{page}");
}

async fn search_sorts_by_a_metric(app: &TestApp) {
    let mut expected = Vec::new();
    for loss in [2.0, 1.0, 3.0] {
        let id = app.create_run("sorted").await;
        app.post_points(&id, &[("val/loss", 1, loss)]).await;
        expected.push((loss, id));
    }
    expected.sort_by(|a, b| b.0.total_cmp(&a.0));
    let page = app
        .get_query(
            "/api/v1/runs",
            &[("experiment", "sorted"), ("sort", "-metrics.val/loss")],
        )
        .await;
    let got: Vec<&str> = page["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["id"].as_str().expect("id"))
        .collect();
    let want: Vec<&str> = expected.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(got, want);
}

async fn cursor_pagination_visits_every_run_exactly_once(app: &TestApp) {
    let mut created = BTreeSet::new();
    for _ in 0..7 {
        created.insert(app.create_run("paged").await);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let mut query = vec![("experiment", "paged"), ("limit", "3")];
        if let Some(c) = &cursor {
            query.push(("cursor", c.as_str()));
        }
        let page = app.get_query("/api/v1/runs", &query).await;
        let runs = page["runs"].as_array().expect("runs");
        assert!(runs.len() <= 3);
        seen.extend(
            runs.iter()
                .map(|r| r["id"].as_str().expect("id").to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 7, "{seen:?}");
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), created);
}
