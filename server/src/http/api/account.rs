//! Signing in and out (`/api/v1/session`) and personal access tokens (`/api/v1/tokens`).
//!
//! A sign-in creates a server-side session: the browser keeps a random secret in an `HttpOnly`,
//! `SameSite=Lax` cookie (`Secure` behind an https public URL), the store keeps its hash, and
//! the session ends at sign-out, after the idle or absolute lifetime, or when the user's password
//! changes or the user is disabled. Writes that ride on the cookie carry the session's CSRF
//! token. Token secrets are shown once, at creation; only their hash is stored.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

use crate::access::principal::SESSION_COOKIE;
use crate::access::Principal;
pub use crate::actions::accounts::{
    end_session, issue_token, revoke, start_session, CreateToken, CreatedToken,
};
use crate::app::AppState;
use crate::http::access::Client;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiJson;
use crate::http::principal::cookie;
use crate::store::accounts::{ApiToken, User};

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
        accounts: state.settings.accounts_on(),
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
    end_session(&state, cookie(&headers, SESSION_COOKIE)).await?;
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie(&state, None));
    Ok(response)
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
