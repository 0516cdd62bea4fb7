//! Charts: which chart shows which key (`layout.rs`, also behind `GET /api/v1/runs/{id}/charts`
//! for the run page's live cards), and server-rendered charts (plotters, `render.rs` on the
//! axes of `axis.rs`) for reports and READMEs: `GET /api/v1/runs/{id}/charts/{key}.svg|.png`
//! and `GET /api/v1/charts/compare.svg|.png?runs=a,b&key=K`. Series are read downsampled
//! (min/max kept), so a chart of a million-point metric is cheap.

pub mod axis;
pub mod layout;
pub use crate::chart_pool as pool;
pub mod render;

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;

use crate::access::Principal;
use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiQuery;
use crate::http::palette;
use crate::store::accounts::Level;
use crate::store::{DynStore, Series, StoreError};
pub use layout::{ChartLayout, XUnit};
pub use render::{render, Chart, Format, Line};

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("chart rendering failed: {0}")]
    Render(String),
}

impl From<ChartError> for ApiError {
    fn from(e: ChartError) -> ApiError {
        match e {
            ChartError::Invalid { field, message } => ApiError::bad_request(field, message),
            ChartError::Store(e) => e.into(),
            ChartError::Render(m) => ApiError::Internal(anyhow::anyhow!(m)),
        }
    }
}

impl IntoResponse for ChartError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

/// Query parameters of a rendered chart. Typed as text and parsed here, so a bad value is a
/// 400 naming the parameter in plain words.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ChartParams {
    /// Image width in pixels, 100 to 2000 (default 800).
    #[param(value_type = Option<u32>, minimum = 100, maximum = 2000)]
    pub width: Option<String>,
    /// Image height in pixels, 100 to 2000 (default 400).
    #[param(value_type = Option<u32>, minimum = 100, maximum = 2000)]
    pub height: Option<String>,
    /// Points read per line, 2 to 100000 (default: twice the width). Longer series are
    /// downsampled keeping each bucket's min and max.
    #[param(value_type = Option<u32>, minimum = 2, maximum = 100000)]
    pub max_points: Option<String>,
    /// Inclusive lower step bound.
    #[param(value_type = Option<i64>)]
    pub start_step: Option<String>,
    /// Inclusive upper step bound.
    #[param(value_type = Option<i64>)]
    pub end_step: Option<String>,
    /// `true` for a logarithmic y axis (values <= 0 are left out).
    #[param(value_type = Option<bool>)]
    pub log: Option<String>,
}

/// The largest width and height of a rendered chart, in pixels: a PNG of 2000×2000 holds a
/// 12 MB pixel buffer while it is drawn.
pub const MAX_CHART_PX: i64 = 2000;
/// The smallest.
pub const MIN_CHART_PX: i64 = 100;

/// The parsed, checked [`ChartParams`].
#[derive(Debug, Clone, Copy)]
pub struct ChartOptions {
    pub size: (u32, u32),
    pub max_points: usize,
    pub start_step: Option<i64>,
    pub end_step: Option<i64>,
    pub log: bool,
}

fn invalid(field: &'static str, message: String) -> ChartError {
    ChartError::Invalid { field, message }
}

/// `text` parsed as an integer in `range`, `default` when absent or empty.
fn int_in(
    field: &'static str,
    text: Option<&str>,
    range: std::ops::RangeInclusive<i64>,
    what: &str,
) -> Result<Option<i64>, ChartError> {
    let Some(t) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    match t.parse::<i64>() {
        Ok(n) if range.contains(&n) => Ok(Some(n)),
        _ => Err(invalid(
            field,
            format!(
                "{field} must be a whole number from {} to {}{what}, got `{t}`",
                range.start(),
                range.end()
            ),
        )),
    }
}

impl ChartParams {
    pub fn check(&self) -> Result<ChartOptions, ChartError> {
        let px = |field, text: &Option<String>, default| {
            int_in(
                field,
                text.as_deref(),
                MIN_CHART_PX..=MAX_CHART_PX,
                " pixels",
            )
            .map(|v| v.map_or(default, |n| n as u32))
        };
        let size = (
            px("width", &self.width, 800)?,
            px("height", &self.height, 400)?,
        );
        let max_points = int_in("max_points", self.max_points.as_deref(), 2..=100_000, "")?
            .map_or(size.0 as usize * 2, |n| n as usize);
        let steps = 0..=crate::store::MAX_STEP;
        let start_step = int_in("start_step", self.start_step.as_deref(), steps.clone(), "")?;
        let end_step = int_in("end_step", self.end_step.as_deref(), steps, "")?;
        if let (Some(s), Some(e)) = (start_step, end_step) {
            if s > e {
                return Err(invalid(
                    "start_step",
                    format!("start_step ({s}) is after end_step ({e})"),
                ));
            }
        }
        let log = match self.log.as_deref().map(str::trim) {
            None | Some("") | Some("false") | Some("0") => false,
            Some("true") | Some("1") => true,
            Some(other) => {
                return Err(invalid(
                    "log",
                    format!("log must be true or false, got `{other}`"),
                ))
            }
        };
        Ok(ChartOptions {
            size,
            max_points,
            start_step,
            end_step,
            log,
        })
    }
}

