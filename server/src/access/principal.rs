//! Who is calling: the credential a request presents, resolved once per request by the access
//! check and handed to handlers as a request extension.

use std::sync::Arc;

use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::{HeaderMap, Method};

use super::secret::{hash_secret, session_csrf_token};
use crate::app::AppState;
use crate::store::accounts::{Level, TokenScope, User};
use crate::store::{now_ms, StoreError, StoreResult};

/// Cookie the dashboard carries the admin token in (an `EventSource` cannot send a header).
pub const TOKEN_COOKIE: &str = "trainyard_token";
/// Cookie of a signed-in browser: the session's secret (the store keeps only its hash).
pub const SESSION_COOKIE: &str = "trainyard_session";
/// Header a cookie-authenticated `fetch` write carries its session's CSRF token in (forms send
/// the field `csrf`).
pub const CSRF_HEADER: &str = "x-csrf-token";

#[derive(Debug, Clone)]
pub enum Principal {
    /// Accounts are off and no admin token is set (a loopback server): the one local user, who
    /// may do everything, as before accounts existed.
    Local,
    /// The admin token: the bootstrap and break-glass credential; may do everything.
    AdminToken,
    /// A signed-in user, through a browser session or a personal access token.
    User { user: Arc<User>, via: Via },
    /// The token the server gave a run it launched: it may only report that run.
    Run { run_id: String },
    /// No credential (only public routes are open to it when access is controlled).
    Anonymous,
}

/// How a user's request was authenticated. Its `Debug` leaves the session's values out: a
/// principal reaches log lines (the `#[instrument]` spans of handlers print their arguments).
#[derive(Clone)]
pub enum Via {
    Session {
        /// The hash of the cookie's secret (the store's key of the session).
        id_hash: String,
        /// The session's CSRF token, for the pages to embed (derived from the cookie).
        csrf: String,
        /// What the store keeps of the CSRF token, which a write's token is compared with.
        csrf_hash: String,
    },
    Token {
        id: String,
        scope: TokenScope,
    },
}

impl std::fmt::Debug for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Via::Session { .. } => f.debug_struct("Session").finish_non_exhaustive(),
            Via::Token { id, scope } => f
                .debug_struct("Token")
                .field("id", id)
                .field("scope", scope)
                .finish(),
        }
    }
}

/// A credential that was presented and is not (or no longer) valid: a 401, never a fallback
/// to anonymous, so a client learns at once that its token expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadCredential;

impl Principal {
    /// Instance administrators (and the admin token, and the local single user).
    pub fn is_admin(&self) -> bool {
        match self {
            Principal::Local | Principal::AdminToken => true,
            Principal::User { user, .. } => user.is_admin,
            Principal::Run { .. } | Principal::Anonymous => false,
        }
    }

    pub fn is_anonymous(&self) -> bool {
        matches!(self, Principal::Anonymous)
    }

    pub fn user(&self) -> Option<&User> {
        match self {
            Principal::User { user, .. } => Some(user),
            _ => None,
        }
    }

    /// The user id runs and experiments created by this caller are recorded under.
    pub fn user_id(&self) -> Option<&str> {
        self.user().map(|u| u.id.as_str())
    }

    /// How the audit log names the caller.
    pub fn actor(&self) -> Option<String> {
        match self {
            Principal::Local => Some("local".into()),
            Principal::AdminToken => Some("admin-token".into()),
            Principal::User { user, .. } => Some(user.name.clone()),
            Principal::Run { run_id } => Some(format!("run:{run_id}")),
            Principal::Anonymous => None,
        }
    }

    /// Whether the credential may change things: a `read` token may not.
    pub fn may_write(&self) -> bool {
        !matches!(
            self,
            Principal::User {
                via: Via::Token {
                    scope: TokenScope::Read,
                    ..
                },
                ..
            }
        )
    }

    /// The CSRF token a write riding on this caller's session cookie must echo.
    pub fn session_csrf(&self) -> Option<&str> {
        match self {
            Principal::User {
                via: Via::Session { csrf, .. },
                ..
            } => Some(csrf),
            _ => None,
        }
    }

