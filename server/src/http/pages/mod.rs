//! The browser dashboard: server-rendered askama pages (they work without JavaScript) and the
//! static ES modules that make them live. Pages read the store directly; actions that belong to
//! the API (stop, relaunch, launch) go through the API router in-process, so there is one
//! implementation of each.

mod assets;
pub mod checkpoints;
pub mod compare;
pub mod launch;
pub mod run;
pub mod runs;
pub mod views;

use crate::store::{DynStore, StoreError};
use askama::Template;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use run::{relaunch_run, run_page, set_notes, set_tag, stop_run};
use runs::{runs_home, runs_of_experiment};
use std::path::PathBuf;
use tower::ServiceExt;
use views::*;

/// What the pages need: the store, where run directories live, and the API router (with its
/// state) for actions.
#[derive(Clone)]
pub struct Dashboard {
    pub store: DynStore,
    pub data_dir: PathBuf,
    pub api: Router,
    /// Sent as the bearer token on in-process API calls when the server requires one.
    pub token: Option<String>,
}

impl Dashboard {
    /// A run's working directory (logs, checkpoints), as the launcher lays it out.
    pub fn run_dir(&self, run_id: &str) -> PathBuf {
        self.data_dir.join("runs").join(run_id)
    }

    /// Calls the API in-process; returns the status and the JSON body (null when empty).
    pub async fn call_api(
        &self,
        method: Method,
        uri: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(StatusCode, serde_json::Value), PageError> {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = &self.token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let body = match body {
            Some(v) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        let req = req
            .body(body)
            .map_err(|e| PageError::Internal(e.to_string()))?;
        let res = match self.api.clone().oneshot(req).await {
            Ok(res) => res,
            Err(never) => match never {},
        };
        let status = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), 16 * 1024 * 1024)
            .await
            .map_err(|e| PageError::Internal(e.to_string()))?;
        let json = if bytes.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)
        };
        Ok((status, json))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Internal(String),
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { .. } => PageError::NotFound(e.to_string()),
            StoreError::Invalid { .. } | StoreError::Conflict { .. } => {
                PageError::BadRequest(e.to_string())
            }
            other => PageError::Internal(format!("{other:?}")),
        }
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

/// The dashboard routes (any app state: they carry their own).
pub fn router<S: Clone + Send + Sync + 'static>(dashboard: Dashboard) -> Router<S> {
    Router::new()
        .route("/", get(runs_home))
        .route("/experiments/{id}", get(runs_of_experiment))
        .route("/runs/{id}", get(run_page))
        .route("/runs/{id}/tags", post(set_tag))
        .route("/runs/{id}/notes", post(set_notes))
        .route("/runs/{id}/stop", post(stop_run))
        .route("/runs/{id}/relaunch", post(relaunch_run))
        .route("/runs/{id}/checkpoints/{name}", get(checkpoints::download))
        .route("/compare", get(compare::compare_page))
        .route("/launch", get(launch::form).post(launch::submit))
        .route_layer(axum::middleware::from_fn_with_state(
            dashboard.clone(),
            require_token,
        ))
        .route("/static/{*file}", get(assets::static_file))
        .with_state(dashboard)
}

/// With an admin token configured (a server reachable from other machines), pages show data
/// only to a request carrying it, as a bearer header or a `trainyard_token` cookie.
async fn require_token(
    State(d): State<Dashboard>,
    req: Request<Body>,
    next: axum::middleware::Next,
) -> Response {
    let Some(token) = d.token.as_deref().filter(|t| !t.is_empty()) else {
        return next.run(req).await;
    };
    // Same rule as the API: the cookie for reads, and for the dashboard's own form posts.
    let presented = super::auth::presented_token(req.method(), req.headers());
    if presented.is_some_and(|p| super::auth::constant_time_eq(p.as_bytes(), token.as_bytes())) {
        return next.run(req).await;
    }
    let page = ErrorPage {
        nav: "",
        title: "Authentication required".to_string(),
        message: "This server requires its admin token: send it as a bearer token or set the \
                  `trainyard_token` cookie."
            .to_string(),
    };
    let body = page.render().unwrap_or_default();
    (StatusCode::UNAUTHORIZED, Html(body)).into_response()
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

/// Edits go through `PATCH /api/v1/runs/{id}` so the API's validation and live events apply.
pub(super) async fn api_patch(
    d: &Dashboard,
    id: &str,
    body: serde_json::Value,
) -> Result<(), PageError> {
    let (status, json) = d
        .call_api(Method::PATCH, &format!("/api/v1/runs/{id}"), Some(body))
        .await?;
    api_result(status, &json)
}

pub fn api_message(json: &serde_json::Value) -> String {
    json.pointer("/error/message")
        .and_then(|m| m.as_str())
        .unwrap_or("request failed")
        .to_string()
}

pub(super) fn api_result(status: StatusCode, json: &serde_json::Value) -> Result<(), PageError> {
    if status.is_success() {
        Ok(())
    } else if status == StatusCode::NOT_FOUND {
        Err(PageError::NotFound(api_message(json)))
    } else if status.is_client_error() {
        Err(PageError::BadRequest(api_message(json)))
    } else {
        Err(PageError::Internal(format!(
            "API answered {status}: {json}"
        )))
    }
}
