//! Server-rendered charts (plotters) for reports and READMEs:
//! `GET /api/v1/runs/{id}/charts/{key}.svg|.png` and
//! `GET /api/v1/charts/compare.svg|.png?runs=a,b&key=K`.
//! Series are read downsampled (min/max kept), so a chart of a million-point metric is cheap.

use crate::http::palette;
use crate::store::{DynStore, Series, StoreError};
use plotters::prelude::*;
use serde::Deserialize;

/// The `i`-th line's colour: the dashboard's one palette, as a plotters colour.
fn series_color(i: usize) -> RGBColor {
    let (r, g, b) = palette::rgb(i);
    RGBColor(r, g, b)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// Splits `train/loss.svg` into (`train/loss`, Svg).
    pub fn split(file: &str) -> Option<(&str, Format)> {
        if let Some(k) = file.strip_suffix(".svg") {
            Some((k, Format::Svg))
        } else {
            file.strip_suffix(".png").map(|k| (k, Format::Png))
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Svg => "image/svg+xml",
            Format::Png => "image/png",
        }
    }
}

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

/// One line of a chart.
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChartParams {
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub max_points: Option<usize>,
    pub start_step: Option<i64>,
    pub end_step: Option<i64>,
    /// `true` for a logarithmic y axis.
    pub log: Option<bool>,
}

impl ChartParams {
    pub fn size(&self) -> Result<(u32, u32), ChartError> {
        let w = self.width.unwrap_or(800);
        let h = self.height.unwrap_or(400);
        for (field, v) in [("width", w), ("height", h)] {
            if !(100..=4000).contains(&v) {
                return Err(ChartError::Invalid {
                    field,
                    message: format!("must be between 100 and 4000 pixels, got {v}"),
                });
            }
        }
        Ok((w, h))
    }

    pub fn max_points(&self, width: u32) -> Result<usize, ChartError> {
        let n = self.max_points.unwrap_or(width as usize * 2);
        if !(2..=100_000).contains(&n) {
            return Err(ChartError::Invalid {
                field: "max_points",
                message: format!("must be between 2 and 100000, got {n}"),
            });
        }
        Ok(n)
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
    params: &ChartParams,
    width: u32,
) -> Result<Series, ChartError> {
    let max = params.max_points(width)?;
    Ok(store
        .read_series(run_id, key, params.start_step, params.end_step, max)
        .await?)
}

/// Renders lines to SVG text or PNG bytes. Runs on the blocking pool from handlers: text
/// layout and rasterising are CPU work.
pub fn render(
    title: &str,
    lines: &[Line],
    size: (u32, u32),
    log_y: bool,
    format: Format,
) -> Result<Vec<u8>, ChartError> {
    match format {
        Format::Svg => {
            let mut out = String::new();
            {
                let backend = SVGBackend::with_string(&mut out, size);
                draw(backend.into_drawing_area(), title, lines, log_y)?;
            }
            Ok(out.into_bytes())
        }
        Format::Png => {
            let mut rgb = vec![0u8; size.0 as usize * size.1 as usize * 3];
            {
                let backend = BitMapBackend::with_buffer(&mut rgb, size);
                draw(backend.into_drawing_area(), title, lines, log_y)?;
            }
            let mut png = Vec::new();
            image::ImageEncoder::write_image(
                image::codecs::png::PngEncoder::new(&mut png),
                &rgb,
                size.0,
                size.1,
                image::ColorType::Rgb8,
            )
            .map_err(|e| ChartError::Render(e.to_string()))?;
            Ok(png)
        }
    }
}

fn bounds(lines: &[Line], log_y: bool) -> (f64, f64, f64, f64) {
    let mut x0 = f64::INFINITY;
    let mut x1 = f64::NEG_INFINITY;
    let mut y0 = f64::INFINITY;
    let mut y1 = f64::NEG_INFINITY;
    for (x, y) in lines.iter().flat_map(|l| l.points.iter()) {
        if !y.is_finite() || (log_y && *y <= 0.0) {
            continue;
        }
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if !x0.is_finite() {
        return (0.0, 1.0, if log_y { 0.1 } else { 0.0 }, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        let pad = if y0 == 0.0 { 1.0 } else { y0.abs() * 0.1 };
        y0 -= if log_y { y0 * 0.5 } else { pad };
        y1 += pad;
    }
    if !log_y {
        let pad = (y1 - y0) * 0.05;
        y0 -= pad;
        y1 += pad;
    }
    (x0, x1, y0, y1)
}

fn draw<DB: DrawingBackend>(
    area: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    lines: &[Line],
    log_y: bool,
) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| ChartError::Render(e.to_string());
    area.fill(&WHITE).map_err(err)?;
    let (x0, x1, y0, y1) = bounds(lines, log_y);
    let mut builder = ChartBuilder::on(&area);
    builder
        .caption(
            title,
            ("sans-serif", 18)
                .into_font()
                .color(&RGBColor(0x1c, 0x24, 0x30)),
        )
        .margin(14)
        .x_label_area_size(34)
        .y_label_area_size(64);
    let grid = RGBColor(0xe7, 0xea, 0xef);
    let axis = RGBColor(0x5f, 0x6b, 0x7a);
    macro_rules! plot {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .light_line_style(grid)
                .bold_line_style(grid)
                .axis_style(axis)
                .label_style(("sans-serif", 12).into_font().color(&axis))
                .x_desc("step")
                .y_label_formatter(&|v| crate::http::pages::views::fmt_value(*v))
                .x_label_formatter(&|v| crate::http::pages::views::fmt_value(*v))
                .draw()
                .map_err(err)?;
            for (i, line) in lines.iter().enumerate() {
                let color = series_color(i);
                let pts = line
                    .points
                    .iter()
                    .copied()
                    .filter(|(_, y)| y.is_finite() && (!log_y || *y > 0.0));
                chart
                    .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                    .map_err(err)?
                    .label(line.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3))
                    });
            }
            if lines.len() > 1 || lines.iter().any(|l| !l.label.is_empty()) {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperRight)
                    .background_style(WHITE.mix(0.85))
                    .border_style(grid)
                    .label_font(
                        ("sans-serif", 12)
                            .into_font()
                            .color(&RGBColor(0x1c, 0x24, 0x30)),
                    )
                    .draw()
                    .map_err(err)?;
            }
        }};
    }
    if log_y {
        plot!(builder
            .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
            .map_err(err)?);
    } else {
        plot!(builder.build_cartesian_2d(x0..x1, y0..y1).map_err(err)?);
    }
    area.present().map_err(err)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// HTTP

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