pub fn series_line(label: &str, s: &Series) -> Line {
    Line {
        label: label.to_string(),
        points: s.points.iter().map(|p| (p.step as f64, p.value)).collect(),
    }
}

/// Reads one key of one run for a chart.
pub async fn read_line(
    store: &DynStore,
    run_id: &str,
    key: &str,
    options: &ChartOptions,
) -> Result<Series, ChartError> {
    Ok(store
        .read_series(
            run_id,
            key,
            options.start_step,
            options.end_step,
            options.max_points,
        )
        .await?)
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// The chart routes, relative to `/api/v1`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/runs/{id}/charts", get(run_chart_layout))
        .route("/runs/{id}/charts/{*file}", get(run_chart))
        .route("/charts/{file}", get(compare_chart))
}

fn image_response(format: Format, bytes: Vec<u8>) -> Response {
    (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        bytes,
    )
        .into_response()
}

/// A place in the render pool, or a 503 asking the client to retry shortly.
fn admit(state: &AppState) -> Result<pool::Admitted, ApiError> {
    state
        .chart_pool
        .admit()
        .map_err(|busy| ApiError::Unavailable {
            message: busy.to_string(),
            retry_after: pool::CHART_RETRY_AFTER_S,
        })
}

async fn render_pooled(
    state: &AppState,
    admitted: pool::Admitted,
    chart: Chart,
    size: (u32, u32),
    format: Format,
) -> Result<Vec<u8>, ChartError> {
    state
        .chart_pool
        .render(admitted, move || render(&chart, size, format))
        .await
        .map_err(|e| ChartError::Render(e.to_string()))?
}

/// Which page of a run's chart layout.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LayoutParams {
    /// Charts per page, 1 to 100 (default 24).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// The run's charts as its page lays them out, a page at a time: which keys share a chart
/// (at most 128 each), in page order, and on the first page the expert-utilisation heatmaps.
/// The run page draws the first page and loads the next ones on demand; its script creates the
/// cards of keys that appear after it loaded from the first page.
#[utoipa::path(get, path = "/api/v1/runs/{id}/charts", tag = "charts",
    params(("id" = String, Path, description = "Run id"), LayoutParams),
    responses(
        (status = 200, body = ChartLayout),
        (status = 400, description = "A bad `limit` or `cursor`, named in `field`",
            body = ErrorBody),
        (status = 404, description = "Unknown run", body = ErrorBody),
    ))]
#[tracing::instrument(skip(state))]
pub async fn run_chart_layout(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(params): ApiQuery<LayoutParams>,
) -> Result<Json<ChartLayout>, ApiError> {
    let limit = int_in(
        "limit",
        params.limit.as_deref(),
        1..=layout::MAX_CHART_PAGE as i64,
        "",
    )?
    .map_or(layout::DEFAULT_CHART_PAGE, |n| n as usize);
    let keys: Vec<String> = state
        .store
        .metric_keys(&id)
        .await?
        .into_iter()
        .map(|k| k.key)
        .collect();
    let cursor = params.cursor.as_deref().filter(|c| !c.is_empty());
    let page =
        layout::page(&keys, cursor, limit).map_err(|m| ApiError::bad_request("cursor", m))?;
    Ok(Json(page))
}

/// The path of a run's chart (documentation only: the handler takes the path as a tuple).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct RunChartPath {
    /// Run id.
    id: String,
    /// The metric key and the format, e.g. `train/loss.svg` or `train/loss.png`.
    #[param(pattern = r"^.+\.(svg|png)$")]
    file: String,
}

/// The path of a comparison chart (documentation only).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct CompareChartPath {
    /// `compare.svg` or `compare.png`.
    #[param(pattern = r"^compare\.(svg|png)$")]
    file: String,
}

/// One metric of a run as an image.
#[utoipa::path(get, path = "/api/v1/runs/{id}/charts/{file}", tag = "charts",
    params(RunChartPath, ChartParams),
    responses(
        (status = 200, description = "The chart", content(
            (String = "image/svg+xml"),
            (String = "image/png"),
        )),
        (status = 400, description = "A bad parameter, named in `field` (`width` and \
            `height` are 100 to 2000 pixels)", body = ErrorBody),
        (status = 404, description = "Unknown run", body = ErrorBody),
        (status = 503, description = "The render pool is full; retry after `Retry-After` \
            seconds", body = ErrorBody),
    ))]
