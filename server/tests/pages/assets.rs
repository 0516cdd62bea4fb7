//! Static assets: every module a page loads is served, nothing else is.

use super::*;

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
