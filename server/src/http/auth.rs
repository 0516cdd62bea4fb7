//! Bearer-token check for `/api` when the server is configured with an admin token.

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::Response;

use super::error::ApiError;
use crate::app::AppState;

/// Cookie the dashboard's browser requests carry the admin token in (an `EventSource` cannot
/// send an `Authorization` header).
pub const TOKEN_COOKIE: &str = "trainyard_token";

/// The token a request presents: `Authorization: Bearer <token>`, or the [`TOKEN_COOKIE`] —
/// the cookie for a write only when the browser says the request comes from this server's own
/// pages, so a cross-site form post riding on the cookie cannot change anything.
pub fn presented_token<'a>(method: &Method, headers: &'a HeaderMap) -> Option<&'a str> {
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let read = method == Method::GET || method == Method::HEAD;
    if bearer.is_some() || !(read || same_origin(headers)) {
        return bearer;
    }
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(TOKEN_COOKIE)?.strip_prefix('='))
}

/// Whether a browser marked the request as coming from a page of this origin: `Sec-Fetch-Site:
/// same-origin`, or else an `Origin` whose host is the `Host` the request was sent to.
fn same_origin(headers: &HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        return site == "same-origin";
    }
    match (get("origin"), get("host")) {
        (Some(origin), Some(host)) => super::guard::origin_matches_host(origin, host),
        _ => false,
    }
}

/// Lets the request through when no token is configured (loopback) or when it presents the
/// token (see [`presented_token`]); answers 401 otherwise.
pub async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let expected = match state.settings.admin_token.as_deref() {
        Some(token) if !token.is_empty() => token,
        _ => return Ok(next.run(request).await),
    };
    match presented_token(request.method(), request.headers()) {
        Some(token) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => {
            Ok(next.run(request).await)
        }
        _ => Err(ApiError::Unauthorized),
    }
}

/// Compares without returning early on the first differing byte, so response timing does not
/// reveal how much of a guessed token was right. (The length is not secret.)
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn the_cookie_counts_for_reads_and_for_same_origin_writes_only() {
        let cookie = ("cookie", "theme=dark; trainyard_token=s3cret");
        assert_eq!(
            presented_token(&Method::GET, &headers(&[cookie])),
            Some("s3cret")
        );
        assert_eq!(presented_token(&Method::POST, &headers(&[cookie])), None);
        let cross = headers(&[
            cookie,
            ("origin", "https://evil.example"),
            ("host", "h:8080"),
        ]);
        assert_eq!(presented_token(&Method::POST, &cross), None);
        let fetch_cross = headers(&[cookie, ("sec-fetch-site", "cross-site")]);
        assert_eq!(presented_token(&Method::POST, &fetch_cross), None);
        let same = headers(&[cookie, ("origin", "http://h:8080"), ("host", "h:8080")]);
        assert_eq!(presented_token(&Method::POST, &same), Some("s3cret"));
        let bearer = headers(&[("authorization", "Bearer abc"), cookie]);
        assert_eq!(presented_token(&Method::PATCH, &bearer), Some("abc"));
        let lookalike = headers(&[("cookie", "trainyard_tokenx=s3cret")]);
        assert_eq!(presented_token(&Method::GET, &lookalike), None);
    }

    #[test]
    fn equal_tokens_match_and_different_ones_do_not() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secrets"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
