//! A sweep its controller could not run is refused at admission, and one that cannot go on
//! ends instead of failing for ever:
//!
//! - every string the controller will use is checked when the sweep is submitted: a name too
//!   long for its trials' run names or with a control character, a NUL that YAML text can
//!   spell (`"\0"`, which the JSON edge check never sees) in the metric or a parameter value
//!   are a 422 naming the field, and nothing is stored;
//! - a controller whose step keeps failing (a spec this server cannot read; a NUL in the
//!   metric's name, stored before it was checked, which Postgres refuses in every read) tries
//!   again with growing waits and, after its tries, marks the sweep `failed` with the reason;
//!   reading, pausing and stopping such a sweep answer 2xx or 4xx, never 500.
//!
//! The waits are configured short; the tests count tries, never time.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use trainyard::app::Settings;
use trainyard::sweeps::Retry;

use crate::helpers::{assert_error, TestApp};
use crate::{on_both_backends, on_both_backends_with};

on_both_backends!(strings_the_controller_would_use_are_refused_at_admission_naming_the_field);
on_both_backends_with!(quick_retries;
    a_sweep_whose_spec_cannot_be_read_is_marked_failed_after_its_tries_and_still_answers,
    a_sweep_stored_with_a_nul_in_its_metric_fails_with_the_reason_and_never_answers_500,
);

/// Tries that give up after three failures in a row.
const TRIES: u32 = 3;

fn quick_retries(s: &mut Settings) {
    s.sweep_retry = Retry {
        first: Duration::from_millis(10),
        max: Duration::from_millis(40),
        attempts: TRIES,
    };
}

/// A YAML spec whose name, metric and parameter are given as YAML (quoted) scalars.
fn yaml_spec(name: &str, metric: &str, value: &str) -> String {
    format!(
        "name: {name}\nexperiment: sweeps\nbase: {{profile: tiny}}\n\
         metric: {{name: {metric}, goal: minimize}}\nmethod: random\nmax_trials: 2\n\
         parameters:\n  training.device: {{values: [{value}]}}\n"
    )
}

async fn strings_the_controller_would_use_are_refused_at_admission_naming_the_field(app: &TestApp) {
    let ok = yaml_spec("s", "loss", "cpu");
    let cases = [
        // 200 characters: a sweep name the library takes, too long for `<name>-<number>`.
        (yaml_spec(&"n".repeat(200), "loss", "cpu"), "name"),
        (yaml_spec("\"tab\\there\"", "loss", "cpu"), "name"),
        (yaml_spec("\"bell\\a\"", "loss", "cpu"), "name"),
        (yaml_spec("\"nul\\0name\"", "loss", "cpu"), "name"),
        (yaml_spec("s", "\"val\\0loss\"", "cpu"), "metric.name"),
        (yaml_spec("s", "\"val\\nloss\"", "cpu"), "metric.name"),
        (
            yaml_spec("s", "loss", "\"c\\0pu\""),
            "parameters.training.device.values[0]",
        ),
    ];
    for (text, field) in &cases {
        let response = app
            .post_json("/api/v1/sweeps", &json!({ "spec": text }))
            .await;
        let error = assert_error(
            response,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            Some(field),
        )
        .await;
        let message = error["message"].as_str().unwrap_or_default();
        assert!(!message.contains('\0'), "{message:?}");
    }
    // The same NUL in a JSON spec never gets past the edge.
    let mut as_json: Value = serde_yaml_ng::from_str(&ok).expect("spec");
    as_json["metric"]["name"] = json!("val\u{0}loss");
    let response = app
        .post_json("/api/v1/sweeps", &json!({ "spec": as_json }))
        .await;
    let error = assert_error(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unprocessable",
        None,
    )
    .await;
    assert!(
        error["field"]
            .as_str()
            .is_some_and(|f| f.ends_with("metric.name")),
        "{error}"
    );
    let list = app.get_json("/api/v1/sweeps").await;
    assert_eq!(
        list["sweeps"],
        json!([]),
        "nothing of a refused spec is stored"
    );
    assert_eq!(app.get_json("/api/v1/runs").await["runs"], json!([]));
}

