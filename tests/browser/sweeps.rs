//! Sweeps in the browser, in a person's order: the list, the new-sweep form, the sweep page
//! opened before its trials report anything, metric points arriving while it is open (table,
//! curves, parallel coordinates update without a reload), a sort by clicking a header, and the
//! Stop button; a refused spec shown at its parameter's line; "Sweep around this run".
//!
//! The trials are `sleep 60` shell commands: nothing reports but the test itself, so every value
//! the page shows is one the test posted.

use fantoccini::Locator;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

const LIVE_SPEC: &str = "\
name: live-sweep
experiment: sweeps-ui
# The parameters are appended as arguments, which `true` ignores.
base: {command: \"sleep 60; true\"}
metric: {name: loss, goal: minimize}
method: random
parameters:
  lr: {distribution: log_uniform, min: 1.0e-4, max: 1.0e-1}
  width: {values: [32, 64, 128]}
max_trials: 3
parallel: 3
seed: 3
";

pub(crate) async fn sweep(app: &TestApp, id: &str) -> Value {
    let res = app
        .http
        .get(app.url(&format!("/api/v1/sweeps/{id}")))
        .send()
        .await
        .expect("get sweep");
    assert_eq!(res.status().as_u16(), 200, "get sweep");
    res.json().await.expect("json")
}

/// The sweep once `done` says so, read from the API (the test's own view, not the page's).
pub(crate) async fn sweep_when(app: &TestApp, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = sweep(app, id).await;
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "sweep never got there: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn set_textarea(b: &Browser, id: &str, text: &str) {
    b.client
        .execute(
            "document.getElementById(arguments[0]).value = arguments[1]; return null",
            vec![json!(id), json!(text)],
        )
        .await
        .expect("set textarea");
}

pub(crate) async fn click(b: &Browser, css: &str) {
    b.client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("find {css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e}"));
}

