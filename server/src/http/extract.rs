//! Extractors whose rejections speak the API's error shape instead of axum's plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Json, Query, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use serde::de::{DeserializeOwned, IgnoredAny};

use super::error::ApiError;

/// `Json<T>` whose failures (bad syntax, wrong types, oversized or stalled body) are
/// `ApiError`s. Every request body of this API is a JSON object, so anything else is refused
/// before `T` sees it: serde would otherwise read a struct from an array, positionally, and an
/// empty `[]` would pass for a body with only optional fields.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::UnsupportedMediaType(
                "Expected request with `Content-Type: application/json`".into(),
            ));
        }
        let bytes = Bytes::from_request(req, state).await?;
        let object = bytes
            .iter()
            .find(|b| !b" \t\r\n".contains(b))
            .is_some_and(|&b| b == b'{');
        if !object {
            // Malformed JSON is still a syntax error, saying where it breaks.
            let Json(IgnoredAny) = Json::<IgnoredAny>::from_bytes(&bytes)?;
            return Err(ApiError::Unprocessable {
                field: None,
                message: "the request body must be a JSON object ({...}), not an array or a \
                          single value"
                    .into(),
            });
        }
        if let Some(refused) = nul_in_json(&bytes) {
            return Err(refused);
        }
        let Json(value) = Json::<T>::from_bytes(&bytes)?;
        Ok(ApiJson(value))
    }
}

/// The refusal of a JSON body that holds a NUL character in any string or key, naming where
/// (`name`, `tags.foo`, `points[3].key`). No stored text may hold one (Postgres cannot), so
/// every body is checked here, once, before any field reaches a handler.
///
/// Valid JSON can only spell NUL as the escape `\u0000`, so bodies without that text (nearly
/// all) are not parsed twice; those with it are parsed to find the field, and a body that does
/// not parse is left to the caller's own parsing to report.
pub fn nul_in_json(bytes: &[u8]) -> Option<ApiError> {
    if !bytes.windows(6).any(|w| w == b"\\u0000") {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let path = nul_path(&value, String::new())?;
    Some(nul_refusal(&path))
}

/// The path of the first string or key holding a NUL, if any.
fn nul_path(value: &serde_json::Value, here: String) -> Option<String> {
    use serde_json::Value;
    match value {
        Value::String(s) if s.contains('\0') => Some(here),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_path(item, format!("{here}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(key, item)| {
            let path = if here.is_empty() {
                key.replace('\0', "\\u0000")
            } else {
                format!("{here}.{}", key.replace('\0', "\\u0000"))
            };
            if key.contains('\0') {
                Some(path)
            } else {
                nul_path(item, path)
            }
        }),
        _ => None,
    }
}

fn nul_refusal(field: &str) -> ApiError {
    let shown = if field.is_empty() { "the body" } else { field };
    ApiError::unprocessable(
        if field.is_empty() { "body" } else { field },
        format!(
            "`{shown}` contains a NUL character (\\u0000), which no text this server stores may \
             hold; remove it"
        ),
    )
}

/// Middleware: a form body (`application/x-www-form-urlencoded`, the dashboard's forms) with a
/// NUL character in any name or value is refused with 422 naming the field, before any handler
/// reads it. Other bodies pass untouched (JSON ones are checked by [`ApiJson`] and the MLflow
/// extractor).
pub async fn reject_nul_in_forms(
    request: Request,
    next: axum::middleware::Next,
) -> Result<axum::response::Response, ApiError> {
    if !is_form(request.headers()) {
        return Ok(next.run(request).await);
    }
    let (parts, body) = request.into_parts();
    // Read as a handler would, so the body limit, timeout and deadline apply the same way.
    let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await?;
    if let Some(field) = nul_in_form(&bytes) {
        return Err(nul_refusal(&field));
    }
    let request = Request::from_parts(parts, axum::body::Body::from(bytes));
    Ok(next.run(request).await)
}

/// The name of the first pair of a form body that holds a NUL, shown with `%00` for it
/// (`None` for a body that does not decode: the handler's own extractor reports that).
fn nul_in_form(bytes: &[u8]) -> Option<String> {
    if !bytes.windows(3).any(|w| w.eq_ignore_ascii_case(b"%00")) && !bytes.contains(&0) {
        return None;
    }
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(bytes).ok()?;
    pairs
        .into_iter()
        .find(|(k, v)| k.contains('\0') || v.contains('\0'))
        .map(|(k, _)| k.replace('\0', "%00"))
}

/// `application/x-www-form-urlencoded`, parameters aside.
fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            v.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// `application/json`, or any `application/...+json`, parameters (`; charset=utf-8`) aside.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json") || subtype.to_ascii_lowercase().ends_with("+json"))
}

/// `Query<T>` whose failures are `ApiError`s.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(value) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(ApiQuery(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types_are_recognized_with_parameters_and_suffixes() {
        let cases = [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("application/merge-patch+json", true),
            ("text/json", false),
            ("application/x-www-form-urlencoded", false),
            ("json", false),
        ];
        for (value, expected) in cases {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, value.parse().expect("header"));
            assert_eq!(is_json(&headers), expected, "{value}");
        }
        assert!(!is_json(&HeaderMap::new()));
    }
}
