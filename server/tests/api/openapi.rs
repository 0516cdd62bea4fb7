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
        ("/api/v1/runs/{id}/charts", "get"),
        ("/api/v1/runs/{id}/charts/{file}", "get"),
        ("/api/v1/charts/{file}", "get"),
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

#[tokio::test]
async fn the_chart_routes_document_every_query_parameter_they_read() {
    let app = spawn_app().await;
    let doc: Value = app.get_json("/api/v1/openapi.json").await;
    let names = |path: &str| -> Vec<String> {
        doc["paths"][path]["get"]["parameters"]
            .as_array()
            .unwrap_or_else(|| panic!("{path} has no parameters"))
            .iter()
            .filter_map(|p| p["name"].as_str().map(str::to_string))
            .collect()
    };
    let chart = [
        "width",
        "height",
        "max_points",
        "start_step",
        "end_step",
        "log",
    ];
    let run = names("/api/v1/runs/{id}/charts/{file}");
    for name in chart.iter().chain(&["id", "file"]) {
        assert!(
            run.iter().any(|n| n == name),
            "run chart: {name} missing from {run:?}"
        );
    }
    let compare = names("/api/v1/charts/{file}");
    for name in chart.iter().chain(&["file", "runs", "key"]) {
        assert!(
            compare.iter().any(|n| n == name),
            "compare chart: {name} missing from {compare:?}"
        );
    }
    let width = doc["paths"]["/api/v1/runs/{id}/charts/{file}"]["get"]["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "width"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        width["schema"]["maximum"],
        trainyard::http::api::charts::MAX_CHART_PX,
        "{width}"
    );
    let layout = names("/api/v1/runs/{id}/charts");
    for name in ["id", "limit", "cursor"] {
        assert!(
            layout.iter().any(|n| n == name),
            "chart layout: {name} missing from {layout:?}"
        );
    }
    // Every documented parameter is handled: bad values are 400s naming the parameter.
    let run_id = app.create_run("charts").await;
    for name in chart {
        let url = format!("/api/v1/runs/{run_id}/charts/train/loss.svg?{name}=nonsense");
        let res = app.client.get(app.url(&url)).send().await.expect("get");
        assert_eq!(res.status().as_u16(), 400, "{url}");
        let body: Value = res.json().await.expect("error body");
        assert_eq!(body["error"]["field"], name, "{url}: {body}");
    }
}

/// Every operation of the document, as (path, method, operation).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("path item") {
            if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                out.push((path.clone(), method.clone(), operation.clone()));
            }
        }
    }
    out
}

fn documented(operation: &Value, code: &str) -> bool {
    operation["responses"][code].is_object()
}

#[tokio::test]
async fn every_route_documents_the_error_codes_it_can_return() {
    let app = spawn_app().await;
    let doc: Value = app.get_json("/api/v1/openapi.json").await;
    let ops = operations(&doc);
    assert!(ops.len() >= 16, "{} operations", ops.len());
    for (path, method, op) in &ops {
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        let has = |place: &str| params.iter().any(|p| p["in"] == place);
        let mut expected = vec!["500"];
        if path.starts_with("/api/v1/") {
            expected.extend(["401", "403"]);
        }
        if has("path") {
            expected.extend(["400", "404"]);
        }
        if has("query") {
            expected.push("400");
        }
        if op["requestBody"].is_object() {
            expected.extend(["400", "413", "415", "422"]);
        }
        for code in expected {
            assert!(
                documented(op, code),
                "{method} {path} does not document {code}"
            );
        }
        for (code, response) in op["responses"].as_object().expect("responses") {
            let stream = &response["content"]["text/event-stream"];
            if stream.is_object() {
                assert_eq!(
                    stream["schema"]["$ref"], "#/components/schemas/ServerSentEvent",
                    "{method} {path} {code}: a stream's schema describes one event"
                );
            }
            if code.starts_with('4') || code.starts_with('5') {
                let schema = &response["content"]["application/json"]["schema"]["$ref"];
                assert_eq!(
                    schema, "#/components/schemas/ErrorBody",
                    "{method} {path} {code} is not an ErrorBody"
                );
            }
        }
    }
    let specific = [
        ("/api/v1/runs", "post", "403"),
        ("/api/v1/runs", "get", "404"),
        ("/api/v1/runs/{id}", "patch", "409"),
        ("/api/v1/runs/{id}/stop", "post", "409"),
        ("/api/v1/experiments", "post", "409"),
    ];
    for (path, method, code) in specific {
        assert!(
            documented(&doc["paths"][path][method], code),
            "{method} {path} does not document {code}"
        );
    }
    let logs = &doc["paths"]["/api/v1/runs/{id}/logs"]["get"]["responses"]["200"]["content"];
    for content_type in ["text/plain", "application/json", "text/event-stream"] {
        assert!(
            logs[content_type].is_object(),
            "logs {content_type}: {logs}"
        );
    }
}

#[tokio::test]
async fn each_route_answers_a_request_for_an_unknown_run_with_a_documented_code() {
    let app = spawn_app().await;
    let doc: Value = app.get_json("/api/v1/openapi.json").await;
    let unknown = "0123456789abcdef0123456789abcdef";
    for (path, method, op) in operations(&doc) {
        let url = app.url(&path.replace("{id}", unknown));
        let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
        let mut request = app.client.request(method.clone(), url);
        if op["requestBody"].is_object() {
            request = request.json(&serde_json::json!({}));
        }
        // Bounded: the stream of every run's events never ends by itself.
        let response = request
            .timeout(std::time::Duration::from_secs(10))
            .send()
            .await
            .expect("request");
        let code = response.status().as_str().to_string();
        assert!(
            documented(&op, &code),
            "{method} {path} answered {code}, which it does not document"
        );
    }
}
