//! The runs table: filters, pagination, sort keys shared with the API, default columns.

use super::*;

/// The `href` of the first link with `rel="next"`, unescaped.
fn next_link(html: &str) -> Option<String> {
    let at = html.find("rel=\"next\"")?;
    let start = html[..at].rfind("href=\"")? + 6;
    let end = start + html[start..].find('"')?;
    Some(html[start..end].replace("&amp;", "&").replace("&#38;", "&"))
}

#[tokio::test]
async fn the_runs_table_filters_by_status_without_javascript() {
    let app = spawn_app().await;
    let running = app
        .create_run(json!({"experiment": "e", "name": "alpha-running"}))
        .await;
    app.create_run(json!({"experiment": "e", "name": "beta-created"}))
        .await;
    app.patch(&running, json!({"status": "running"})).await;
    let cases = [
        (
            "/?status=running",
            vec!["alpha-running"],
            vec!["beta-created"],
        ),
        (
            "/?status=created",
            vec!["beta-created"],
            vec!["alpha-running"],
        ),
        ("/", vec!["alpha-running", "beta-created"], vec![]),
    ];
    for (path, present, absent) in cases {
        let (status, html) = get_text(&app, path).await;
        assert_eq!(status, 200, "{path}");
        for name in present {
            assert!(html.contains(name), "{path} should list {name}");
        }
        for name in absent {
            assert!(!html.contains(name), "{path} should not list {name}");
        }
    }
}

#[tokio::test]
async fn a_bad_status_or_query_is_shown_as_an_error_on_the_page_not_a_500() {
    let app = spawn_app().await;
    for (path, needle) in [
        ("/?status=sleeping", "status"),
        ("/?q=metrics.loss+%3C%3C+2", "q:"),
    ] {
        let (status, html) = get_text(&app, path).await;
        assert_eq!(status, 200, "{path}");
        assert!(html.contains("role=\"alert\""), "{path} shows an error");
        assert!(html.contains(needle), "{path} names the field");
    }
}

#[tokio::test]
async fn the_runs_table_pages_through_every_run_once_with_the_cursor() {
    let app = spawn_app().await;
    for i in 0..7 {
        app.create_run(json!({"experiment": "paged", "name": format!("paged-run-{i}")}))
            .await;
    }
    let mut path = "/?limit=3&sort=name".to_string();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let (status, html) = get_text(&app, &path).await;
        assert_eq!(status, 200);
        for i in 0..7 {
            let name = format!("paged-run-{i}<");
            if html.contains(&name) {
                seen.push(i);
            }
        }
        match next_link(&html) {
            Some(next) => path = format!("{next}&limit=3"),
            None => break,
        }
    }
    assert_eq!(seen, vec![0, 1, 2, 3, 4, 5, 6]);
}

/// The run names of a runs-table page, in the order the table shows them.
fn names_in_order(html: &str, names: &[&str]) -> Vec<String> {
    let mut found: Vec<(usize, String)> = names
        .iter()
        .filter_map(|n| html.find(&format!(">{n}<")).map(|at| (at, n.to_string())))
        .collect();
    found.sort();
    found.into_iter().map(|(_, n)| n).collect()
}

#[tokio::test]
async fn the_api_and_the_runs_page_accept_the_same_sort_keys_and_page_sizes() {
    let app = spawn_app().await;
    let names = ["sort-bravo", "sort-alpha", "sort-charlie"];
    for (i, name) in names.iter().enumerate() {
        let id = app
            .create_run(json!({"experiment": "sorting", "name": name}))
            .await;
        app.post_points(
            &id,
            json!([{"key": "loss", "step": 0, "value": 3.0 - i as f64}]),
        )
        .await;
    }
    let sorts = [
        "",
        "name",
        "+name",
        "-name",
        "created_at",
        "-created_at",
        "status",
        "-status",
        "metrics.loss",
        "-metrics.loss",
        "params.x",
        "bogus",
        "params.",
        "latest.loss",
    ];
    let limits = ["", "1", "2", "1000", "0", "1001", "ten", "-1"];
    for sort in sorts {
        for limit in limits {
            let query = format!(
                "experiment=sorting&sort={}&limit={limit}",
                sort.replace('+', "%2B")
            );
            let res = app
                .http
                .get(app.url(&format!("/api/v1/runs?{query}")))
                .send()
                .await
                .expect("api");
            let api_status = res.status().as_u16();
            let body: serde_json::Value = res.json().await.expect("json");
            let (page_status, html) = get_text(&app, &format!("/?{query}")).await;
            assert_eq!(page_status, 200, "page ?{query}");
            match api_status {
                200 => {
                    let api_names: Vec<String> = body["runs"]
                        .as_array()
                        .expect("runs")
                        .iter()
                        .map(|r| r["name"].as_str().unwrap_or("").to_string())
                        .collect();
                    assert!(
                        !html.contains("role=\"alert\""),
                        "page ?{query} shows no error"
                    );
                    assert_eq!(names_in_order(&html, &names), api_names, "?{query}");
                }
                400 => {
                    let field = body["error"]["field"].as_str().expect("field").to_string();
                    assert!(
                        html.contains("role=\"alert\""),
                        "page ?{query} shows an error"
                    );
                    assert!(
                        html.contains(&format!("{field}:")),
                        "page ?{query} names {field}"
                    );
                }
                other => panic!("api ?{query} answered {other}"),
            }
        }
    }
}

#[tokio::test]
async fn the_runs_table_shows_the_varied_learning_rate_and_the_best_of_an_eval_metric() {
    let app = spawn_app().await;
    for (name, lr, seed, losses) in [
        ("slow", "0.001", 1, [3.0, 2.5, 2.8]),
        ("fast", "0.01", 2, [2.9, 2.2, 2.4]),
    ] {
        let id = app
            .create_run(json!({"experiment": "cols", "name": name, "config": {
                "data": {"cache_dir": format!("/tmp/{name}")},
                "logging": {"flush_interval_ms": seed * 100},
                "training": {"learning_rate": lr, "seed": seed, "batch_size": 8},
            }}))
            .await;
        let points: Vec<_> = losses
            .iter()
            .enumerate()
            .map(|(i, v)| json!({"key": "val/loss", "step": i * 100, "value": v}))
            .collect();
        app.post_points(&id, json!(points)).await;
    }
    let (_, html) = get_text(&app, "/").await;
    let head = &html[html.find("<thead").unwrap()..html.find("</thead>").unwrap()];
    let first_param = head.find("training.learning_rate").expect("lr is a column");
    for later in [
        "training.seed",
        "data.cache_dir",
        "logging.flush_interval_ms",
    ] {
        assert!(
            head.find(later).is_none_or(|at| at > first_param),
            "{later} comes before the learning rate"
        );
    }
    assert!(
        html.contains("2.400 (best 2.200)") || html.contains("2.4 (best 2.2)"),
        "best shown"
    );
}
