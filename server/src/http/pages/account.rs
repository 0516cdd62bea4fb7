//! Signing in and out, and the account page (personal access tokens).

use askama::Template;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect};
use axum::Extension;
use serde::Deserialize;

use super::next::same_origin_path;
use super::{html, PageError, PageResult};
use crate::access::principal::SESSION_COOKIE;
use crate::access::Principal;
use crate::actions::accounts::{self as actions, CreateToken};
use crate::app::AppState;
use crate::http::access::Client;
use crate::http::api::account;
use crate::http::principal::cookie;
use crate::http::ApiError;
use crate::store::accounts::ApiToken;

#[derive(Template)]
#[template(path = "sign_in.html")]
pub struct SignInPage {
    pub nav: &'static str,
    pub accounts: bool,
    pub name: String,
    pub next: String,
    pub error: Option<String>,
}

#[derive(Deserialize, Default)]
pub(super) struct NextParam {
    #[serde(default)]
    next: String,
}

pub(super) async fn sign_in_form(
    State(state): State<AppState>,
    query: Result<Query<NextParam>, QueryRejection>,
) -> PageResult {
    // A query that does not parse (`next` twice) is no page to go back to either.
    let next = query.map(|Query(q)| q.next).unwrap_or_default();
    html(SignInPage {
        nav: "",
        accounts: state.settings.accounts_on(),
        name: String::new(),
        next: same_origin_path(&next),
        error: None,
    })
}

#[derive(Deserialize)]
pub(super) struct SignInForm {
    name: String,
    password: String,
    #[serde(default)]
    next: String,
}

pub(super) async fn sign_in(
    State(state): State<AppState>,
    Client(client): Client,
    Form(f): Form<SignInForm>,
) -> PageResult {
    let next = same_origin_path(&f.next);
    match actions::start_session(&state, client.as_deref(), &f.name, &f.password)
        .await
        .map_err(ApiError::from)
    {
        Ok((_, secret, _)) => {
            let mut response = Redirect::to(&next).into_response();
            response.headers_mut().insert(
                header::SET_COOKIE,
                account::session_cookie(&state, Some(&secret)),
            );
            Ok(response)
        }
        Err(e) if e.status().is_client_error() => {
            let status = e.status();
            let message = match e {
                ApiError::Unauthorized => "Wrong user name or password.".to_owned(),
                other => other.to_string(),
            };
            let page = SignInPage {
                nav: "",
                accounts: state.settings.accounts_on(),
                name: f.name,
                next,
                error: Some(message),
            };
            Ok((status, Html(page.render()?)).into_response())
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn sign_out(State(state): State<AppState>, headers: HeaderMap) -> PageResult {
    actions::end_session(&state, cookie(&headers, SESSION_COOKIE)).await?;
    let mut response = Redirect::to("/sign-in").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, account::session_cookie(&state, None));
    Ok(response)
}

#[derive(Template)]
#[template(path = "account.html")]
pub struct AccountPage {
    pub nav: &'static str,
    pub user: String,
    pub tokens: Vec<TokenRow>,
    /// A token just created: its secret, shown this once.
    pub new_secret: Option<String>,
    pub error: Option<String>,
}

pub struct TokenRow {
    pub id: String,
    pub name: String,
    pub scope: &'static str,
    pub created: String,
    pub expires: String,
    pub last_used: String,
    pub revoked: bool,
}

fn when(ms: Option<i64>) -> String {
    ms.map(super::views::fmt_time).unwrap_or_else(|| "—".into())
}

fn token_row(t: ApiToken) -> TokenRow {
    TokenRow {
        scope: t.scope.as_str(),
        created: super::views::fmt_time(t.created_at),
        expires: when(t.expires_at),
        last_used: when(t.last_used_at),
        revoked: t.revoked_at.is_some(),
        id: t.id,
        name: t.name,
    }
}

async fn account_page(
    state: &AppState,
    principal: &Principal,
    new_secret: Option<String>,
    error: Option<String>,
) -> Result<AccountPage, PageError> {
    let Some(user) = principal.user() else {
        return Err(PageError::BadRequest(
            "personal tokens belong to a user: sign in as one".into(),
        ));
    };
    let tokens = state.store.list_tokens(&user.id).await?;
    Ok(AccountPage {
        nav: "account",
        user: user.name.clone(),
        tokens: tokens.into_iter().map(token_row).collect(),
        new_secret,
        error,
    })
}

pub(super) async fn account(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> PageResult {
    // The page carries the session's CSRF token: no cache keeps it.
    let page = account_page(&state, &principal, None, None).await?;
    Ok(account::no_store(Html(page.render()?)))
}

#[derive(Deserialize)]
pub(super) struct TokenForm {
    name: String,
    #[serde(default)]
    scope: String,
    #[serde(default)]
    expires_in_days: String,
}

pub(super) async fn create_token(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    Form(f): Form<TokenForm>,
) -> PageResult {
    let Some(user) = principal.user() else {
        return Err(PageError::BadRequest(
            "sign in as a user to create tokens".into(),
        ));
    };
    let days = match f.expires_in_days.trim() {
        "" => Ok(None),
        d => d
            .parse::<u32>()
            .map(Some)
            .map_err(|_| format!("expires_in_days: `{d}` is not a whole number of days")),
    };
    let result = match days {
        Err(message) => Err(message),
        Ok(expires_in_days) => {
            let body = CreateToken {
                name: f.name,
                scope: Some(f.scope).filter(|s| !s.is_empty()),
                expires_in_days,
            };
            actions::issue_token(&state, &principal, client.as_deref(), user, &body)
                .await
                .map_err(ApiError::from)
                .map_err(|e| match e {
                    e if e.status().is_client_error() => e.to_string(),
                    e => format!("internal: {e}"),
                })
        }
    };
    let (secret, error) = match result {
        Ok(created) => (Some(created.secret), None),
        Err(message) => (None, Some(message)),
    };
    let status = if error.is_some() {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::OK
    };
    // The page shows the new token's secret: no cache, the browser's back button included,
    // may keep it.
    let page = account_page(&state, &principal, secret, error).await?;
    Ok(account::no_store((status, Html(page.render()?))))
}

pub(super) async fn revoke_token(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    Path(id): Path<String>,
) -> PageResult {
    actions::revoke(&state, &principal, client.as_deref(), &id).await?;
    Ok(Redirect::to("/account").into_response())
}