#[tokio::test]
async fn a_sweep_from_the_form_fills_its_page_live_and_the_stop_button_ends_it() {
    // Three trials run at once: one CPU slot each.
    let (app, _store) = spawn_app_with(|s| s.launcher.cpu_slots = 3).await;
    let b = browser().await;
    b.client.goto(&app.url("/sweeps")).await.expect("goto");
    b.wait_for(
        "return !document.getElementById('sweeps-empty').hidden",
        WAIT,
    )
    .await;
    click(&b, "#new-sweep-link").await;
    b.wait_for("return !!document.getElementById('sweep-spec')", WAIT)
        .await;
    set_textarea(&b, "sweep-spec", LIVE_SPEC).await;
    click(&b, "#sweep-submit").await;

    // The form redirects to the sweep's page, which opens before any trial reported.
    let id = b
        .wait_for(
            "const m = document.querySelector('main[data-sweep-id]'); return document.body.dataset.ready === 'true' && m && m.dataset.sweepId",
            WAIT,
        )
        .await;
    let id = id.as_str().expect("sweep id").to_string();
    let url = b.client.current_url().await.expect("url");
    assert_eq!(url.path(), format!("/sweeps/{id}"));
    b.eval("window.__sameDocument = 'yes'; return null").await;
    b.wait_for(
        "const s = window.__trainyard.sweep; return s.lastEvent >= 1 && s.state === 'running'",
        WAIT,
    )
    .await;
    assert_eq!(
        b.eval("return document.getElementById('sweep-stop').hidden")
            .await,
        json!(false),
        "a running sweep offers Stop"
    );

    // Its three trials start (the page shows them as they do).
    let s = sweep_when(&app, &id, |s| {
        s["trials"].as_array().is_some_and(|t| {
            t.len() == 3
                && t.iter()
                    .all(|t| t["run_id"].is_string() && t["state"] == "running")
        })
    })
    .await;
    b.wait_for(
        "const rows = document.querySelectorAll('#sweep-trial-rows tr[data-run-id]'); \
         return window.__trainyard.sweep.rows === 3 && rows.length === 3 && \
           [...rows].every(r => r.querySelector('.badge').textContent === 'running')",
        WAIT,
    )
    .await;
    let params = b
        .eval("return [...document.querySelectorAll('#sweep-trials thead th[data-param]')].map(t => t.dataset.param)")
        .await;
    assert_eq!(params, json!(["lr", "width"]), "a column per parameter");

    // Each trial reports its loss: trial n ends at 1.5 + n / 4 at step 9 (all different).
    let mut last = Vec::new();
    for t in s["trials"].as_array().expect("trials") {
        let run_id = t["run_id"].as_str().expect("run id");
        let n = t["number"].as_i64().expect("number");
        let end = 1.5 + n as f64 / 4.0;
        let points: Vec<Value> = (0..10)
            .map(|step| json!({"key": "loss", "step": step, "value": end + f64::from(9 - step) * 0.1}))
            .collect();
        app.post_points(run_id, Value::Array(points)).await;
        last.push((n, end));
    }
    for (n, end) in &last {
        let row = format!("#sweep-trial-rows tr[data-trial='{n}']");
        b.wait_for(
            &format!(
                "const r = document.querySelector(\"{row}\"); \
                 return !!r && r.querySelector('[data-col=step]').textContent === '9' && \
                   Number(r.querySelector('[data-col=value]').textContent) === {end}"
            ),
            WAIT,
        )
        .await;
    }
    b.wait_for(
        "const s = window.__trainyard.sweep; return s.curves === 3 && s.lines === 3 && s.slices === 2",
        WAIT,
    )
    .await;
    assert_eq!(
        b.eval("return document.getElementById('sweep-curves').dataset.drawn")
            .await,
        json!("3")
    );
    assert_eq!(
        b.eval("return document.getElementById('sweep-parallel').dataset.drawn")
            .await,
        json!("3")
    );

    // Sorting by value puts the lowest loss first; a second click the highest.
    let first_value = "return Number(document.querySelector('#sweep-trial-rows tr [data-col=value]').textContent)";
    let lowest = last.iter().map(|(_, v)| *v).fold(f64::MAX, f64::min);
    let highest = last.iter().map(|(_, v)| *v).fold(f64::MIN, f64::max);
    click(&b, "#sweep-trials th[data-sort=value] button").await;
    assert_eq!(b.eval(first_value).await.as_f64(), Some(lowest));
    click(&b, "#sweep-trials th[data-sort=value] button").await;
    assert_eq!(b.eval(first_value).await.as_f64(), Some(highest));
    assert_eq!(
        b.eval("return document.querySelector('#sweep-trials th[data-sort=value]').getAttribute('aria-sort')")
            .await,
        json!("descending")
    );
    b.screenshot("sweep-live").await;
    b.eval("document.getElementById('sweep-curves').scrollIntoView(); return null")
        .await;
    b.screenshot("sweep-live-charts").await;

    // Pause and resume: the buttons follow the state the stream reports.
    click(&b, "#sweep-pause").await;
    b.wait_for(
        "return window.__trainyard.sweep.state === 'paused' && !document.getElementById('sweep-resume').hidden && document.getElementById('sweep-pause').hidden",
        WAIT,
    )
    .await;
    click(&b, "#sweep-resume").await;
    b.wait_for(
        "return window.__trainyard.sweep.state === 'running' && document.getElementById('sweep-resume').hidden",
        WAIT,
    )
    .await;

    // Fewer at once from now on: a new version of the spec, listed as a change.
    let parallel = b
        .client
        .find(Locator::Id("sweep-parallel-input"))
        .await
        .expect("parallel input");
    parallel.clear().await.expect("clear");
    parallel.send_keys("2").await.expect("type");
    click(&b, "#sweep-change-submit").await;
    b.wait_for(
        "return document.getElementById('sweep-version').textContent === '2' && \
           document.getElementById('sweep-parallel-now').textContent === '2' && \
           document.querySelector('#sweep-versions li[data-version=\"2\"]').textContent.includes('parallel')",
        WAIT,
    )
    .await;
    assert_eq!(sweep(&app, &id).await["parallel"], 2);

    // Stop, as a person does: the button, then the confirmation.
    click(&b, "#sweep-stop").await;
    let deadline = Instant::now() + WAIT;
    while b.client.accept_alert().await.is_err() {
        assert!(Instant::now() < deadline, "no confirmation was asked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.wait_for(
        "const s = document.getElementById('sweep-state'); \
         return s.textContent === 'stopped' && window.__trainyard.sweep.state === 'stopped'",
        WAIT,
    )
    .await;
    b.wait_for(
        "return [...document.querySelectorAll('#sweep-trial-rows .badge')].every(b => b.textContent === 'stopped')",
        WAIT,
    )
    .await;
    assert_eq!(
        b.eval("return ['sweep-pause', 'sweep-resume', 'sweep-stop', 'sweep-change'].map(id => document.getElementById(id).hidden)")
            .await,
        json!([true, true, true, true]),
        "an ended sweep offers no actions"
    );
    assert_eq!(
        b.eval("return window.__sameDocument").await,
        json!("yes"),
        "the page reloaded"
    );
    assert_eq!(sweep(&app, &id).await["state"], "stopped");
    b.screenshot("sweep-stopped").await;

    // The list shows it, linked, with its trials counted.
    b.client.goto(&app.url("/sweeps")).await.expect("goto");
    let row = b
        .eval(&format!(
            "const r = document.querySelector(\"tr[data-sweep-row='{id}']\"); return r && r.innerText"
        ))
        .await;
    let row = row.as_str().unwrap_or_default();
    assert!(
        row.contains("live-sweep") && row.contains("stopped"),
        "{row}"
    );
    // The count reads as a sentence, not `3 / 3 of 3`.
    assert_eq!(
        b.eval(&format!(
            "return document.querySelector(\"tr[data-sweep-row='{id}'] [data-col=trials]\").textContent.trim()"
        ))
        .await,
        json!("3 of 3 ended")
    );
    b.screenshot("sweeps").await;
    b.close().await;
}

#[tokio::test]
async fn a_refused_spec_is_shown_at_its_parameter_and_keeps_the_text() {
    let app = spawn_app().await;
    let b = browser().await;
    b.client.goto(&app.url("/sweeps/new")).await.expect("goto");
    let example = b
        .eval("return document.getElementById('sweep-spec').value")
        .await;
    let example = example.as_str().expect("spec").to_string();
    assert!(example.contains("profile: tiny"), "{example}");
    let good = "  training.learning_rate: {distribution: log_uniform, min: 3.0e-4, max: 1.0e-2}";
    let bad = "  training.learning_rate: {distribution: log_uniform, min: 0, max: 1}";
    assert!(example.contains(good), "{example}");
    let spec = example.replace(good, bad);
    let bad_line = spec.lines().position(|l| l == bad).expect("bad line") + 1;
    set_textarea(&b, "sweep-spec", &spec).await;
    click(&b, "#sweep-submit").await;
    b.wait_for("return !!document.getElementById('spec-error')", WAIT)
        .await;
    let error = b
        .eval("const e = document.getElementById('spec-error'); return [e.dataset.field, e.dataset.line, e.textContent]")
        .await;
    let field = error[0].as_str().unwrap_or_default();
    assert!(
        field.starts_with("parameters.training.learning_rate"),
        "{error}"
    );
    assert_eq!(error[1], json!(bad_line.to_string()), "{error}");
    assert!(
        error[2]
            .as_str()
            .is_some_and(|m| m.contains("training.learning_rate")),
        "the message names the parameter: {error}"
    );
    let marked = b
        .eval("const d = document.querySelectorAll('[data-error-line]'); return [d.length, d[0].dataset.errorLine, d[0].textContent]")
        .await;
    assert_eq!(marked[0], json!(1), "{marked}");
    assert_eq!(marked[1], json!(bad_line.to_string()), "{marked}");
    assert!(
        marked[2]
            .as_str()
            .is_some_and(|t| t.contains(bad.trim()) && t.contains("⟵")),
        "{marked}"
    );
    let kept = b
        .eval("return document.getElementById('sweep-spec').value")
        .await;
    assert_eq!(
        kept.as_str().map(|k| k.replace("\r\n", "\n")),
        Some(spec.clone()),
        "the text is kept"
    );
    b.screenshot("sweep-form-error").await;
    b.close().await;
}

#[tokio::test]
async fn sweep_around_this_run_prefills_its_config_and_ranges() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "around", "name": "base-run",
            "config": {"training": {"learning_rate": 0.003, "batch_size": 8}, "model": {"d_model": 64, "dropout": 0.1}}}))
        .await;
    app.post_points(&id, loss_points("val/loss", 0..5)).await;
    let bare = app
        .create_run(json!({"experiment": "around", "name": "no-config"}))
        .await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{bare}")))
        .await
        .expect("goto");
    assert_eq!(
        b.eval("return document.getElementById('sweep-around-link') === null")
            .await,
        json!(true),
        "a run without a config has nothing to sweep around"
    );
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    click(&b, "#sweep-around-link").await;
    let spec = b
        .wait_for(
            "const t = document.getElementById('sweep-spec'); return t && t.value",
            WAIT,
        )
        .await;
    let spec = spec.as_str().expect("spec");
    for want in [
        "experiment: \"around\"",
        "name: \"base-run-sweep\"",
        "metric: {name: \"val/loss\", goal: minimize}",
        "  training.learning_rate: {distribution: log_uniform, min: 0.001, max: 0.009}",
        "  model.dropout: {distribution: uniform, min: 0.0, max: 0.2}",
        "    training:",
        "      batch_size: 8",
    ] {
        assert!(spec.contains(want), "`{want}` missing from:\n{spec}");
    }
    b.screenshot("sweep-around").await;
    b.close().await;
}