/// Reads the sweep until `what` holds; every read must be a 200.
async fn wait_until(app: &TestApp, id: &str, what: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..600 {
        let sweep = app.get_json(&format!("/api/v1/sweeps/{id}")).await;
        if what(&sweep) {
            return sweep;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("sweep {id} did not get there");
}

/// Pause, resume and stop of a sweep that ended: conflicts naming its state, never a 500.
async fn controls_answer_without_a_server_error(app: &TestApp, id: &str) {
    for action in ["pause", "resume", "stop"] {
        let response = app
            .post_json(&format!("/api/v1/sweeps/{id}/{action}"), &json!({}))
            .await;
        assert_error(response, StatusCode::CONFLICT, "conflict", Some("state")).await;
    }
    let page = app.get(&format!("/sweeps/{id}")).await;
    assert_eq!(page.status(), StatusCode::OK, "the sweep's page");
    let list = app.get_json("/api/v1/sweeps").await;
    assert!(
        list["sweeps"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["id"] == id)),
        "{list}"
    );
}

async fn a_sweep_whose_spec_cannot_be_read_is_marked_failed_after_its_tries_and_still_answers(
    app: &TestApp,
) {
    // As a spec written by another version of the server might be: not one this one reads.
    let row = app
        .state
        .store
        .create_sweep("0", "unreadable", &json!({"name": "unreadable"}), None)
        .await
        .expect("sweep");
    let id = row.id;
    // Read while its controller fails: answered, shown without what only the spec says.
    app.state.sweeps.start(&app.state, &id);
    let sweep = app.get_json(&format!("/api/v1/sweeps/{id}")).await;
    assert_eq!(sweep["method"], "unknown", "{sweep}");
    let failed = wait_until(app, &id, |s| s["state"] != "running").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("failed {TRIES} times in a row")),
        "{message}"
    );
    assert!(message.contains("cannot read"), "{message}");
    assert!(failed["ended_at"].is_i64(), "{failed}");
    controls_answer_without_a_server_error(app, &id).await;
    // A broken sweep cannot be changed either, and says so.
    let change = app
        .patch_json(&format!("/api/v1/sweeps/{id}"), &json!({"parallel": 2}))
        .await;
    assert_eq!(change.status(), StatusCode::CONFLICT);
}

async fn a_sweep_stored_with_a_nul_in_its_metric_fails_with_the_reason_and_never_answers_500(
    app: &TestApp,
) {
    // Admitted by a server before the check: a spec that runs, but for its metric's name.
    let spec = json!({
        "name": "nul-metric", "base": {"profile": "tiny"},
        "metric": {"name": "val\u{0}loss", "goal": "minimize"}, "method": "random",
        "max_trials": 2, "parameters": {"training.learning_rate": {"values": [0.001]}}
    });
    let row = app
        .state
        .store
        .create_sweep("0", "nul-metric", &spec, None)
        .await
        .expect("a spec is stored as JSON text, its NUL escaped");
    let id = row.id;
    app.state.sweeps.start(&app.state, &id);
    let sweep = app.get_json(&format!("/api/v1/sweeps/{id}")).await;
    assert_eq!(sweep["name"], "nul-metric");
    // Paused before it fails, or already failed: either way an answer, not a 500.
    let paused = app
        .post_json(&format!("/api/v1/sweeps/{id}/pause"), &json!({}))
        .await;
    assert!(
        [StatusCode::OK, StatusCode::CONFLICT].contains(&paused.status()),
        "{}",
        paused.status()
    );
    let failed = wait_until(app, &id, |s| s["state"] == "failed").await;
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("failed {TRIES} times in a row")),
        "{message}"
    );
    assert!(message.contains("metric.name"), "{message}");
    assert!(!message.contains('\0'), "{message:?}");
    assert_eq!(failed["counts"]["total"], 0, "no trial was launched");
    controls_answer_without_a_server_error(app, &id).await;
}
