//! The runs table shows what a person changed: the params a sweep varies first, floats rounded
//! for reading (the full value in the cell's title), a table that fits its panel, and columns a
//! person chooses, kept per experiment.

use fantoccini::Locator;
use serde_json::json;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(15);

const HEADERS: &str =
    "return [...document.querySelectorAll('#runs-table thead th')].map(h => h.textContent.trim())";

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
async fn runs_table_puts_the_swept_param_first_rounds_it_and_keeps_chosen_columns_per_experiment() {
    let app = spawn_app().await;
    let model = json!({"d_ff": 256, "d_model": 64, "dropout": 0.0, "n_layers": 2});
    let mut ids = vec![];
    for (lr, batch) in [(0.0015482797056940566, 8), (0.003, 8), (0.0007, 16)] {
        ids.push(
            app.create_run(json!({"experiment": "lr-sweep", "name": format!("lr-{lr}"),
                "config": {"training": {"learning_rate": lr, "batch_size": batch, "seed": 1},
                           "model": model, "data": {"cache_dir": "/tmp/cache"}},
                "tags": {"trainyard.sweep": "0123456789abcdef0123456789abcdef", "goal": "a long tag value that wraps"}}))
                .await,
        );
    }
    let other = app
        .create_run(json!({"experiment": "other", "name": "alone", "config": {"model": model}}))
        .await;
    let experiment = app.run(&ids[0]).await["experiment_id"]
        .as_str()
        .expect("experiment id")
        .to_string();
    let other_experiment = app.run(&other).await["experiment_id"]
        .as_str()
        .expect("experiment id")
        .to_string();

    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/experiments/{experiment}")))
        .await
        .expect("goto");
    b.wait_for(
        "return document.querySelectorAll('#runs-table tbody tr').length === 3",
        WAIT,
    )
    .await;
    let headers = b.eval(HEADERS).await;
    // select, status, name, experiment, then the params.
    assert_eq!(headers[4], "training.learning_rate", "{headers}");
    let cell = b
        .eval(&format!(
            "const td = document.querySelector('tr[data-run-row=\"{}\"] td:nth-child(5)'); \
             return [td.textContent.trim(), td.title]",
            ids[0]
        ))
        .await;
    assert_eq!(cell, json!(["0.001548", "0.0015482797056940566"]));
    // The table fits its panel: Created is visible without scrolling sideways.
    let fits = b
        .eval(
            "const t = document.getElementById('runs-table'); const w = t.closest('.table-wrap'); \
             const created = [...t.querySelectorAll('thead th')].pop().getBoundingClientRect(); \
             const panel = w.getBoundingClientRect(); \
             return [t.scrollWidth <= w.clientWidth, created.right <= panel.right + 1]",
        )
        .await;
    assert_eq!(fits, json!([true, true]), "the table overflows its panel");
    b.screenshot("runs-table").await;

    // The person adds model.d_ff (the same in every run, so not shown by default).
    assert!(!b
        .eval(HEADERS)
        .await
        .as_array()
        .expect("headers")
        .contains(&json!("model.d_ff")));
    click(&b, "#col-chooser summary").await;
    click(&b, "#col-chooser input[value='params.model.d_ff']").await;
    click(&b, "#col-chooser-apply").await;
    let has_d_ff = "const h = [...document.querySelectorAll('#runs-table thead th')].map(h => h.textContent.trim()); \
                    return document.readyState === 'complete' && h.includes('model.d_ff') && h.includes('training.learning_rate')";
    b.wait_for(has_d_ff, WAIT).await;

    // Another experiment keeps its own (automatic) columns ...
    b.client
        .goto(&app.url(&format!("/experiments/{other_experiment}")))
        .await
        .expect("goto other");
    b.wait_for(
        "return document.querySelectorAll('#runs-table tbody tr').length === 1",
        WAIT,
    )
    .await;
    assert!(!b
        .eval(HEADERS)
        .await
        .as_array()
        .expect("headers")
        .contains(&json!("model.d_ff")));
    // ... and the first one opens with the chosen columns again.
    b.client
        .goto(&app.url(&format!("/experiments/{experiment}")))
        .await
        .expect("goto again");
    b.wait_for(has_d_ff, WAIT).await;
    b.close().await;
}
