//! The run page's cards for the guides' training options in a real browser: per-layer norms and
//! the instability guard's events appear live, without a reload, on a page opened before the
//! run reported them.

use crate::support::*;
use serde_json::{json, Value};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test]
async fn per_layer_norms_and_a_rollback_appear_live_on_an_open_run_page() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "guide", "name": "guarded"}))
        .await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    b.wait_for(
        "return document.getElementById('live-state').textContent === 'live'",
        WAIT,
    )
    .await;
    let hidden = b
        .eval("return document.getElementById('guard-panel').hidden")
        .await;
    assert_eq!(hidden, json!(true), "no guard events yet");

    // The trainer's per-layer norms, every 5 steps.
    let mut norms = vec![];
    for step in (5..=30).step_by(5) {
        for layer in ["layer0", "layer1", "wte"] {
            norms.push(json!({"key": format!("grad_norm/{layer}"), "step": step, "value": 0.5}));
            norms.push(json!({"key": format!("param_norm/{layer}"), "step": step, "value": 12.0}));
        }
    }
    app.post_points(&id, Value::Array(norms)).await;
    b.wait_for(
        "const c = [...document.querySelectorAll('#charts .chart-card')].find((c) => \
         c.querySelector('.chart-title').textContent === 'Gradient norm by layer'); \
         return !!c && c.querySelector('.chart-box').dataset.keys === \
         'grad_norm/layer0,grad_norm/layer1,grad_norm/wte'",
        WAIT,
    )
    .await;
    b.wait_for(
        "return [...document.querySelectorAll('.chart-title')].some((t) => \
         t.textContent === 'Parameter norm by layer')",
        WAIT,
    )
    .await;

    // Two skipped updates, the second ending in a rollback to step 25.
    app.post_points(
        &id,
        json!([
            {"key": "guard/skipped_steps", "step": 31, "value": 1.0},
            {"key": "guard/skipped_steps", "step": 32, "value": 2.0},
            {"key": "guard/rollback_to", "step": 32, "value": 25.0},
            {"key": "guard/lr_scale", "step": 32, "value": 0.5},
        ]),
    )
    .await;
    let text = b
        .wait_for(
            "const p = document.getElementById('guard-panel'); \
             return !p.hidden && p.textContent.includes('rolled back to the checkpoint of step 25') \
             && p.textContent",
            WAIT,
        )
        .await;
    let text = text.as_str().unwrap_or_default().to_string();
    assert!(text.contains("learning rate now x0.5"), "{text}");
    assert!(text.contains("step 31"), "the first skip is listed: {text}");
}
