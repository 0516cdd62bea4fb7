//! The MLflow tracking protocol: the official `mlflow` client's scenario against a real server
//! (`client.rs`), and the protocol's answers checked request by request (`protocol.rs`).

mod client;
mod inputs;
mod protocol;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::helpers::TestApp;

/// Sends an MLflow request (GET: `body`'s fields as the query string) and returns the status
/// and the JSON body.
pub async fn call(app: &TestApp, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
    let url = app.url(&format!("/api/2.0/mlflow/{path}"));
    let mut request = app.client.request(method.clone(), url);
    if let Some(token) = &app.token {
        request = request.bearer_auth(token);
    }
    request = if method == Method::GET {
        let pairs: Vec<(String, String)> = body
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().map_or(v.to_string(), str::to_owned)))
            .collect();
        request.query(&pairs)
    } else {
        request.json(&body)
    };
    let response = request.send().await.expect("request");
    let status = response.status();
    let text = response.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, json)
}

/// [`call`] that must answer 200.
pub async fn ok(app: &TestApp, method: Method, path: &str, body: Value) -> Value {
    let (status, json) = call(app, method, path, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{path} {body}: {json}");
    json
}
