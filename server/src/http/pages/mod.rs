//! The browser dashboard: server-rendered askama pages (they work without JavaScript) and the
//! static ES modules that make them live. Pages share the API's state; they read the store
//! directly and perform actions (edit, stop, launch) through `crate::actions`, the functions
//! the API handlers call, with input validated by the same `crate::validate` types.

pub mod account;
pub mod admin;
mod api_docs;
mod assets;
pub mod checkpoints;
pub mod chrome;
pub mod columns;
pub mod compare;
pub mod guard;
pub mod launch;
pub mod models;
pub mod next;
pub mod run;
pub mod runs;
mod sweep_actions;
mod sweep_around;
pub mod sweeps;
pub mod views;

use crate::app::AppState;
use crate::http::error::ApiError;
use crate::store::StoreError;
use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use run::{relaunch_run, run_page, set_notes, set_tag, stop_run};
use runs::{runs_home, runs_of_experiment};
use views::*;

#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    /// A client mistake the API would answer with this status (422 for a refused value, 409
    /// for a conflict, 403 ...): the page shows the API's message with the same status.
    #[error("{1}")]
    Refused(StatusCode, String),
    #[error("{0}")]
    Internal(String),
}

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        let status = e.status();
        match e {
            ApiError::NotFound(m) => PageError::NotFound(m),
            ApiError::Internal(cause) => PageError::Internal(format!("{cause:#}")),
            other if status.is_client_error() => PageError::Refused(status, other.to_string()),
            other => PageError::Internal(other.to_string()),
        }
    }
}

impl From<crate::error::Error> for PageError {
    fn from(e: crate::error::Error) -> Self {
        ApiError::from(e).into()
    }
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        ApiError::from(e).into()
    }
}

impl From<crate::validate::Invalid> for PageError {
    fn from(e: crate::validate::Invalid) -> Self {
        ApiError::from(e).into()
    }
}

impl From<askama::Error> for PageError {
    fn from(e: askama::Error) -> Self {
        PageError::Internal(format!("template: {e}"))
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, title, message) = match self {
            PageError::NotFound(m) => (StatusCode::NOT_FOUND, "Not found", m),
            PageError::BadRequest(m) => (StatusCode::BAD_REQUEST, "Bad request", m),
            PageError::Refused(status, m) => (status, "Not done", m),
            PageError::Internal(cause) => {
                tracing::error!(%cause, "page failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Something went wrong",
                    "The server hit an internal error; it has been logged.".to_string(),
                )
            }
        };
        let page = ErrorPage {
            nav: "",
            title: title.to_string(),
            message,
        };
        match page.render() {
            Ok(html) => (status, Html(html)).into_response(),
            Err(_) => (status, title).into_response(),
        }
    }
}

pub type PageResult = Result<Response, PageError>;

pub fn html(t: impl Template) -> PageResult {
    Ok(Html(t.render()?).into_response())
}

/// The dashboard routes (the access check is applied around them and the API in `app::app`).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(runs_home))
        .route("/experiments/{id}", get(runs_of_experiment))
        .route("/runs/{id}", get(run_page))
        .route("/runs/{id}/tags", post(set_tag))
        .route("/runs/{id}/notes", post(set_notes))
        .route("/runs/{id}/stop", post(stop_run))
        .route("/runs/{id}/end", post(run::mark_ended))
        .route("/runs/{id}/relaunch", post(relaunch_run))
        .route("/runs/{id}/resume", post(run::resume_run))
        .route("/runs/{id}/delete", post(run::delete_run))
        .route("/runs/{id}/panels", get(checkpoints::panels))
        .route("/runs/{id}/artifacts/{*path}", get(run::artifact))
        .route(
            "/runs/{id}/checkpoints/{name}/sample",
            get(checkpoints::sample_form).post(checkpoints::sample),
        )
        .route(
            "/runs/{id}/checkpoints/{name}/register",
            post(models::register),
        )
        .route("/models", get(models::models_page))
        .route("/models/{id}", get(models::model_page))
        .route("/models/{id}/aliases", post(models::set_alias))
        .route("/compare", get(compare::compare_page))
        .route("/launch", get(launch::form).post(launch::submit))
        .route("/sweeps", get(sweeps::sweeps_page))
        .route(
            "/sweeps/new",
            get(sweeps::new_sweep_form).post(sweeps::submit_sweep),
        )
        .route("/sweeps/{id}", get(sweeps::sweep_page))
        .route("/sweeps/{id}/pause", post(sweep_actions::pause))
        .route("/sweeps/{id}/resume", post(sweep_actions::resume))
        .route("/sweeps/{id}/stop", post(sweep_actions::stop))
        .route("/sweeps/{id}/change", post(sweep_actions::change_sweep))
        .route(
            "/sign-in",
            get(account::sign_in_form).post(account::sign_in),
        )
        .route("/sign-out", post(account::sign_out))
        .route("/account", get(account::account))
        .route("/account/tokens", post(account::create_token))
        .route("/account/tokens/{id}/revoke", post(account::revoke_token))
        .route("/admin/users", get(admin::users).post(admin::add_user))
        .route("/admin/users/{name}", post(admin::change_user))
        .route("/admin/teams", post(admin::add_team))
        .route("/admin/teams/{id}/members", post(admin::team_member))
        .route("/admin/audit", get(admin::audit))
        .route(
            "/experiments/{id}/sharing",
            get(admin::sharing).post(admin::set_sharing),
        )
        .route("/api-docs", get(api_docs::api_docs))
        .route("/static/{*file}", get(assets::static_file))
}

// ---------------------------------------------------------------------------------------------
// Shared by the pages

/// Run ids are 32 lowercase hex characters; anything else never reaches the store or disk.
pub fn check_run_id(id: &str) -> Result<(), PageError> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(PageError::NotFound(format!("run `{id}` not found")))
    }
}
