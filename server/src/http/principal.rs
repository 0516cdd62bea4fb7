//! Who is calling: the credential a request presents (a bearer token, a session cookie, the
//! admin-token cookie), resolved once per request by the access check into an
//! [`access::Principal`](crate::access::Principal).

use std::sync::Arc;

use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::{HeaderMap, Method};

use crate::access::policy;
use crate::access::principal::{constant_time_eq, Principal, Via, SESSION_COOKIE, TOKEN_COOKIE};
use crate::access::secret::{hash_secret, session_csrf_token};
use crate::app::AppState;
use crate::store::accounts::TokenScope;
use crate::store::{now_ms, StoreError, StoreResult};

fn admin_token(state: &AppState) -> Option<&str> {
    state
        .settings
        .admin_token
        .as_deref()
        .filter(|t| !t.is_empty())
}

/// Resolves the request's credential: a bearer token (the admin token, a personal or run
/// token), else a session cookie, else the admin-token cookie, else nobody.
pub async fn resolve(
    state: &AppState,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Principal, ResolveError> {
    if let Some(bearer) = bearer(headers) {
        return bearer_principal(state, bearer).await;
    }
    if state.settings.accounts_on() {
        if let Some(secret) = cookie(headers, SESSION_COOKIE) {
            if let Some(p) = session_principal(state, secret).await? {
                return Ok(p);
            }
        }
    }
    if let (Some(expected), Some(presented)) = (admin_token(state), cookie(headers, TOKEN_COOKIE)) {
        // The admin-token cookie counts for reads, and for writes the browser marks as coming
        // from this server's own pages (see `same_origin`).
        let usable = !policy::is_write(method) || same_origin(headers);
        if usable && constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
            return Ok(Principal::AdminToken);
        }
    }
    if !state.settings.accounts_on() && admin_token(state).is_none() {
        return Ok(Principal::Local);
    }
    Ok(Principal::Anonymous)
}

/// Why resolving failed: a credential that is not valid, or the store could not answer.
#[derive(Debug)]
pub enum ResolveError {
    BadCredential,
    Store(StoreError),
}

impl From<StoreError> for ResolveError {
    fn from(e: StoreError) -> Self {
        ResolveError::Store(e)
    }
}

async fn bearer_principal(state: &AppState, presented: &str) -> Result<Principal, ResolveError> {
    if let Some(expected) = admin_token(state) {
        if constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
            return Ok(Principal::AdminToken);
        }
    }
    let Some((token, user)) = state.store.token_by_hash(&hash_secret(presented)).await? else {
        return Err(ResolveError::BadCredential);
    };
    let now = now_ms();
    if token.revoked_at.is_some() || token.expires_at.is_some_and(|t| t <= now) {
        return Err(ResolveError::BadCredential);
    }
    if token.last_used_at.is_none_or(|t| now - t > TOUCH_EVERY_MS) {
        state.store.touch_token(&token.id, now).await?;
    }
    match (token.scope, token.run_id, user) {
        (TokenScope::Run, Some(run_id), _) => {
            // A run's token works while the run is live; it is also revoked when the run ends.
            let run = state.store.run_access(&run_id).await?;
            if run.status.is_terminal() {
                return Err(ResolveError::BadCredential);
            }
            Ok(Principal::Run { run_id })
        }
        (scope, None, Some(user)) if !user.disabled && state.settings.accounts_on() => {
            Ok(Principal::User {
                user: Arc::new(user),
                via: Via::Token {
                    id: token.id,
                    scope,
                },
            })
        }
        _ => Err(ResolveError::BadCredential),
    }
}

/// Sessions and tokens record their last use at most this often (not a write per request).
const TOUCH_EVERY_MS: i64 = 60_000;

async fn session_principal(state: &AppState, secret: &str) -> StoreResult<Option<Principal>> {
    let id_hash = hash_secret(secret);
    let Some((session, user)) = state.store.session(&id_hash).await? else {
        return Ok(None);
    };
    let now = now_ms();
    let idle_ms = i64::try_from(state.settings.session_idle.as_millis()).unwrap_or(i64::MAX);
    if user.disabled || now >= session.expires_at || now - session.last_seen_at > idle_ms {
        state.store.delete_session(&id_hash).await?;
        return Ok(None);
    }
    // The CSRF token is derived from the cookie; the store has its hash to compare with.
    let csrf = session_csrf_token(secret);
    if !constant_time_eq(hash_secret(&csrf).as_bytes(), session.csrf_hash.as_bytes()) {
        return Ok(None);
    }
    if now - session.last_seen_at > TOUCH_EVERY_MS {
        state.store.touch_session(&id_hash, now).await?;
    }
    Ok(Some(Principal::User {
        user: Arc::new(user),
        via: Via::Session {
            id_hash,
            csrf,
            csrf_hash: session.csrf_hash,
        },
    }))
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The value of a cookie the request carries.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(name)?.strip_prefix('='))
}

/// Whether a browser marked the request as coming from a page of this origin: `Sec-Fetch-Site:
/// same-origin`, or else an `Origin` whose host is the `Host` the request was sent to.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        return site == "same-origin";
    }
    match (get("origin"), get("host")) {
        (Some(origin), Some(host)) => crate::http::guard::origin_matches_host(origin, host),
        _ => false,
    }
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
    fn a_cookie_is_found_by_its_exact_name() {
        let h = headers(&[("cookie", "theme=dark; trainyard_session=abc; x=1")]);
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        let lookalike = headers(&[("cookie", "trainyard_sessionx=abc")]);
        assert_eq!(cookie(&lookalike, SESSION_COOKIE), None);
    }

    #[test]
    fn same_origin_needs_the_browser_to_say_so() {
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(same_origin(&headers(&[
            ("origin", "http://h:8080"),
            ("host", "h:8080")
        ])));
        assert!(!same_origin(&headers(&[
            ("origin", "https://evil.example"),
            ("host", "h:8080")
        ])));
        assert!(!same_origin(&headers(&[])));
    }
}