#[tracing::instrument(skip(state, params))]
pub async fn run_chart(
    State(state): State<AppState>,
    Path((id, file)): Path<(String, String)>,
    ApiQuery(params): ApiQuery<ChartParams>,
) -> Result<Response, ApiError> {
    let (key, format) = Format::split(&file).ok_or_else(|| {
        invalid(
            "key",
            format!("`{file}` must be a metric key ending in .svg or .png"),
        )
    })?;
    let options = params.check()?;
    let run = state.store.get_run(&id).await?;
    let admitted = admit(&state)?;
    let series = read_line(&state.store, &id, key, &options).await?;
    let chart = Chart {
        title: format!("{} · {}", run.name, key),
        lines: vec![series_line("", &series)],
        log_y: options.log,
        x_unit: XUnit::of(key),
    };
    let bytes = render_pooled(&state, admitted, chart, options.size, format).await?;
    Ok(image_response(format, bytes))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CompareParams {
    /// 1 to 32 comma-separated run ids, one line each.
    runs: Option<String>,
    /// The metric key, e.g. `train/loss`.
    key: Option<String>,
}

/// One metric of several runs overlaid, as an image.
#[utoipa::path(get, path = "/api/v1/charts/{file}", tag = "charts",
    params(CompareChartPath, CompareParams, ChartParams),
    responses(
        (status = 200, description = "The chart", content(
            (String = "image/svg+xml"),
            (String = "image/png"),
        )),
        (status = 400, description = "A bad parameter, named in `field`", body = ErrorBody),
        (status = 404, description = "One of the runs does not exist", body = ErrorBody),
        (status = 503, description = "The render pool is full; retry after `Retry-After` \
            seconds", body = ErrorBody),
    ))]
#[tracing::instrument(skip(state, compare, params))]
pub async fn compare_chart(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(file): Path<String>,
    ApiQuery(compare): ApiQuery<CompareParams>,
    ApiQuery(params): ApiQuery<ChartParams>,
) -> Result<Response, ApiError> {
    let format = match Format::split(&file) {
        Some(("compare", f)) => f,
        _ => {
            return Err(invalid(
                "path",
                format!("unknown chart `{file}`; expected compare.svg or compare.png"),
            )
            .into())
        }
    };
    let key = compare
        .key
        .as_deref()
        .filter(|k| !k.is_empty())
        .ok_or_else(|| invalid("key", "a metric key is required".into()))?;
    let ids: Vec<&str> = compare
        .runs
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if ids.is_empty() || ids.len() > palette::PALETTE.len() * 4 {
        return Err(invalid("runs", "give 1 to 32 comma-separated run ids".into()).into());
    }
    let options = params.check()?;
    // Every run compared is checked like a run route: one not readable is "not found".
    for id in &ids {
        crate::access::require_run(&state, &principal, id, Level::Read).await?;
    }
    let admitted = admit(&state)?;
    let mut lines = Vec::with_capacity(ids.len());
    for id in ids {
        let run = state.store.get_run(id).await?;
        let series = read_line(&state.store, id, key, &options).await?;
        lines.push(series_line(&run.name, &series));
    }
    let chart = Chart {
        title: key.to_string(),
        lines,
        log_y: options.log,
        x_unit: XUnit::of(key),
    };
    let bytes = render_pooled(&state, admitted, chart, options.size, format).await?;
    Ok(image_response(format, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_chart_parameters_name_the_field_in_plain_words() {
        let cases: [(ChartParams, &str, &str); 6] = [
            (
                ChartParams {
                    width: Some("5".into()),
                    ..Default::default()
                },
                "width",
                "from 100 to 2000 pixels",
            ),
            (
                ChartParams {
                    height: Some("x".into()),
                    ..Default::default()
                },
                "height",
                "got `x`",
            ),
            (
                ChartParams {
                    max_points: Some("1".into()),
                    ..Default::default()
                },
                "max_points",
                "from 2 to 100000",
            ),
            (
                ChartParams {
                    start_step: Some("-1".into()),
                    ..Default::default()
                },
                "start_step",
                "whole number",
            ),
            (
                ChartParams {
                    start_step: Some("9".into()),
                    end_step: Some("3".into()),
                    ..Default::default()
                },
                "start_step",
                "after end_step",
            ),
            (
                ChartParams {
                    log: Some("maybe".into()),
                    ..Default::default()
                },
                "log",
                "true or false",
            ),
        ];
        for (params, field, words) in cases {
            match params.check() {
                Err(ChartError::Invalid { field: f, message }) => {
                    assert_eq!(f, field);
                    assert!(message.contains(words), "{message}");
                }
                other => panic!("{field}: expected an error, got {other:?}"),
            }
        }
        let ok = ChartParams {
            log: Some("true".into()),
            ..Default::default()
        }
        .check();
        assert!(matches!(
            ok,
            Ok(ChartOptions {
                size: (800, 400),
                max_points: 1600,
                log: true,
                ..
            })
        ));
    }
}
