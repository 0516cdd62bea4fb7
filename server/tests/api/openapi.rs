use serde_json::Value;

use crate::helpers::spawn_app;

#[tokio::test]
async fn the_openapi_document_lists_every_endpoint() {
    let app = spawn_app().await;
    let doc: Value = app.get_json("/api/v1/openapi.json").await;
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{}",
        doc["openapi"]
    );
    let expected = [
        ("/api/v1/experiments", "post"),
        ("/api/v1/experiments", "get"),
        ("/api/v1/runs", "post"),
        ("/api/v1/runs", "get"),
        ("/api/v1/runs/{id}", "get"),
        ("/api/v1/runs/{id}", "patch"),
        ("/api/v1/runs/{id}/metrics", "post"),
        ("/api/v1/runs/{id}/metrics", "get"),
        ("/api/v1/runs/{id}/metric-keys", "get"),
        ("/api/v1/runs/{id}/events", "get"),
        ("/api/v1/events", "get"),
        ("/healthz", "get"),
    ];
    for (path, method) in expected {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} missing"
        );
    }
    for schema in [
        "Run",
        "Experiment",
        "Series",
        "MetricPoint",
        "RunPatch",
        "ErrorBody",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "schema {schema} missing"
        );
    }
    let params: Vec<&str> = doc["paths"]["/api/v1/runs"]["get"]["parameters"]
        .as_array()
        .expect("search parameters")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for name in [
        "experiment",
        "status",
        "tag",
        "q",
        "sort",
        "limit",
        "cursor",
    ] {
        assert!(
            params.contains(&name),
            "search parameter {name} missing: {params:?}"
        );
    }
}
