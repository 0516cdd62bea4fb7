//! The dashboard's static assets under `/static/`, embedded so the binary serves the dashboard
//! from any directory. Only the names listed here are served: a request path is compared with
//! them, never joined onto a directory. `palette.js` is generated from the one palette constant.

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::http::palette;

const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// An embedded file: its path under `static/`, content type and text.
macro_rules! asset {
    ($name:literal, $mime:expr) => {
        (
            $name,
            $mime,
            include_str!(concat!("../../../../static/", $name)),
        )
    };
}

const ASSETS: &[(&str, &str, &str)] = &[
    asset!("app.css", CSS),
    asset!("api.js", JS),
    asset!("live.js", JS),
    asset!("chart.js", JS),
    asset!("chart/data.js", JS),
    asset!("chart/scales.js", JS),
    asset!("chart/draw.js", JS),
    asset!("chart/interact.js", JS),
    asset!("chart/live.js", JS),
    asset!("chart/cards.js", JS),
    asset!("heatmap.js", JS),
    asset!("run.js", JS),
    asset!("runs.js", JS),
    asset!("compare.js", JS),
    asset!("checkpoints.js", JS),
    asset!("sweep.js", JS),
    asset!("sweep/table.js", JS),
    asset!("sweep/plots.js", JS),
];

fn palette_module() -> &'static str {
    static MODULE: OnceLock<String> = OnceLock::new();
    MODULE.get_or_init(palette::javascript_module)
}

fn lookup(file: &str) -> Option<(&'static str, &'static str)> {
    if file == "palette.js" {
        return Some((JS, palette_module()));
    }
    ASSETS
        .iter()
        .find(|(name, _, _)| *name == file)
        .map(|(_, mime, body)| (*mime, *body))
}

pub async fn static_file(Path(file): Path<String>) -> Response {
    match lookup(&file) {
        Some((mime, body)) => (
            [
                (header::CONTENT_TYPE, mime),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}
