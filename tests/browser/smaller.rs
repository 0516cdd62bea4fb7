//! Smaller things a person trips on: the "View run" link the MLflow client prints opens the
//! run, and the API link opens a page that reads as a reference rather than raw JSON.

use fantoccini::Locator;
use serde_json::json;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test]
async fn an_mlflow_view_run_link_opens_the_run_and_the_api_link_opens_a_reference_page() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "tracked", "name": "from-mlflow"}))
        .await;
    let experiment = app.run(&id).await["experiment_id"]
        .as_str()
        .expect("experiment id")
        .to_string();
    let b = browser().await;
    // What `mlflow` prints: "View run ... at: http://HOST/#/experiments/1/runs/ID".
    b.client
        .goto(&app.url(&format!("/#/experiments/{experiment}/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for(
        &format!(
            "return location.pathname === '/runs/{id}' && !!document.getElementById('run-name')"
        ),
        WAIT,
    )
    .await;

    // The API link in the header.
    b.client
        .find(Locator::Css("header nav a[href='/api-docs']"))
        .await
        .expect("API link")
        .click()
        .await
        .expect("click");
    b.wait_for("return !!document.getElementById('openapi-json')", WAIT)
        .await;
    let stop = b
        .eval(
            "const d = document.getElementById('post-api-v1-runs--id--stop'); \
             return d && d.querySelector('summary').textContent.replace(/\\s+/g, ' ').trim()",
        )
        .await;
    assert!(
        stop.as_str()
            .unwrap_or_default()
            .starts_with("POST /api/v1/runs/{id}/stop"),
        "{stop}"
    );
    b.screenshot("api-docs").await;
    b.close().await;
}