    /// Whether `sent` is this session's CSRF token, compared by its hash with what the store
    /// keeps (in constant time); `false` for a caller without a session.
    pub fn is_session_csrf(&self, sent: &[u8]) -> bool {
        match self {
            Principal::User {
                via: Via::Session { csrf_hash, .. },
                ..
            } => {
                let sent = hash_secret(&String::from_utf8_lossy(sent));
                constant_time_eq(sent.as_bytes(), csrf_hash.as_bytes())
            }
            _ => false,
        }
    }

    /// The caller's level on an experiment (its grants, its teams', the owner's and the
    /// experiment's default level; everything for administrators). A `read` token caps it.
    pub async fn level_on(&self, state: &AppState, experiment_id: &str) -> StoreResult<Level> {
        match self {
            p if p.is_admin() => Ok(Level::Manage),
            Principal::User { user, via } => {
                let level = state
                    .store
                    .experiment_level(&user.id, experiment_id)
                    .await?;
                Ok(match via {
                    Via::Token {
                        scope: TokenScope::Read,
                        ..
                    } => level.min(Level::Read),
                    _ => level,
                })
            }
            _ => Ok(Level::None),
        }
    }

    /// The experiments whose runs the caller may read: `None` means every one.
    pub async fn readable_experiments(&self, state: &AppState) -> StoreResult<Option<Vec<String>>> {
        match self {
            p if p.is_admin() => Ok(None),
            Principal::User { user, .. } => Ok(Some(
                state
                    .store
                    .experiment_levels(&user.id)
                    .await?
                    .into_iter()
                    .filter(|(_, level)| *level >= Level::Read)
                    .map(|(id, _)| id)
                    .collect(),
            )),
            _ => Ok(Some(Vec::new())),
        }
    }
}

/// Whether accounts are on: `--auth`, or a server reachable from other machines.
pub fn accounts_on(state: &AppState) -> bool {
    state.settings.auth || !state.settings.addr.ip().is_loopback()
}

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
    if accounts_on(state) {
        if let Some(secret) = cookie(headers, SESSION_COOKIE) {
            if let Some(p) = session_principal(state, secret).await? {
                return Ok(p);
            }
        }
    }
    if let (Some(expected), Some(presented)) = (admin_token(state), cookie(headers, TOKEN_COOKIE)) {
        // The admin-token cookie counts for reads, and for writes the browser marks as coming
        // from this server's own pages (see `same_origin`).
        let usable = !super::policy::is_write(method) || same_origin(headers);
        if usable && constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
            return Ok(Principal::AdminToken);
        }
    }
    if !accounts_on(state) && admin_token(state).is_none() {
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
        (scope, None, Some(user)) if !user.disabled && accounts_on(state) => Ok(Principal::User {
            user: Arc::new(user),
            via: Via::Token {
                id: token.id,
                scope,
            },
        }),
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

/// Compares without returning early on the first differing byte, so response timing does not
/// reveal how much of a guessed secret was right. (The length is not secret.)
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

    #[test]
    fn a_principal_formatted_for_a_log_shows_no_secret() {
        let secret = crate::access::secret::new_secret();
        let csrf = session_csrf_token(&secret);
        let user = Arc::new(User {
            id: "u1".into(),
            name: "alice".into(),
            is_admin: false,
            disabled: false,
            created_at: 0,
            has_password: true,
        });
        let session = Principal::User {
            user: user.clone(),
            via: Via::Session {
                id_hash: hash_secret(&secret),
                csrf: csrf.clone(),
                csrf_hash: hash_secret(&csrf),
            },
        };
        for text in [format!("{session:?}"), format!("{session:#?}")] {
            assert!(text.contains("alice"), "{text}");
            for hidden in [&secret, &csrf, &hash_secret(&secret), &hash_secret(&csrf)] {
                assert!(!text.contains(hidden.as_str()), "{text}");
            }
            assert!(!text.contains(&csrf[crate::access::secret::PREFIX.len()..]));
        }
        let token = Principal::User {
            user,
            via: Via::Token {
                id: "t1".into(),
                scope: TokenScope::Read,
            },
        };
        assert!(format!("{token:?}").contains("t1"));
        assert!(session.is_session_csrf(csrf.as_bytes()));
        assert!(!session.is_session_csrf(secret.as_bytes()));
        assert!(!token.is_session_csrf(csrf.as_bytes()));
    }

    #[test]
    fn equal_secrets_match_and_different_ones_do_not() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secrets"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
