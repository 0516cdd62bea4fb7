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
        let Json(value) = Json::<T>::from_bytes(&bytes)?;
        Ok(ApiJson(value))
    }
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
