//! Charts rendered by the server (SVG, PNG) and their refusals.

use super::*;

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
