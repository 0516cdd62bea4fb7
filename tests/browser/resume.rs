//! Stop, then resume from the run page: the checkpoints panel fills in live, a checkpoint
//! downloads, and Resume continues the same run on the same charts, without a reload.

use fantoccini::Locator;
use serde_json::json;
use std::time::Duration;

use crate::support::*;

const LONG: Duration = Duration::from_secs(300);
const WAIT_PANELS: Duration = Duration::from_secs(30);

fn badge_is(status: &str) -> String {
    format!(
        "const s = document.getElementById('status-badge'); \
         return (s.dataset.status || s.textContent.trim()) === '{status}'"
    )
}

#[tokio::test]
async fn a_stopped_run_is_resumed_from_its_page_and_its_charts_go_on_without_a_reload() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({
            "experiment": "resume", "name": "resumable", "launch": true, "profile": "tiny",
            "overrides": {
                "training.max_steps": 600, "training.save_steps": 0, "training.eval_steps": 0,
                "training.batch_size": 2, "training.seq_len": 16, "training.warmup_steps": 2,
                "training.device": "cpu", "training.threads": 1,
                "logging.flush_interval_ms": 100,
            },
        }))
        .await;
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    // A person waits until the loss is moving, then stops the run.
    b.wait_for(
        "const c = window.__trainyard && window.__trainyard.charts && window.__trainyard.charts['train/loss']; \
         return !!c && c.lastStep >= 10",
        LONG,
    )
    .await;
    b.eval("window.__sameDocument = 'yes'; return null").await;
    b.client
        .find(Locator::Id("stop-button"))
        .await
        .expect("stop")
        .click()
        .await
        .expect("click");
    b.wait_for(&badge_is("stopped"), LONG).await;
    // The stop wrote a checkpoint: the panel lists it and Resume becomes available, live.
    let step = b
        .wait_for(
            "const r = document.querySelector('#checkpoints-panel tr[data-checkpoint]'); \
             return r && Number(r.querySelector('td').textContent)",
            Duration::from_secs(60),
        )
        .await;
    let stopped_at = step.as_i64().expect("a step");
    b.wait_for(
        "return document.getElementById('resume-button').disabled === false",
        Duration::from_secs(30),
    )
    .await;
    b.eval("document.getElementById('checkpoints-panel').scrollIntoView({block: 'center'}); return null")
        .await;
    b.screenshot("checkpoints").await;
    b.eval("window.scrollTo(0, 0); return null").await;
    // Its Download link serves a tar archive of the checkpoint.
    let download = b
        .eval(
            "const a = document.querySelector('#checkpoints-panel a[download]'); \
             return fetch(a.href).then(r => r.ok && r.headers.get('content-type'))",
        )
        .await;
    assert_eq!(download, json!("application/x-tar"));
    b.client
        .find(Locator::Id("resume-button"))
        .await
        .expect("resume")
        .click()
        .await
        .expect("click");
    // The same page goes on live: the badge, the charts, the history.
    b.wait_for(&badge_is("finished"), LONG).await;
    b.wait_for(
        &format!(
            "const c = window.__trainyard.charts['train/loss']; return !!c && c.lastStep > {stopped_at}"
        ),
        LONG,
    )
    .await;
    assert_eq!(
        b.eval("return window.__sameDocument").await,
        json!("yes"),
        "the page was reloaded"
    );
    let run = app.run(&id).await;
    assert_eq!(run["status"], "finished", "{run}");
    assert_eq!(run["tags"]["trainyard.attempts"], "2", "{run}");
    // What the page says about the status follows it too.
    b.wait_for(
        "return document.getElementById('status-reason').textContent.startsWith('finished')",
        WAIT_PANELS,
    )
    .await;
    let history = b
        .eval("return document.getElementById('history').textContent")
        .await;
    assert!(
        history
            .as_str()
            .is_some_and(|h| h.contains("resumed from checkpoint")),
        "{history}"
    );
    b.screenshot("resumed").await;
    b.close().await;
}
