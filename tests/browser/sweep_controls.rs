//! The sweep page in a person's order, beyond the live page of `sweeps.rs`: its Pause, Resume,
//! Change and Stop with JavaScript turned off (plain forms, a refusal shown in place), and a
//! pruned trial read the same way everywhere on the page (the step it reached, its value then,
//! the curves' legend) with parallel-coordinates names that fit.

use fantoccini::Locator;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

use crate::support::*;
use crate::sweeps::{click, sweep, sweep_when};

const WAIT: Duration = Duration::from_secs(30);

async fn submit(app: &TestApp, spec: &str) -> String {
    let res = app
        .http
        .post(app.url("/api/v1/sweeps"))
        .json(&json!({ "spec": spec }))
        .send()
        .await
        .expect("submit");
    assert_eq!(res.status().as_u16(), 201, "{:?}", res.text().await);
    res.json::<Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string()
}

/// The text of element `id`, read through WebDriver (no page script needed).
async fn text_of(b: &Browser, id: &str) -> String {
    match b.client.find(Locator::Id(id)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Waits until element `id` reads `want` (the page after a form's redirect).
async fn wait_text(b: &Browser, id: &str, want: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = text_of(b, id).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "#{id} reads `{got}`, not `{want}`"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn displayed(b: &Browser, id: &str) -> bool {
    let e = b.client.find(Locator::Id(id)).await.expect(id);
    e.is_displayed().await.expect("displayed")
}

/// Which of Pause, Resume, Stop and the change form the page shows.
async fn controls(b: &Browser) -> Vec<bool> {
    let mut shown = Vec::new();
    for id in ["sweep-pause", "sweep-resume", "sweep-stop", "sweep-change"] {
        shown.push(displayed(b, id).await);
    }
    shown
}

const SLEEPING_SPEC: &str = "\
name: no-script-sweep
experiment: sweeps-ui
base: {command: \"sleep 60; true\"}
metric: {name: loss, goal: minimize}
method: random
parameters:
  lr: {distribution: log_uniform, min: 1.0e-4, max: 1.0e-1}
max_trials: 4
parallel: 2
seed: 2
";

#[tokio::test]
async fn without_javascript_the_sweep_page_pauses_resumes_changes_and_stops_it() {
    let (app, _store) = spawn_app_with(|s| s.launcher.cpu_slots = 2).await;
    let id = submit(&app, SLEEPING_SPEC).await;
    let b = browser_without_javascript().await;
    b.client
        .goto(&app.url(&format!("/sweeps/{id}")))
        .await
        .expect("goto");
    let body = b.client.find(Locator::Css("body")).await.expect("body");
    assert_eq!(
        body.attr("data-ready").await.expect("attr"),
        None,
        "the page's script ran: JavaScript is on"
    );
    assert_eq!(text_of(&b, "sweep-state").await, "running");
    assert_eq!(controls(&b).await, [true, false, true, true]);

    // Paused behind the page's back (the API, another tab): Pause on this page is refused,
    // and the answer says why, in place, with what the sweep offers now.
    let res = app
        .http
        .post(app.url(&format!("/api/v1/sweeps/{id}/pause")))
        .send()
        .await
        .expect("pause");
    assert_eq!(res.status().as_u16(), 200);
    click(&b, "#sweep-pause").await;
    wait_text(&b, "sweep-state", "paused").await;
    let said = text_of(&b, "sweep-action-status").await;
    assert!(
        said.contains("paused") && said.contains("cannot be paused"),
        "the refusal says why: `{said}`"
    );
    assert_eq!(controls(&b).await, [false, true, true, true]);

    // Resume, then Pause, each a plain form that comes back to the sweep's page.
    click(&b, "#sweep-resume").await;
    wait_text(&b, "sweep-state", "running").await;
    let url = b.client.current_url().await.expect("url");
    assert_eq!(url.path(), format!("/sweeps/{id}"));
    assert_eq!(text_of(&b, "sweep-action-status").await, "");
    assert_eq!(sweep(&app, &id).await["state"], "running");
    click(&b, "#sweep-pause").await;
    wait_text(&b, "sweep-state", "paused").await;
    assert_eq!(sweep(&app, &id).await["state"], "paused");
    click(&b, "#sweep-resume").await;
    wait_text(&b, "sweep-state", "running").await;

    // A change: one at a time from now on.
    let parallel = b
        .client
        .find(Locator::Id("sweep-parallel-input"))
        .await
        .expect("parallel input");
    parallel.clear().await.expect("clear");
    parallel.send_keys("1").await.expect("type");
    click(&b, "#sweep-change-submit").await;
    wait_text(&b, "sweep-version", "2").await;
    assert_eq!(text_of(&b, "sweep-parallel-now").await, "1");
    let v2 = b
        .client
        .find(Locator::Css("#sweep-versions li[data-version='2']"))
        .await
        .expect("version 2 listed")
        .text()
        .await
        .expect("text");
    assert!(v2.contains("parallel: 2 → 1"), "{v2}");
    let s = sweep(&app, &id).await;
    assert_eq!(
        (s["parallel"].clone(), s["max_trials"].clone()),
        (json!(1), json!(4))
    );

    // A budget below the trials already made is refused at its field, keeping what was typed.
    let made = sweep_when(&app, &id, |s| {
        s["trials"].as_array().is_some_and(|t| t.len() >= 2)
    })
    .await["trials"]
        .as_array()
        .map_or(0, Vec::len);
    let max = b
        .client
        .find(Locator::Id("sweep-max-input"))
        .await
        .expect("max input");
    max.clear().await.expect("clear");
    max.send_keys("1").await.expect("type");
    click(&b, "#sweep-change-submit").await;
    let deadline = Instant::now() + WAIT;
    let status = loop {
        let e = b.client.find(Locator::Id("sweep-change-status")).await;
        if let Ok(e) = e {
            if e.attr("data-field").await.ok().flatten().is_some() {
                break e;
            }
        }
        assert!(Instant::now() < deadline, "no refusal shown at the form");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        status.attr("data-field").await.expect("attr").as_deref(),
        Some("max_trials")
    );
    let message = status.text().await.expect("text");
    assert!(
        message.contains("max_trials") && message.contains(&format!("{made} trials")),
        "{message}"
    );
    let max = b
        .client
        .find(Locator::Id("sweep-max-input"))
        .await
        .expect("max input");
    assert_eq!(
        max.prop("value").await.expect("value").as_deref(),
        Some("1")
    );
    assert_eq!(
        max.attr("aria-invalid").await.expect("attr").as_deref(),
        Some("true")
    );
    assert_eq!(sweep(&app, &id).await["max_trials"], 4, "nothing changed");
    b.screenshot("sweep-no-script-refusal").await;

    // Stop: the sweep and its trials end; an ended sweep offers nothing.
    click(&b, "#sweep-stop").await;
    wait_text(&b, "sweep-state", "stopped").await;
    assert_eq!(controls(&b).await, [false, false, false, false]);
    let s = sweep(&app, &id).await;
    assert_eq!(s["state"], "stopped");
    b.close().await;
}

/// Two trials that wait for the test (`release` in their run directory), judged by ASHA from
/// step 5 on.
const PRUNING_SPEC: &str = "\
name: pruning-sweep
experiment: sweeps-ui
base: {command: \"until [ -f \\\"$TRAINYARD_RUN_DIR/release\\\" ]; do sleep 0.1; done; true\"}
metric: {name: loss, goal: minimize}
method: random
parameters:
  training.learning_rate: {distribution: log_uniform, min: 1.0e-4, max: 1.0e-1}
  model.dropout: {distribution: uniform, min: 0.0, max: 0.5}
early_terminate: {type: asha, min_steps: 5, reduction_factor: 2}
max_trials: 2
parallel: 2
seed: 5
";

fn flat(steps: std::ops::RangeInclusive<i64>, value: f64) -> Value {
    Value::Array(
        steps
            .map(|step| json!({"key": "loss", "step": step, "value": value}))
            .collect(),
    )
}

#[tokio::test]
async fn a_pruned_trial_reads_the_same_step_and_value_everywhere_and_the_charts_label_it() {
    let (app, _store) = spawn_app_with(|s| s.launcher.cpu_slots = 2).await;
    let id = submit(&app, PRUNING_SPEC).await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/sweeps/{id}")))
        .await
        .expect("goto");
    b.wait_for(
        "const s = window.__trainyard && window.__trainyard.sweep; return !!s && s.lastEvent >= 1",
        WAIT,
    )
    .await;
    let s = sweep_when(&app, &id, |s| {
        s["trials"].as_array().is_some_and(|t| {
            t.len() == 2
                && t.iter()
                    .all(|t| t["run_id"].is_string() && t["state"] == "running")
        })
    })
    .await;
    let trials = s["trials"].as_array().expect("trials");
    let run = |i: usize| trials[i]["run_id"].as_str().expect("run").to_string();
    let (good, bad) = (run(0), run(1));
    assert_eq!(trials[0]["number"], 0, "trials are listed by number");
    let bad_number = trials[1]["number"].as_i64().expect("number");

    // The first trial reports a low loss up to step 30 and passes its rungs (5, 10, 20).
    app.post_points(&good, flat(0..=30, 1.0)).await;
    sweep_when(&app, &id, |s| {
        s["trials"][0]["rungs"]
            .as_object()
            .is_some_and(|r| r.len() == 3)
    })
    .await;
    // The second reports a high one up to step 30 at once: judged at its first rung (step 5),
    // pruned having reached step 30.
    app.post_points(&bad, flat(0..=30, 3.0)).await;
    let row = format!("#sweep-trial-rows tr[data-trial='{bad_number}']");
    let cells = b
        .wait_for(
            &format!(
                "const r = document.querySelector(\"{row}\"); \
                 return r && r.querySelector('.badge').textContent === 'pruned' && \
                   [r.querySelector('[data-col=step]').textContent, r.querySelector('[data-col=value]').textContent, r.lastElementChild.textContent]"
            ),
            WAIT,
        )
        .await;
    assert_eq!(cells[0], json!("30"), "{cells}");
    assert_eq!(
        cells[1].as_str().and_then(|v| v.parse::<f64>().ok()),
        Some(3.0),
        "{cells}"
    );
    let reason = cells[2].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("pruned at step 30:") && reason.contains("at step 5 (rung 0)"),
        "the reason names the step the table shows: {reason}"
    );

    // Its run logs a few more points while it stops (and the other trial goes on, which the
    // page hears of): the trial's end stays what it was.
    app.post_points(&bad, flat(31..=40, 2.0)).await;
    app.post_points(&good, flat(31..=35, 0.9)).await;
    b.wait_for(
        "return window.__trainyard.sweep.rows === 2 && \
           document.querySelector(\"#sweep-trial-rows tr[data-trial='0'] [data-col=step]\").textContent === '35'",
        WAIT,
    )
    .await;
    let after = b
        .eval(&format!(
            "const r = document.querySelector(\"{row}\"); \
             return [r.querySelector('[data-col=step]').textContent, r.querySelector('[data-col=value]').textContent]"
        ))
        .await;
    assert_eq!(after[0], json!("30"), "{after}");
    assert_eq!(
        after[1].as_str().and_then(|v| v.parse::<f64>().ok()),
        Some(3.0),
        "{after}"
    );
    let api = sweep(&app, &id).await;
    let t = &api["trials"][1];
    assert_eq!(
        (t["step"].clone(), t["value"].clone()),
        (json!(30), json!(3.0))
    );

    // The trial curves have a legend: a trial per entry, the pruned one marked.
    let legend = b
        .wait_for(
            "const l = document.querySelectorAll('#sweep-curves-legend [data-trial]'); \
             return l.length === 2 && [...l].map(i => [i.dataset.trial, i.dataset.state, i.textContent])",
            WAIT,
        )
        .await;
    let legend = legend.as_array().expect("legend");
    let pruned: Vec<&Value> = legend
        .iter()
        .filter(|i| i[0] == json!(bad_number.to_string()))
        .collect();
    assert_eq!(pruned.len(), 1, "{legend:?}");
    assert_eq!(pruned[0][1], "pruned");
    assert_eq!(
        pruned[0][2],
        json!(format!("trial {bad_number} (pruned)")),
        "{legend:?}"
    );

    // Parallel coordinates: each axis named in full, on the page, nothing cut off.
    let labels = b
        .wait_for(
            "const box = document.getElementById('sweep-parallel').getBoundingClientRect(); \
             const l = [...document.querySelectorAll('#sweep-parallel .pc-label')]; \
             return l.length === 3 && l.map(e => { const r = e.getBoundingClientRect(); \
               return [e.title, e.textContent, e.scrollWidth <= e.clientWidth + 1 && e.scrollHeight <= e.clientHeight + 1, \
                 r.left >= box.left - 1 && r.right <= box.right + 1]; })",
            WAIT,
        )
        .await;
    let names: Vec<&str> = labels
        .as_array()
        .expect("labels")
        .iter()
        .map(|l| l[0].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        ["model.dropout", "training.learning_rate", "loss (minimize)"],
        "{labels}"
    );
    for l in labels.as_array().expect("labels") {
        assert_eq!(l[0], l[1], "the full name is shown and on hover: {l}");
        assert_eq!(l[2], json!(true), "the name fits its box: {l}");
        assert_eq!(l[3], json!(true), "the name lies within the chart: {l}");
    }
    b.eval("document.getElementById('sweep-curves').scrollIntoView(); return null")
        .await;
    b.screenshot("sweep-pruned").await;
    for r in [&good, &bad] {
        std::fs::write(app.data_dir.join("runs").join(r).join("release"), "")
            .expect("release the trial");
    }
    b.close().await;
}
