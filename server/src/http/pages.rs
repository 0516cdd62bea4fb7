//! The browser dashboard: server-rendered askama pages (they work without JavaScript) and the
//! static ES modules that make them live. Pages read the store directly; actions that belong to
//! the API (stop, relaunch, launch) go through the API router in-process, so there is one
//! implementation of each.

use super::launch_page;
use super::views::*;
use crate::store::{DynStore, Run, RunQuery, RunStatus, StoreError};
use askama::Template;
use axum::body::Body;
use axum::extract::{Form, Path, Query, State};
use axum::http::{header, Method, Request, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tower::ServiceExt;

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
        .route(
            "/runs/{id}/checkpoints/{name}",
            get(super::checkpoints::download),
        )
        .route("/compare", get(super::compare_page::compare_page))
        .route("/launch", get(launch_page::form).post(launch_page::submit))
        .route_layer(axum::middleware::from_fn_with_state(
            dashboard.clone(),
            require_token,
        ))
        .route("/static/{file}", get(static_file))
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
// Static assets, embedded so the binary serves the dashboard from any directory.

const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../../static/app.css"),
    ),
    (
        "chart.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../static/chart.js"),
    ),
    (
        "heatmap.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../static/heatmap.js"),
    ),
    (
        "live.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../static/live.js"),
    ),
    (
        "run.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../static/run.js"),
    ),
    (
        "runs.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../static/runs.js"),
    ),
    (
        "compare.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../static/compare.js"),
    ),
];

