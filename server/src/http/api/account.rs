//! Signing in and out (`/api/v1/session`) and personal access tokens (`/api/v1/tokens`).
//!
//! A sign-in creates a server-side session: the browser keeps a random secret in an `HttpOnly`,
//! `SameSite=Lax` cookie (`Secure` behind an https public URL), the store keeps its hash, and
//! the session ends at sign-out, after the idle or absolute lifetime, or when the user's password
//! changes or the user is disabled. Writes that ride on the cookie carry the session's CSRF
//! token. Token secrets are shown once, at creation; only their hash is stored.

use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

use crate::access::principal::{accounts_on, cookie, SESSION_COOKIE};
use crate::access::secret::{hash_secret, new_secret, session_csrf_token};
use crate::access::{audit, password, Principal};
use crate::app::AppState;
use crate::http::access::Client;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiJson;
use crate::store::accounts::{ApiToken, SessionNew, TokenNew, TokenScope, User};
use crate::store::now_ms;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/session", get(whoami).post(sign_in).delete(sign_out))
        .route("/tokens", get(list_tokens).post(create_token))
        .route("/tokens/{id}", delete(revoke_token))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    pub name: String,
    pub password: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionInfo {
    /// Whether this server has accounts on (off: a single-user loopback server).
    pub accounts: bool,
    /// The signed-in user; null when nobody is.
    pub user: Option<User>,
    /// Send it back as `X-CSRF-Token` on writes made with the session cookie.
    pub csrf_token: Option<String>,
}

/// Who the request is signed in as.
#[utoipa::path(get, path = "/api/v1/session", tag = "account",
    responses((status = 200, body = SessionInfo)))]
pub async fn whoami(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Response {
    no_store(Json(SessionInfo {
        accounts: accounts_on(&state),
        user: principal.user().cloned(),
        csrf_token: principal.session_csrf().map(str::to_owned),
    }))
}

/// A response that carries a secret (a token's, a session's CSRF token): no cache, the
/// browser's included, may keep a copy (`Cache-Control: no-store`).
pub fn no_store(response: impl IntoResponse) -> Response {
    let mut response = response.into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Signs in with a name and password; sets the session cookie.
#[utoipa::path(post, path = "/api/v1/session", tag = "account",
    request_body = SignIn,
    responses(
        (status = 200, body = SessionInfo),
        (status = 401, description = "Wrong name or password", body = ErrorBody),
        (status = 409, description = "This server has no accounts (started without --auth on \
            loopback)", body = ErrorBody),
        (status = 429, description = "Too many failed sign-ins; see Retry-After", body = ErrorBody),
    ))]
pub async fn sign_in(
    State(state): State<AppState>,
    Client(client): Client,
    ApiJson(body): ApiJson<SignIn>,
) -> Result<Response, ApiError> {
    let (user, secret, csrf) =
        start_session(&state, client.as_deref(), &body.name, &body.password).await?;
    let mut response = no_store(Json(SessionInfo {
        accounts: true,
        user: Some(user),
        csrf_token: Some(csrf),
    }));
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie(&state, Some(&secret)));
    Ok(response)
}

/// Checks the password (throttled per user and per client) and creates a session: the user,
/// the cookie secret and the CSRF token. Shared by the API and the sign-in page.
pub async fn start_session(
    state: &AppState,
    client: Option<&str>,
    name: &str,
    password_text: &str,
) -> Result<(User, String, String), ApiError> {
    if !accounts_on(state) {
        return Err(ApiError::Conflict {
            field: None,
            message: "this server has no accounts (start it with --auth to turn them on)".into(),
        });
    }
    let client_key = client.unwrap_or("unknown");
    let name = name.trim();
    if let Some(wait) = state.throttle.check(name, client_key, Instant::now()) {
        return Err(ApiError::TooManyRequests {
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
                state,
                Some(name.to_owned()),
                client,
                "sign_in_failed",
                None,
                None,
            )
            .await;
            return Err(ApiError::Unauthorized);
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
        state,
        Some(user.name.clone()),
        client,
        "sign_in",
        None,
        None,
    )
    .await;
    Ok((user, secret, csrf))
}

/// The `Set-Cookie` value for a session secret, or one that clears the cookie.
pub fn session_cookie(state: &AppState, secret: Option<&str>) -> HeaderValue {
    let secure = state
        .settings
        .public_url
        .as_ref()
        .is_some_and(|u| u.scheme_str() == Some("https"));
    let value = match secret {
        Some(s) => format!(
            "{SESSION_COOKIE}={s}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{}",
            state.settings.session_max.as_secs(),
            if secure { "; Secure" } else { "" }
        ),
        None => format!(
            "{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0{}",
            if secure { "; Secure" } else { "" }
        ),
    };
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Signs out: ends the session and clears the cookie.
#[utoipa::path(delete, path = "/api/v1/session", tag = "account",
    responses((status = 204, description = "Signed out")))]
