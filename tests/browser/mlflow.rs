//! A researcher keeps their MLflow code: with the runs table open, a script using the official
//! `mlflow` client starts a run and logs its loss step by step. The run appears in the table
//! without a reload; the researcher clicks it and watches its chart grow while the script logs.

use fantoccini::Locator;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);
const STEPS: i64 = 60;

#[tokio::test]
async fn a_run_logged_by_the_mlflow_client_appears_in_the_runs_table_and_its_chart_grows_live() {
    let app = spawn_app().await;
    let b = browser().await;
    b.client.goto(&app.url("/")).await.expect("goto");
    b.wait_for("return !!document.getElementById('runs-rows')", WAIT)
        .await;
    b.eval("window.__sameDocument = 'yes'; return null").await;

    let mut child = Command::new(crate::kit::mlflow_python())
        .arg(crate::kit::mlflow_scenario())
        .arg(app.url(""))
        .args([
            "--live",
            "from-mlflow",
            "--steps",
            &STEPS.to_string(),
            "--delay",
            "0.25",
        ])
        .env("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        .env_remove("MLFLOW_TRACKING_TOKEN")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the MLflow script starts");
    let stdout = child.stdout.take().expect("stdout");
    let run_id = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().expect("a line").expect("utf-8");
        std::thread::spawn(move || lines.for_each(drop));
        first
            .strip_prefix("RUN_ID ")
            .expect("RUN_ID line")
            .to_owned()
    })
    .await
    .expect("run id");

    // The run appears in the open table, by itself.
    b.wait_for(
        &format!("return !!document.querySelector('[data-run-row=\"{run_id}\"]')"),
        WAIT,
    )
    .await;
    assert_eq!(b.eval("return window.__sameDocument").await, json!("yes"));
    b.screenshot("mlflow-runs").await;

    // A person clicks the run's name.
    b.client
        .find(Locator::Css(&format!("[data-run-row=\"{run_id}\"] a")))
        .await
        .expect("run link")
        .click()
        .await
        .expect("click");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    b.wait_for(
        "const c = window.__trainyard.charts['train/loss']; return !!c && c.points > 0",
        WAIT,
    )
    .await;
    let seen = b
        .eval("return window.__trainyard.charts['train/loss'].points")
        .await
        .as_i64()
        .expect("points");
    assert!(
        seen < STEPS,
        "the script was still logging when the page opened ({seen} points)"
    );
    // The chart grows while the script logs, and ends with every step.
    b.wait_for(
        &format!("const c = window.__trainyard.charts['train/loss']; return c.points > {seen}"),
        WAIT,
    )
    .await;
    b.wait_for(
        &format!(
            "const c = window.__trainyard.charts['train/loss']; \
             return c.points === {STEPS} && c.lastStep === {}",
            STEPS - 1
        ),
        WAIT,
    )
    .await;
    let status = tokio::task::spawn_blocking(move || child.wait().expect("script ends"))
        .await
        .expect("wait");
    assert!(status.success(), "the MLflow script failed");
    b.wait_for(
        &format!(
            "return document.querySelector('[data-status-of=\"{run_id}\"]').dataset.status === 'finished'"
        ),
        WAIT,
    )
    .await;
    b.screenshot("mlflow-run").await;
    b.close().await;
}
