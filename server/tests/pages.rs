//! The dashboard over plain HTTP (no JavaScript): server-rendered pages, escaping, pagination,
//! checkpoint downloads and rendered charts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

#[allow(dead_code)]
#[path = "kit/mod.rs"]
mod kit;
#[allow(dead_code)]
#[path = "../../tests/browser/support.rs"]
mod support;

use serde_json::json;
use support::*;

async fn get_text(app: &TestApp, path: &str) -> (u16, String) {
    let res = app.http.get(app.url(path)).send().await.expect("get");
    let status = res.status().as_u16();
    (status, res.text().await.expect("body"))
}

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

#[tokio::test]
async fn a_hostile_run_name_is_escaped_in_every_page_source() {
    let app = spawn_app().await;
    let id = app
        .create_run(
            json!({"experiment": "x", "name": "<img src=x onerror=alert(1)>",
            "tags": {"q": "a \"quoted\" 'tag'"}}),
        )
        .await;
    app.post_points(&id, loss_points("train/loss", 0..5)).await;
    for path in [
        "/".to_string(),
        format!("/runs/{id}"),
        format!("/compare?runs={id}"),
    ] {
        let (status, html) = get_text(&app, &path).await;
        assert_eq!(status, 200, "{path}");
        assert!(!html.contains("<img src=x"), "{path} has raw markup");
        let escaped = html.contains("&lt;img src=x onerror=alert(1)&gt;")
            || html.contains("&#60;img src=x onerror=alert(1)&#62;");
        assert!(escaped, "{path} lacks the escaped name");
        assert!(
            !html.contains("\"quoted\""),
            "{path} has a raw quote from the tag"
        );
    }
}

#[tokio::test]
async fn checkpoints_are_listed_and_downloadable_but_no_other_file_is() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "ck", "name": "ck"}))
        .await;
    let dir = app.data_dir.join("runs").join(&id).join("checkpoints");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("step-000100.safetensors"), b"weights").expect("write");
    std::fs::write(dir.join("step-000200.safetensors.tmp"), b"partial").expect("write");
    std::fs::write(
        app.data_dir.join("runs").join(&id).join("secret.txt"),
        b"TOP-SECRET",
    )
    .expect("write");
    let (_, html) = get_text(&app, &format!("/runs/{id}")).await;
    assert!(html.contains("step-000100.safetensors"));
    assert!(!html.contains(".tmp"), "temporary files are not offered");
    let res = app
        .http
        .get(app.url(&format!("/runs/{id}/checkpoints/step-000100.safetensors")))
        .send()
        .await
        .expect("download");
    assert_eq!(res.status().as_u16(), 200);
    let disposition = res
        .headers()
        .get("content-disposition")
        .map(|v| v.to_str().unwrap_or("").to_string());
    assert_eq!(
        disposition.as_deref(),
        Some("attachment; filename=\"step-000100.safetensors\"")
    );
    assert_eq!(res.bytes().await.expect("bytes").as_ref(), b"weights");
    for name in [
        "..%2Fsecret.txt",
        "..%2F..%2F..%2Ftrainyard.db",
        "%2E%2E",
        ".hidden",
        "step-000200.safetensors.tmp",
        "missing.safetensors",
    ] {
        let (status, body) = get_text(&app, &format!("/runs/{id}/checkpoints/{name}")).await;
        assert_eq!(status, 404, "{name} must not be served");
        assert!(
            !body.contains("TOP-SECRET") && !body.contains("SQLite"),
            "{name} leaked"
        );
    }
}

#[tokio::test]
async fn metric_charts_render_as_svg_and_png() {
    let app = spawn_app().await;
    let a = app
        .create_run(json!({"experiment": "c", "name": "run-a"}))
        .await;
    let b = app
        .create_run(json!({"experiment": "c", "name": "run-b"}))
        .await;
    app.post_points(&a, loss_points("train/loss", 0..100)).await;
    app.post_points(&b, loss_points("train/loss", 0..50)).await;
    let res = app
        .http
        .get(app.url(&format!("/api/v1/runs/{a}/charts/train/loss.svg")))
        .send()
        .await
        .expect("svg");
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.headers()["content-type"], "image/svg+xml");
    let svg = res.text().await.expect("text");
    assert!(
        svg.starts_with("<svg") && svg.contains("<polyline"),
        "an SVG with a line"
    );
    assert!(svg.contains("train/loss"), "titled with the key");
    let res = app
        .http
        .get(app.url(&format!("/api/v1/runs/{a}/charts/train/loss.png")))
        .send()
        .await
        .expect("png");
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(
        &res.bytes().await.expect("bytes")[..8],
        b"\x89PNG\r\n\x1a\n"
    );
    let (status, svg) = get_text(
        &app,
        &format!("/api/v1/charts/compare.svg?runs={a},{b}&key=train/loss"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        svg.contains("run-a") && svg.contains("run-b"),
        "legend names both runs"
    );
}