async fn static_file(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, mime, body)) => (
            [
                (header::CONTENT_TYPE, *mime),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}

// ---------------------------------------------------------------------------------------------
// Runs table

#[derive(Debug, Default, Deserialize)]
pub struct RunsParams {
    pub experiment: Option<String>,
    pub status: Option<String>,
    pub tag: Option<String>,
    pub q: Option<String>,
    pub cols: Option<String>,
    pub sort: Option<String>,
    pub cursor: Option<String>,
    pub limit: Option<usize>,
}

async fn runs_home(State(d): State<Dashboard>, Query(p): Query<RunsParams>) -> PageResult {
    runs_table(&d, p).await
}

async fn runs_of_experiment(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Query(mut p): Query<RunsParams>,
) -> PageResult {
    if p.experiment.as_deref().unwrap_or("").is_empty() {
        p.experiment = Some(id);
    }
    runs_table(&d, p).await
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

#[tracing::instrument(skip(d))]
pub async fn runs_table(d: &Dashboard, p: RunsParams) -> PageResult {
    let experiments = d.store.list_experiments().await?;
    let experiment = match non_empty(&p.experiment) {
        Some(e) => Some(d.store.get_experiment(e).await?),
        None => None,
    };
    let filters = Filters {
        experiment: experiment
            .as_ref()
            .map(|e| e.id.clone())
            .unwrap_or_default(),
        status: non_empty(&p.status).unwrap_or("").to_string(),
        tag: non_empty(&p.tag).unwrap_or("").to_string(),
        q: non_empty(&p.q).unwrap_or("").to_string(),
        cols: non_empty(&p.cols).unwrap_or("").to_string(),
        sort: non_empty(&p.sort).unwrap_or("").to_string(),
    };
    let mut error = None;
    let status = match non_empty(&p.status) {
        Some(s) => match s.parse::<RunStatus>() {
            Ok(s) => Some(s),
            Err(e) => {
                error = Some(format!("status: {e}"));
                None
            }
        },
        None => None,
    };
    let filter = match non_empty(&p.q) {
        Some(q) => match parse_q(q) {
            Ok(f) => Some(f),
            Err(e) => {
                error = Some(format!("q: {e}"));
                None
            }
        },
        None => None,
    };
    let (sort, dir) = parse_sort(&filters.sort);
    let query = RunQuery {
        experiment_id: experiment.as_ref().map(|e| e.id.clone()),
        status,
        tag: non_empty(&p.tag).map(str::to_string),
        filter,
        sort,
        dir,
        limit: p.limit.unwrap_or(50).clamp(1, 500),
        cursor: non_empty(&p.cursor).map(str::to_string),
    };
    let page = if error.is_some() {
        crate::store::RunPage {
            runs: Vec::new(),
            next_cursor: None,
        }
    } else {
        match d.store.search_runs(&query).await {
            Ok(page) => page,
            Err(StoreError::Invalid { field, message }) => {
                error = Some(format!("{field}: {message}"));
                crate::store::RunPage {
                    runs: Vec::new(),
                    next_cursor: None,
                }
            }
            Err(e) => return Err(e.into()),
        }
    };
    let names: BTreeMap<&str, &str> = experiments
        .iter()
        .map(|e| (e.id.as_str(), e.name.as_str()))
        .collect();
    let (param_cols, metric_cols) = table_columns(&filters.cols, &page.runs);
    let now = crate::store::now_ms();
    let rows = page
        .runs
        .iter()
        .map(|r| run_row(r, &names, &param_cols, &metric_cols, now))
        .collect();
    let link = |sort: &str, cursor: Option<&str>| {
        let mut q = vec![];
        for (k, v) in [
            ("experiment", filters.experiment.as_str()),
            ("status", filters.status.as_str()),
            ("tag", filters.tag.as_str()),
            ("q", filters.q.as_str()),
            ("cols", filters.cols.as_str()),
            ("sort", sort),
            ("cursor", cursor.unwrap_or("")),
        ] {
            if !v.is_empty() {
                q.push(format!("{k}={}", enc(v)));
            }
        }
        format!("/?{}", q.join("&"))
    };
    let header = |label: String, field: Option<String>, numeric: bool| {
        let (sorted, desc) = match &field {
            Some(f) => {
                let current = if filters.sort.is_empty() {
                    "-created_at"
                } else {
                    filters.sort.as_str()
                };
                (
                    current.trim_start_matches('-') == f,
                    current.starts_with('-'),
                )
            }
            None => (false, false),
        };
        let sort_href = field.map(|f| {
            // A click on the sorted column flips its direction; a new column starts ascending.
            let next = if sorted && !desc { format!("-{f}") } else { f };
            link(&next, None)
        });
        Header {
            label,
            numeric,
            sort_href,
            sorted,
            aria_sort: if desc { "descending" } else { "ascending" },
            arrow: match (sorted, desc) {
                (true, true) => " ↓",
                (true, false) => " ↑",
                _ => "",
            },
        }
    };
    let mut headers = vec![
        header("Status".into(), Some("status".into()), false),
        header("Name".into(), Some("name".into()), false),
        header("Experiment".into(), None, false),
    ];
    headers.extend(
        param_cols
            .iter()
            .map(|c| header(c.clone(), Some(format!("params.{c}")), true)),
    );
    headers.extend(
        metric_cols
            .iter()
            .map(|c| header(c.clone(), Some(format!("metrics.{c}")), true)),
    );
    headers.push(header("Duration".into(), None, true));
    headers.push(header("Tags".into(), None, false));
    headers.push(header("Created".into(), Some("created_at".into()), false));
    let paged = query.cursor.is_some();
    let view = RunsPage {
        nav: "runs",
        heading: match &experiment {
            Some(e) => e.name.clone(),
            None => "Runs".to_string(),
        },
        subtitle: match &experiment {
            Some(_) => "Runs of this experiment. Status updates live.".to_string(),
            None => "All runs across experiments. Status updates live.".to_string(),
        },
        experiments: experiments
            .iter()
            .map(|e| ExperimentChoice {
                id: e.id.clone(),
                name: e.name.clone(),
                selected: e.id == filters.experiment,
            })
            .collect(),
        statuses: RunStatus::ALL
            .iter()
            .map(|s| Choice {
                value: s.as_str().to_string(),
                selected: s.as_str() == filters.status,
            })
            .collect(),
        count_label: format!(
            "{} run{}{}",
            page.runs.len(),
            if page.runs.len() == 1 { "" } else { "s" },
            if page.next_cursor.is_some() || paged {
                " on this page"
            } else {
                ""
            }
        ),
        first_href: paged.then(|| link(&filters.sort, None)),
        next_href: page
            .next_cursor
            .as_deref()
            .map(|c| link(&filters.sort, Some(c))),
        filters,
        error,
        headers,
        rows,
    };
    html(view)
}

fn run_row(
    r: &Run,
    names: &BTreeMap<&str, &str>,
    params: &[String],
    metrics: &[String],
    now: i64,
) -> RunRow {
    RunRow {
        id: r.id.clone(),
        short_id: r.id.chars().take(8).collect(),
        name: r.name.clone(),
        status: r.status.as_str(),
        experiment: names
            .get(r.experiment_id.as_str())
            .unwrap_or(&"?")
            .to_string(),
        params: params
            .iter()
            .map(|k| r.params.get(k).cloned().unwrap_or_default())
            .collect(),
        metrics: metrics
            .iter()
            .map(|k| {
                r.latest_metrics
                    .get(k)
                    .map(|m| fmt_value(m.value))
                    .unwrap_or_default()
            })
            .collect(),
        duration: run_duration(r, now),
        tags: tag_labels(&r.tags),
        created: fmt_time(r.created_at),
    }
}

// ---------------------------------------------------------------------------------------------
// Run page and its actions

/// Run ids are 32 lowercase hex characters; anything else never reaches the store or disk.
pub fn check_run_id(id: &str) -> Result<(), PageError> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(PageError::NotFound(format!("run `{id}` not found")))
    }
}

