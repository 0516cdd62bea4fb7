//! Who is calling: the [`Principal`] the access check resolved from the credential a request
//! presents (`http::principal`), handed to handlers as a request extension.

use std::sync::Arc;

use super::secret::hash_secret;
use crate::store::accounts::{Level, TokenScope, User};
use crate::store::{Store, StoreResult};

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
    pub async fn level_on(&self, store: &dyn Store, experiment_id: &str) -> StoreResult<Level> {
        match self {
            p if p.is_admin() => Ok(Level::Manage),
            Principal::User { user, via } => {
                let level = store.experiment_level(&user.id, experiment_id).await?;
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

    /// The experiments whose runs the caller may read: `None` means every one
    /// ([`access::experiments_at`](crate::access::experiments_at) READ, the one rule).
    pub async fn readable_experiments(
        &self,
        store: &dyn Store,
    ) -> StoreResult<Option<Vec<String>>> {
        super::experiments_at(store, self, Level::Read).await
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
    use crate::access::secret::session_csrf_token;

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