#[tokio::test]
async fn bad_chart_requests_are_4xx_naming_the_field() {
    let app = spawn_app().await;
    let a = app
        .create_run(json!({"experiment": "c", "name": "run-a"}))
        .await;
    let cases = [
        (
            format!("/api/v1/runs/{a}/charts/train/loss.gif"),
            400,
            Some("key"),
        ),
        (
            format!("/api/v1/runs/{a}/charts/train/loss.svg?width=5"),
            400,
            Some("width"),
        ),
        (
            format!("/api/v1/runs/{a}/charts/train/loss.svg?max_points=1"),
            400,
            Some("max_points"),
        ),
        (
            "/api/v1/runs/0123456789abcdef0123456789abcdef/charts/x.svg".to_string(),
            404,
            None,
        ),
        (
            "/api/v1/charts/compare.svg?key=train/loss".to_string(),
            400,
            Some("runs"),
        ),
        (
            format!("/api/v1/charts/compare.svg?runs={a}"),
            400,
            Some("key"),
        ),
        (
            format!("/api/v1/charts/other.svg?runs={a}&key=k"),
            400,
            Some("path"),
        ),
    ];
    for (path, code, field) in cases {
        let res = app.http.get(app.url(&path)).send().await.expect("get");
        assert_eq!(res.status().as_u16(), code, "{path}");
        let body: serde_json::Value = res.json().await.expect("json error body");
        if let Some(f) = field {
            assert_eq!(body["error"]["field"], f, "{path}: {body}");
        }
    }
}

#[tokio::test]
async fn the_launch_form_rejects_a_bad_config_inline_with_422() {
    let app = spawn_app().await;
    let (status, html) = get_text(&app, "/launch?profile=tiny-moe").await;
    assert_eq!(status, 200);
    assert!(
        html.contains("num_experts"),
        "the MoE profile's YAML is in the editor"
    );
    let yaml = "model:\n  d_model: 64\n  n_headz: 4\ntraining:\n  max_steps: 10\n";
    let res = app
        .http
        .post(app.url("/launch"))
        .form(&[
            ("experiment", "e"),
            ("yaml", yaml),
            ("gpus", "0"),
            ("profile", "tiny"),
        ])
        .send()
        .await
        .expect("post");
    assert_eq!(res.status().as_u16(), 422);
    let html = res.text().await.expect("body");
    assert!(
        html.contains("data-error-line=\"3\""),
        "error pinned to line 3"
    );
    assert!(html.contains("model.n_headz"), "message names the key");
}

#[tokio::test]
async fn unknown_runs_and_pages_are_404_pages() {
    let app = spawn_app().await;
    for path in [
        "/runs/0123456789abcdef0123456789abcdef",
        "/runs/not-an-id",
        "/experiments/nope",
    ] {
        let (status, html) = get_text(&app, path).await;
        assert_eq!(status, 404, "{path}");
        assert!(html.contains("Not found"), "{path}");
    }
}

#[tokio::test]
async fn the_launch_form_creates_a_launched_run_and_redirects_to_its_page() {
    let app = spawn_app().await;
    let (_, html) = get_text(&app, "/launch?profile=tiny").await;
    let start = html.find("name=\"yaml\"").expect("yaml field");
    let open = start + html[start..].find('>').expect("textarea") + 1;
    let close = open + html[open..].find("</textarea>").expect("end");
    let yaml = html[open..close]
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&#38;", "&");
    let res = app
        .http
        .post(app.url("/launch"))
        .form(&[
            ("experiment", "launched"),
            ("name", "form-run"),
            ("yaml", yaml.as_str()),
            ("overrides", "training.max_steps=20"),
            ("gpus", "0"),
            ("profile", "tiny"),
        ])
        .send()
        .await
        .expect("post");
    let path = res.url().path().to_string();
    let status = res.status().as_u16();
    let body = res.text().await.expect("body");
    assert_eq!(status, 200, "{body}");
    let id = path
        .strip_prefix("/runs/")
        .unwrap_or_else(|| panic!("redirected to {path}: {body}"));
    let run = app.run(id).await;
    assert_eq!(run["name"], "form-run");
    assert_eq!(run["params"]["training.max_steps"], "20");
}