#[tracing::instrument(skip(d))]
async fn run_page(State(d): State<Dashboard>, Path(id): Path<String>) -> PageResult {
    check_run_id(&id)?;
    let run = d.store.get_run(&id).await?;
    let experiment = d.store.get_experiment(&run.experiment_id).await?;
    let keys: Vec<String> = d
        .store
        .metric_keys(&id)
        .await?
        .into_iter()
        .map(|k| k.key)
        .collect();
    let charts = chart_groups(&keys)
        .into_iter()
        .map(|(title, keys)| ChartCard {
            latest: keys
                .first()
                .and_then(|k| run.latest_metrics.get(k))
                .map(|m| format!("{} @ {}", fmt_value(m.value), m.step))
                .unwrap_or_default(),
            svg_href: format!(
                "/api/v1/runs/{}/charts/{}.svg?width=640&height=300",
                run.id,
                enc_path(&keys[0])
            ),
            keys_csv: keys.join(","),
            title,
        })
        .collect();
    let checkpoints = super::checkpoints::list(&d, &run.id).await;
    let config_yaml = run
        .config
        .as_ref()
        .and_then(|c| serde_yaml_ng::to_string(c).ok());
    let exit = run.exit.as_ref().map(|e| {
        let mut parts = vec![];
        if let Some(c) = e.exit_code {
            parts.push(format!("exit code {c}"));
        }
        if let Some(s) = e.signal {
            parts.push(format!("signal {s}"));
        }
        if let Some(m) = &e.message {
            parts.push(m.clone());
        }
        parts.join(" · ")
    });
    let view = RunPage {
        nav: "runs",
        run: RunHeader {
            id: run.id.clone(),
            name: run.name.clone(),
            status: run.status.as_str(),
            experiment_id: experiment.id.clone(),
            experiment: experiment.name.clone(),
            duration: run_duration(&run, crate::store::now_ms()),
            stoppable: matches!(run.status, RunStatus::Queued | RunStatus::Running),
            relaunchable: run.config.is_some(),
            exit: exit.filter(|e| !e.is_empty()),
            tags: tag_labels(&run.tags),
            notes: run.notes.clone(),
        },
        heatmaps: heatmap_cards(&keys),
        charts,
        checkpoints,
        params: run.params.clone().into_iter().collect(),
        config_yaml,
        log_placeholder: "Log output appears here while the run is live.".to_string(),
        after_step: run
            .latest_metrics
            .values()
            .map(|m| m.step)
            .max()
            .map(|s| s.to_string())
            .unwrap_or_default(),
    };
    html(view)
}

#[derive(Deserialize)]
struct TagForm {
    key: String,
    #[serde(default)]
    value: String,
}

async fn set_tag(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<TagForm>,
) -> PageResult {
    check_run_id(&id)?;
    let key = f.key.trim();
    if key.is_empty() {
        return Err(PageError::BadRequest("key: a tag needs a key".into()));
    }
    let tags = BTreeMap::from([(key.to_string(), f.value)]);
    let body = serde_json::json!({ "tags": tags });
    api_patch(&d, &id, body).await?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

#[derive(Deserialize)]
struct NotesForm {
    notes: String,
}

async fn set_notes(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<NotesForm>,
) -> PageResult {
    check_run_id(&id)?;
    api_patch(&d, &id, serde_json::json!({ "notes": f.notes })).await?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

/// Edits go through `PATCH /api/v1/runs/{id}` so the API's validation and live events apply.
async fn api_patch(d: &Dashboard, id: &str, body: serde_json::Value) -> Result<(), PageError> {
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

fn api_result(status: StatusCode, json: &serde_json::Value) -> Result<(), PageError> {
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

async fn stop_run(State(d): State<Dashboard>, Path(id): Path<String>) -> PageResult {
    check_run_id(&id)?;
    let (status, json) = d
        .call_api(Method::POST, &format!("/api/v1/runs/{id}/stop"), None)
        .await?;
    api_result(status, &json)?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

async fn relaunch_run(State(d): State<Dashboard>, Path(id): Path<String>) -> PageResult {
    check_run_id(&id)?;
    let run = d.store.get_run(&id).await?;
    let Some(config) = run.config.clone() else {
        return Err(PageError::BadRequest(
            "config: this run has no recorded config to relaunch".into(),
        ));
    };
    let gpus = run
        .tags
        .get("gpus")
        .and_then(|g| g.parse::<u32>().ok())
        .unwrap_or(0);
    let body = launch_page::launch_body(
        &run.experiment_id,
        Some(&format!("{}-relaunch", run.name)),
        config,
        gpus,
        Some(&run.id),
    );
    let (status, json) = d.call_api(Method::POST, "/api/v1/runs", Some(body)).await?;
    api_result(status, &json)?;
    let new_id = json.get("id").and_then(|v| v.as_str()).unwrap_or(&id);
    Ok(Redirect::to(&format!("/runs/{new_id}")).into_response())
}
