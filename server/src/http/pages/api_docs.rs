//! The API's reference as a page (`/api-docs`): every operation of the OpenAPI document
//! (`GET /api/v1/openapi.json`, which stays the machine-readable source), grouped by tag, with
//! its parameters, body and responses. Rendered on the server from the same document.

use askama::Template;
use serde_json::Value;

use super::{html, PageResult};
use crate::http::api::openapi::ApiDoc;
use utoipa::OpenApi;

#[derive(Template)]
#[template(path = "api_docs.html")]
pub struct ApiDocsPage {
    pub nav: &'static str,
    pub title: String,
    pub version: String,
    pub groups: Vec<ApiGroup>,
}

pub struct ApiGroup {
    pub tag: String,
    pub description: String,
    pub operations: Vec<ApiOperation>,
}

pub struct ApiOperation {
    /// `GET`, `POST`, ...
    pub method: String,
    pub path: String,
    /// An anchor: `get-api-v1-runs-id`.
    pub anchor: String,
    pub summary: String,
    pub description: String,
    /// `name (in): description`.
    pub parameters: Vec<String>,
    /// The body's media type and schema name, if any.
    pub body: String,
    /// `status: description`.
    pub responses: Vec<(String, String)>,
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().trim().to_string()
}

/// The schema's name a `$ref` points at (`#/components/schemas/Run` → `Run`), or its type.
fn schema_name(schema: &Value) -> String {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        return r.rsplit('/').next().unwrap_or(r).to_string();
    }
    if let Some(items) = schema.get("items") {
        return format!("array of {}", schema_name(items));
    }
    text(schema.get("type").unwrap_or(&Value::Null))
}

/// The document's operations, grouped by their first tag in the document's tag order.
pub fn groups(doc: &Value) -> Vec<ApiGroup> {
    let mut groups: Vec<ApiGroup> = doc["tags"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| ApiGroup {
            tag: text(&t["name"]),
            description: text(&t["description"]),
            operations: Vec::new(),
        })
        .collect();
    let Some(paths) = doc["paths"].as_object() else {
        return groups;
    };
    for (path, item) in paths {
        let Some(item) = item.as_object() else {
            continue;
        };
        for method in ["get", "post", "put", "patch", "delete"] {
            let Some(op) = item.get(method) else {
                continue;
            };
            let tag = op["tags"]
                .get(0)
                .map(text)
                .unwrap_or_else(|| "other".to_string());
            let parameters = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let description = text(&p["description"]);
                    let mut s = format!("{} ({})", text(&p["name"]), text(&p["in"]));
                    if !description.is_empty() {
                        s.push_str(": ");
                        s.push_str(&description);
                    }
                    s
                })
                .collect();
            let body = op["requestBody"]["content"]
                .as_object()
                .and_then(|c| c.iter().next())
                .map(|(media, m)| format!("{media}: {}", schema_name(&m["schema"])))
                .unwrap_or_default();
            let mut responses: Vec<(String, String)> = op["responses"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(code, r)| {
                    let schema = r["content"]
                        .as_object()
                        .and_then(|c| c.values().next())
                        .map(|m| schema_name(&m["schema"]))
                        .filter(|s| !s.is_empty());
                    let mut d = text(&r["description"]);
                    if let Some(schema) = schema {
                        d.push_str(&format!(" ({schema})"));
                    }
                    (code.clone(), d)
                })
                .collect();
            responses.sort();
            let operation = ApiOperation {
                method: method.to_uppercase(),
                anchor: format!("{method}{}", path.replace(['/', '{', '}', '.'], "-")),
                path: path.clone(),
                summary: text(&op["summary"]),
                description: text(&op["description"]),
                parameters,
                body,
                responses,
            };
            match groups.iter_mut().find(|g| g.tag == tag) {
                Some(g) => g.operations.push(operation),
                None => groups.push(ApiGroup {
                    tag,
                    description: String::new(),
                    operations: vec![operation],
                }),
            }
        }
    }
    groups.retain(|g| !g.operations.is_empty());
    groups
}

pub(super) async fn api_docs() -> PageResult {
    let doc = serde_json::to_value(ApiDoc::openapi())
        .map_err(|e| super::PageError::Internal(e.to_string()))?;
    html(ApiDocsPage {
        nav: "api",
        title: text(&doc["info"]["title"]),
        version: text(&doc["info"]["version"]),
        groups: groups(&doc),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_of_the_document_is_listed_under_its_tag() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("document");
        let groups = groups(&doc);
        let listed: usize = groups.iter().map(|g| g.operations.len()).sum();
        let in_doc: usize = doc["paths"]
            .as_object()
            .expect("paths")
            .values()
            .map(|item| item.as_object().map_or(0, |m| m.len()))
            .sum();
        assert_eq!(listed, in_doc);
        let stop = groups
            .iter()
            .flat_map(|g| &g.operations)
            .find(|o| o.path == "/api/v1/runs/{id}/stop")
            .expect("the stop operation");
        assert_eq!(stop.method, "POST");
        assert!(stop.responses.iter().any(|(code, _)| code == "409"));
    }
}