#[tokio::test]
async fn with_an_admin_token_pages_need_the_token() {
    let dir = tempfile::tempdir().expect("dir");
    let mut settings =
        trainyard::app::Settings::new("127.0.0.1:0".parse().expect("addr"), dir.path());
    settings.admin_token = Some("s3cret".into());
    settings.launcher.gpus = Some(vec![]);
    let app = trainyard::app::Application::build(settings)
        .await
        .expect("build");
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until(std::future::pending()));
    let http = reqwest::Client::new();
    let cases = [
        (None, None, 401),
        (Some("wrong"), None, 401),
        (Some("s3cret"), None, 200),
        (None, Some("trainyard_token=s3cret"), 200),
        (None, Some("other=1; trainyard_token=nope"), 401),
    ];
    for (bearer, cookie, expected) in cases {
        let mut req = http.get(format!("{base}/"));
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        let res = req.send().await.expect("get");
        assert_eq!(
            res.status().as_u16(),
            expected,
            "bearer {bearer:?} cookie {cookie:?}"
        );
    }
    let css = http
        .get(format!("{base}/static/app.css"))
        .send()
        .await
        .expect("css");
    assert_eq!(css.status().as_u16(), 200, "static assets hold no data");
}

#[tokio::test]
async fn relaunching_a_run_creates_a_new_run_with_its_config() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "re", "name": "original",
            "config": {"training": {"max_steps": 20, "warmup_steps": 2}}}))
        .await;
    let res = app
        .http
        .post(app.url(&format!("/runs/{id}/relaunch")))
        .send()
        .await
        .expect("post");
    let path = res.url().path().to_string();
    assert_eq!(res.status().as_u16(), 200, "{:?}", res.text().await);
    let new_id = path
        .strip_prefix("/runs/")
        .expect("redirected to the new run")
        .to_string();
    assert_ne!(new_id, id);
    let run = app.run(&new_id).await;
    assert_eq!(run["name"], "original-relaunch");
    assert_eq!(run["tags"]["relaunch_of"], id.as_str());
    assert_eq!(run["params"]["training.max_steps"], "20");
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

/// Relative ES-module imports (`from "./x.js"`, `from "../x.js"`) of a module at `path` (under
/// `/static/`), resolved to paths under `/static/`.
fn imports_of(path: &str, source: &str) -> Vec<String> {
    source
        .split("from \"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|spec| spec.starts_with("./") || spec.starts_with("../"))
        .map(|spec| {
            let mut parts: Vec<&str> = path.split('/').collect();
            parts.pop(); // the importing file's own name
            for seg in spec.split('/') {
                match seg {
                    "." => {}
                    ".." => {
                        parts.pop();
                    }
                    s => parts.push(s),
                }
            }
            parts.join("/")
        })
        .collect()
}

#[tokio::test]
async fn every_module_a_page_loads_is_served_as_javascript_and_no_other_static_path_is() {
    let app = spawn_app().await;
    let mut queue: Vec<String> = ["run.js", "runs.js", "compare.js"]
        .map(String::from)
        .to_vec();
    let mut seen = std::collections::BTreeSet::new();
    while let Some(path) = queue.pop() {
        if !seen.insert(path.clone()) {
            continue;
        }
        let res = app
            .http
            .get(app.url(&format!("/static/{path}")))
            .send()
            .await
            .expect("get");
        assert_eq!(res.status().as_u16(), 200, "/static/{path}");
        let mime = res.headers()["content-type"]
            .to_str()
            .unwrap_or("")
            .to_string();
        assert!(mime.starts_with("text/javascript"), "{path}: {mime}");
        let source = res.text().await.expect("body");
        queue.extend(imports_of(&path, &source));
    }
    for nested in [
        "chart/data.js",
        "chart/scales.js",
        "chart/draw.js",
        "palette.js",
    ] {
        assert!(seen.contains(nested), "{nested} is imported: {seen:?}");
    }
    for path in [
        "/static/nope.js",
        "/static/chart/",
        "/static/chart",
        "/static/%2e%2e/Cargo.toml",
        "/static/chart/%2e%2e/%2e%2e/Cargo.toml",
        "/static/..%2fserver%2fCargo.toml",
    ] {
        let (status, body) = get_text(&app, path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(!body.contains("[package]"), "{path}");
    }
}

#[tokio::test]
async fn a_moe_run_page_lists_each_heatmap_rows_metric_key_in_expert_order() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "moe", "name": "m"}))
        .await;
    let mut points = vec![];
    for e in [2, 0, 1] {
        points.push(json!({"key": format!("moe/layer1/expert{e}"), "step": 0, "value": 0.3}));
    }
    app.post_points(&id, serde_json::Value::Array(points)).await;
    let (status, html) = get_text(&app, &format!("/runs/{id}")).await;
    assert_eq!(status, 200);
    assert!(
        html.contains(
            "data-layer=\"1\" data-experts=\"3\" \
             data-keys=\"moe/layer1/expert0,moe/layer1/expert1,moe/layer1/expert2\""
        ),
        "{html}"
    );
}
