//! The dashboard over plain HTTP (no JavaScript): server-rendered pages, escaping, pagination,
//! checkpoint downloads and rendered charts, one module per page.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

#[allow(dead_code)]
#[path = "../kit/mod.rs"]
mod kit;
#[allow(dead_code)]
#[path = "../../../tests/browser/support.rs"]
mod support;

mod assets;
mod charts;
mod compare;
mod guard;
mod launch;
mod run;
mod runs;

use serde_json::json;
use support::*;

async fn get_text(app: &TestApp, path: &str) -> (u16, String) {
    let res = app.http.get(app.url(path)).send().await.expect("get");
    let status = res.status().as_u16();
    (status, res.text().await.expect("body"))
}

/// What askama does to text in a page.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#x27;")
}