/// Trials that wait for the test: each runs until the test writes `release` into its run
/// directory, so the test reports a trial's metric while it runs and then lets it finish.
const FINISHING_SPEC: &str = "\
name: finishing-sweep
experiment: sweeps-ui
base: {command: \"until [ -f \\\"$TRAINYARD_RUN_DIR/release\\\" ]; do sleep 0.1; done; true\"}
metric: {name: loss, goal: minimize}
method: random
parameters:
  lr: {distribution: log_uniform, min: 1.0e-4, max: 1.0e-1}
  dropout: {distribution: uniform, min: 0.0, max: 0.5}
max_trials: 4
parallel: 2
seed: 11
";

#[tokio::test]
async fn a_finished_sweep_charts_the_best_so_far_and_the_parameter_importance() {
    let app = spawn_app().await;
    let res = app
        .http
        .post(app.url("/api/v1/sweeps"))
        .json(&json!({ "spec": FINISHING_SPEC }))
        .send()
        .await
        .expect("submit");
    assert_eq!(res.status().as_u16(), 201, "{:?}", res.text().await);
    let id = res.json::<Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    // Each trial reports a loss curve that ends lower the lower its dropout, then finishes.
    let mut released = std::collections::BTreeSet::new();
    let mut ends = std::collections::BTreeMap::new();
    let deadline = Instant::now() + WAIT * 4;
    let done = loop {
        let s = sweep(&app, &id).await;
        if s["state"] == "finished" {
            break s;
        }
        assert!(Instant::now() < deadline, "the sweep never finished: {s}");
        for t in s["trials"].as_array().expect("trials") {
            let (Some(run_id), true) = (t["run_id"].as_str(), t["state"] == "running") else {
                continue;
            };
            if !released.insert(run_id.to_string()) {
                continue;
            }
            let dropout = t["params"]["dropout"].as_f64().expect("dropout");
            let end = 1.0 + dropout;
            let points: Vec<Value> = (0..20)
                .map(|step| json!({"key": "loss", "step": step, "value": end + f64::from(19 - step) * 0.05}))
                .collect();
            app.post_points(run_id, Value::Array(points)).await;
            ends.insert(t["number"].as_i64().expect("number"), end);
            std::fs::write(app.data_dir.join("runs").join(run_id).join("release"), "")
                .expect("release the trial");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let complete = done["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .filter(|t| t["state"] == "complete")
        .count();
    assert_eq!(complete, 4, "{done}");
    let (best_number, _) = ends
        .iter()
        .min_by(|a, b| a.1.total_cmp(b.1))
        .expect("a best trial");
    assert_eq!(done["best"]["number"], json!(best_number), "{done}");

    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/sweeps/{id}")))
        .await
        .expect("goto");
    b.wait_for(
        "const s = window.__trainyard && window.__trainyard.sweep; \
         return !!s && s.lastEvent >= 1 && s.state === 'finished'",
        WAIT,
    )
    .await;
    let hook = b.eval("return window.__trainyard.sweep").await;
    assert_eq!(hook["rows"], 4, "{hook}");
    assert_eq!(hook["best"], 4, "a dot per complete trial: {hook}");
    assert_eq!(hook["curves"], 4, "{hook}");
    assert_eq!(hook["lines"], 4, "{hook}");
    assert_eq!(hook["importance"], 2, "a bar per parameter: {hook}");
    let best_run = done["best"]["run_id"].as_str().expect("best run");
    let link = b
        .eval("const a = document.querySelector('#sweep-best-trial a'); return a && a.getAttribute('href')")
        .await;
    assert_eq!(link, json!(format!("/runs/{best_run}")));
    assert_eq!(
        b.eval("return document.querySelector('#sweep-trial-rows tr.best').dataset.trial")
            .await,
        json!(best_number.to_string()),
        "the best trial's row is marked"
    );
    // A bar per parameter, the larger share first.
    let bars = b
        .eval("return [...document.querySelectorAll('#sweep-importance .imp-row')].map(r => [r.dataset.param, parseFloat(r.querySelector('.imp-bar').style.width)])")
        .await;
    let bars = bars.as_array().expect("bars");
    let mut names: Vec<&str> = bars.iter().filter_map(|b| b[0].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["dropout", "lr"], "{bars:?}");
    assert!(
        bars[0][1].as_f64() >= bars[1][1].as_f64(),
        "sorted by share: {bars:?}"
    );
    b.eval("document.getElementById('sweep-best').scrollIntoView(); return null")
        .await;
    b.screenshot("sweep-finished").await;
    b.close().await;
}
