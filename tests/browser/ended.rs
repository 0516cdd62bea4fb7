//! A run this server did not launch (created over the API, by an MLflow client, by `trainyard
//! train --server`) has no process here to stop: its page offers "Mark as ended" with a reason
//! instead of a Stop that could only fail, and Delete once it has ended, without a reload.

use fantoccini::Locator;
use serde_json::json;
use std::time::{Duration, Instant};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(15);

async fn click(b: &Browser, css: &str) {
    b.client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e}"));
}

#[tokio::test]
async fn a_run_reported_from_elsewhere_is_marked_failed_with_a_reason_and_then_deleted() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "elsewhere", "name": "notebook-run"}))
        .await;
    app.patch(&id, json!({"status": "running"})).await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for(
        "return document.getElementById('live-state').textContent === 'live'",
        WAIT,
    )
    .await;
    // No Stop to press (this server holds no process of the run); Delete waits for the end.
    assert_eq!(
        b.eval("return document.getElementById('stop-button') === null")
            .await,
        json!(true),
        "a Stop button that can only fail is offered"
    );
    assert_eq!(
        b.eval("return document.getElementById('delete-button').disabled")
            .await,
        json!(true)
    );
    let form_shown = b
        .eval("const f = document.getElementById('end-form'); return !!f && !f.hidden")
        .await;
    assert_eq!(form_shown, json!(true), "Mark as ended is offered");
    b.eval("window.__sameDocument = 'yes'; return null").await;

    // The person says how it ended and why.
    b.client
        .find(Locator::Css("#end-status option[value=failed]"))
        .await
        .expect("failed option")
        .click()
        .await
        .expect("choose failed");
    b.client
        .find(Locator::Id("end-reason"))
        .await
        .expect("reason box")
        .send_keys("the notebook kernel died")
        .await
        .expect("type");
    click(&b, "#end-button").await;
    b.wait_for(
        "return document.getElementById('status-badge').textContent === 'failed'",
        WAIT,
    )
    .await;
    b.wait_for(
        "return document.getElementById('status-reason').textContent.includes('the notebook kernel died')",
        WAIT,
    )
    .await;
    b.wait_for(
        "return document.getElementById('end-form').hidden && !document.getElementById('delete-button').disabled",
        WAIT,
    )
    .await;
    assert_eq!(
        b.eval("return window.__sameDocument || null").await,
        json!("yes"),
        "no reload"
    );
    let run = app.run(&id).await;
    assert_eq!(run["status"], "failed");
    b.screenshot("run-marked-ended").await;

    // Delete, with its confirmation, lands on the experiment; the run is gone.
    click(&b, "#delete-button").await;
    let deadline = Instant::now() + WAIT;
    while b.client.accept_alert().await.is_err() {
        assert!(Instant::now() < deadline, "no confirmation was asked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let experiment = run["experiment_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    b.wait_for(
        &format!("return location.pathname === '/experiments/{experiment}'"),
        WAIT,
    )
    .await;
    let gone = app
        .http
        .get(app.url(&format!("/api/v1/runs/{id}")))
        .send()
        .await
        .expect("get run");
    assert_eq!(gone.status().as_u16(), 404);
    b.close().await;
}

/// A click that is refused says why on the page: here the run's own client reported it
/// finished after the page rendered the form (the stream may not have hidden it yet), so the
/// mark is refused and the reason shows beside the button. Forced by sending the form's request
/// for a run that has just finished.
#[tokio::test]
async fn a_refused_mark_as_ended_shows_the_reason_beside_the_form() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "elsewhere", "name": "raced"}))
        .await;
    app.patch(&id, json!({"status": "running"})).await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for(
        "return document.getElementById('live-state').textContent === 'live'",
        WAIT,
    )
    .await;
    b.client
        .find(Locator::Id("end-reason"))
        .await
        .expect("reason box")
        .send_keys("gone")
        .await
        .expect("type");
    app.patch(&id, json!({"status": "finished"})).await;
    // The person had already pressed the button as the run finished: the form is submitted
    // even if the stream hid it meanwhile.
    b.eval("document.getElementById('end-form').requestSubmit(); return null")
        .await;
    let shown = b
        .wait_for(
            "return document.getElementById('end-error').textContent",
            WAIT,
        )
        .await;
    assert!(
        shown.as_str().unwrap_or_default().contains("already ended"),
        "{shown}"
    );
    assert_eq!(app.run(&id).await["status"], "finished", "nothing changed");
    b.close().await;
}