impl IntoResponse for ChartError {
    fn into_response(self) -> Response {
        let (status, code, field, message) = match &self {
            ChartError::Invalid { field, message } => (
                StatusCode::BAD_REQUEST,
                "invalid",
                Some(*field),
                message.clone(),
            ),
            ChartError::Store(StoreError::NotFound { .. }) => {
                (StatusCode::NOT_FOUND, "not_found", None, self.to_string())
            }
            ChartError::Store(StoreError::Invalid { field, message }) => (
                StatusCode::BAD_REQUEST,
                "invalid",
                Some(*field),
                message.clone(),
            ),
            _ => {
                tracing::error!(error = ?self, "chart request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    None,
                    "internal error".to_string(),
                )
            }
        };
        let body = serde_json::json!({"error": {"code": code, "message": message, "field": field}});
        (status, axum::Json(body)).into_response()
    }
}

/// The chart routes, relative to `/api/v1`, for merging into the API router (any app state).
pub fn router<S: Clone + Send + Sync + 'static>(store: DynStore) -> Router<S> {
    Router::new()
        .route("/runs/{id}/charts/{*file}", get(run_chart))
        .route("/charts/{file}", get(compare_chart))
        .with_state(store)
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

async fn render_blocking(
    title: String,
    lines: Vec<Line>,
    size: (u32, u32),
    log_y: bool,
    format: Format,
) -> Result<Vec<u8>, ChartError> {
    tokio::task::spawn_blocking(move || render(&title, &lines, size, log_y, format))
        .await
        .map_err(|e| ChartError::Render(e.to_string()))?
}

#[tracing::instrument(skip(store, params))]
async fn run_chart(
    State(store): State<DynStore>,
    Path((id, file)): Path<(String, String)>,
    Query(params): Query<ChartParams>,
) -> Result<Response, ChartError> {
    let (key, format) = Format::split(&file).ok_or_else(|| ChartError::Invalid {
        field: "key",
        message: format!("`{file}` must end in .svg or .png"),
    })?;
    let size = params.size()?;
    let run = store.get_run(&id).await?;
    let series = read_line(&store, &id, key, &params, size.0).await?;
    let lines = vec![series_line("", &series)];
    let title = format!("{} · {}", run.name, key);
    let bytes = render_blocking(title, lines, size, params.log.unwrap_or(false), format).await?;
    Ok(image_response(format, bytes))
}

#[derive(Debug, Deserialize)]
struct CompareParams {
    runs: Option<String>,
    key: Option<String>,
    // Not `#[serde(flatten)]`: flattening breaks number parsing of query strings.
    width: Option<u32>,
    height: Option<u32>,
    max_points: Option<usize>,
    start_step: Option<i64>,
    end_step: Option<i64>,
    log: Option<bool>,
}

#[tracing::instrument(skip(store, params))]
async fn compare_chart(
    State(store): State<DynStore>,
    Path(file): Path<String>,
    Query(params): Query<CompareParams>,
) -> Result<Response, ChartError> {
    let format = match Format::split(&file) {
        Some(("compare", f)) => f,
        _ => {
            return Err(ChartError::Invalid {
                field: "path",
                message: format!("unknown chart `{file}`; expected compare.svg or compare.png"),
            })
        }
    };
    let key = params
        .key
        .as_deref()
        .filter(|k| !k.is_empty())
        .ok_or(ChartError::Invalid {
            field: "key",
            message: "a metric key is required".into(),
        })?;
    let ids: Vec<&str> = params
        .runs
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if ids.is_empty() || ids.len() > palette::PALETTE.len() * 4 {
        return Err(ChartError::Invalid {
            field: "runs",
            message: "give 1 to 32 comma-separated run ids".into(),
        });
    }
    let chart = ChartParams {
        width: params.width,
        height: params.height,
        max_points: params.max_points,
        start_step: params.start_step,
        end_step: params.end_step,
        log: params.log,
    };
    let size = chart.size()?;
    let mut lines = Vec::with_capacity(ids.len());
    for id in ids {
        let run = store.get_run(id).await?;
        let series = read_line(&store, id, key, &chart, size.0).await?;
        lines.push(series_line(&run.name, &series));
    }
    let log = chart.log.unwrap_or(false);
    let bytes = render_blocking(key.to_string(), lines, size, log, format).await?;
    Ok(image_response(format, bytes))
}