pub async fn sign_out(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    end_session(&state, &headers).await?;
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie(&state, None));
    Ok(response)
}

/// Deletes the session the request's cookie names, if any.
pub async fn end_session(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(secret) = cookie(headers, SESSION_COOKIE) {
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

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenList {
    pub tokens: Vec<ApiToken>,
}

fn own_user(principal: &Principal) -> Result<&User, ApiError> {
    principal.user().ok_or_else(|| ApiError::Forbidden {
        field: None,
        message: "personal tokens belong to a user: sign in as one".into(),
    })
}

/// The caller's personal access tokens (never their secrets).
#[utoipa::path(get, path = "/api/v1/tokens", tag = "account",
    responses((status = 200, body = TokenList)))]
pub async fn list_tokens(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<TokenList>, ApiError> {
    let user = own_user(&principal)?;
    let tokens = state.store.list_tokens(&user.id).await?;
    Ok(Json(TokenList { tokens }))
}

/// Creates a personal access token; its secret is in this answer only.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "account",
    request_body = CreateToken,
    responses(
        (status = 201, body = CreatedToken),
        (status = 422, description = "Invalid name, scope or expiry", body = ErrorBody),
    ))]
pub async fn create_token(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    ApiJson(body): ApiJson<CreateToken>,
) -> Result<Response, ApiError> {
    let user = own_user(&principal)?;
    let created = issue_token(&state, &principal, client.as_deref(), user, &body).await?;
    Ok(no_store((StatusCode::CREATED, Json(created))))
}

/// Validates a token request and stores the token (shared by the API and the account page).
pub async fn issue_token(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    user: &User,
    body: &CreateToken,
) -> Result<CreatedToken, ApiError> {
    let name = crate::validate::Name::parse("name", &body.name)?;
    let scope = match body.scope.as_deref().unwrap_or("write") {
        "read" => TokenScope::Read,
        "write" => TokenScope::Write,
        other => {
            return Err(ApiError::unprocessable(
                "scope",
                format!("scope must be `read` or `write`, not `{other}`"),
            ))
        }
    };
    let now = now_ms();
    let expires_at = match body.expires_in_days {
        Some(0) => return Err(ApiError::unprocessable(
            "expires_in_days",
            "expires_in_days must be at least 1 (leave it out for a token that does not expire)",
        )),
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
        state,
        principal,
        client,
        "token_create",
        Some(&token.id),
        Some(name.as_str().to_owned()),
    )
    .await;
    Ok(CreatedToken { token, secret })
}

/// Revokes one of the caller's tokens (an administrator may revoke anyone's).
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "account",
    params(("id" = String, Path, description = "Token id")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 404, description = "No such token of yours", body = ErrorBody),
    ))]
pub async fn revoke_token(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    revoke(&state, &principal, client.as_deref(), &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Revokes a token the caller owns (or any, for an administrator).
pub async fn revoke(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    id: &str,
) -> Result<(), ApiError> {
    let not_found = || ApiError::NotFound(format!("token `{id}` not found"));
    let token = state.store.get_token(id).await?.ok_or_else(not_found)?;
    let mine = principal.user_id().is_some() && token.user_id.as_deref() == principal.user_id();
    if !(mine || principal.is_admin()) {
        return Err(not_found());
    }
    state.store.revoke_token(id, now_ms()).await?;
    // Streams this token opened end too.
    state.access_epoch.bump();
    audit::by(state, principal, client, "token_revoke", Some(id), None).await;
    Ok(())
}
