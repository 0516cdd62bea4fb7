//! Signing in and out and personal access tokens, for the API (`/api/v1/session`,
//! `/api/v1/tokens`) and the account pages alike.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::access::audit::AuditAction;
use crate::access::secret::{hash_secret, new_secret, session_csrf_token};
use crate::access::{audit, password, Principal};
use crate::error::Error;
use crate::state::AppState;
use crate::store::accounts::{ApiToken, SessionNew, TokenNew, TokenScope, User};
use crate::store::now_ms;
use crate::validate::Invalid;

/// Checks the password (throttled per user and per client) and creates a session: the user,
/// the cookie secret and the CSRF token. Shared by the API and the sign-in page.
pub async fn start_session(
    state: &AppState,
    client: Option<&str>,
    name: &str,
    password_text: &str,
) -> Result<(User, String, String), Error> {
    if !state.settings.accounts_on() {
        return Err(Error::conflict(
            "this server has no accounts (start it with --auth to turn them on)",
        ));
    }
    let client_key = client.unwrap_or("unknown");
    let name = name.trim();
    if let Some(wait) = state.throttle.check(name, client_key, Instant::now()) {
        return Err(Error::Throttled {
            message: format!("too many failed sign-ins; try again in {wait} seconds"),
            retry_after: wait,
        });
    }
    let user = state.store.user_by_name(name).await?;
    let hash = match &user {
        Some(u) if !u.disabled => state.store.password_hash(&u.id).await?,
        _ => None,
    };
    // Verify against a real hash even for an unknown user, so the answer's timing does not
    // tell which names exist.
    let candidate = password_text.to_owned();
    let ok = tokio::task::spawn_blocking(move || match hash {
        Some(h) => password::verify_password(&candidate, &h),
        None => {
            password::burn_time(&candidate);
            false
        }
    })
    .await
    .unwrap_or(false);
    let user = match (ok, user) {
        (true, Some(user)) => user,
        _ => {
            state.throttle.failed(name, client_key, Instant::now());
            audit::record(
                state.store.as_ref(),
                Some(name.to_owned()),
                client,
                AuditAction::SignInFailed,
                None,
                None,
            )
            .await;
            return Err(Error::SignIn);
        }
    };
    state.throttle.succeeded(name);
    let secret = new_secret();
    let csrf = session_csrf_token(&secret);
    let now = now_ms();
    let lifetime = i64::try_from(state.settings.session_max.as_millis()).unwrap_or(i64::MAX);
    state
        .store
        .create_session(SessionNew {
            id_hash: hash_secret(&secret),
            user_id: user.id.clone(),
            csrf_hash: hash_secret(&csrf),
            now,
            expires_at: now.saturating_add(lifetime),
            client: client.map(str::to_owned),
        })
        .await?;
    audit::record(
        state.store.as_ref(),
        Some(user.name.clone()),
        client,
        AuditAction::SignIn,
        None,
        None,
    )
    .await;
    Ok((user, secret, csrf))
}

/// Deletes the session whose cookie secret is `secret`, if any.
pub async fn end_session(state: &AppState, secret: Option<&str>) -> Result<(), Error> {
    if let Some(secret) = secret {
        state.store.delete_session(&hash_secret(secret)).await?;
        // Streams this session opened end too.
        state.access_epoch.bump();
    }
    Ok(())
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// What the token is for ("laptop", "CI").
    pub name: String,
    /// `read` (GET only) or `write` (everything the user may do). Default `write`.
    #[serde(default)]
    pub scope: Option<String>,
    /// Days until the token stops working; none = until revoked.
    #[serde(default)]
    pub expires_in_days: Option<u32>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreatedToken {
    pub token: ApiToken,
    /// The secret, shown this once: send it as `Authorization: Bearer <secret>`.
    pub secret: String,
}

/// Validates a token request and stores the token (shared by the API and the account page).
pub async fn issue_token(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    user: &User,
    body: &CreateToken,
) -> Result<CreatedToken, Error> {
    let name = crate::validate::Name::parse("name", &body.name)?;
    let scope = match body.scope.as_deref().unwrap_or("write") {
        "read" => TokenScope::Read,
        "write" => TokenScope::Write,
        other => {
            return Err(Invalid::new(
                "scope",
                format!("scope must be `read` or `write`, not `{other}`"),
            )
            .into())
        }
    };
    let now = now_ms();
    let expires_at = match body.expires_in_days {
        Some(0) => return Err(Invalid::new(
            "expires_in_days",
            "expires_in_days must be at least 1 (leave it out for a token that does not expire)",
        )
        .into()),
        Some(days) => Some(now + i64::from(days) * 86_400_000),
        None => None,
    };
    let secret = new_secret();
    let token = state
        .store
        .create_token(TokenNew {
            id: crate::access::secret::new_id(),
            secret_hash: hash_secret(&secret),
            user_id: Some(user.id.clone()),
            run_id: None,
            name: name.as_str().to_owned(),
            scope,
            created_at: now,
            expires_at,
        })
        .await?;
    audit::by(
        state.store.as_ref(),
        principal,
        client,
        AuditAction::TokenCreate,
        Some(&token.id),
        Some(name.as_str().to_owned()),
    )
    .await;
    Ok(CreatedToken { token, secret })
}

/// Revokes a token the caller owns (or any, for an administrator).
pub async fn revoke(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    id: &str,
) -> Result<(), Error> {
    let not_found = || Error::NotFound(format!("token `{id}` not found"));
    let token = state.store.get_token(id).await?.ok_or_else(not_found)?;
    let mine = principal.user_id().is_some() && token.user_id.as_deref() == principal.user_id();
    if !(mine || principal.is_admin()) {
        return Err(not_found());
    }
    state.store.revoke_token(id, now_ms()).await?;
    // Streams this token opened end too.
    state.access_epoch.bump();
    audit::by(
        state.store.as_ref(),
        principal,
        client,
        AuditAction::TokenRevoke,
        Some(id),
        None,
    )
    .await;
    Ok(())
}
