//! "Fine-tune from here": a person on a finished run's page picks a checkpoint, gets the launch
//! form with that checkpoint's training keys and no model to repeat, launches a LoRA run that
//! trains on the checkpoint's model, and a model key that differs from the checkpoint's is
//! refused at launch, at its line, with what was typed kept.

use fantoccini::Locator;
use serde_json::json;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);

/// Clicks `css`, finding it again if the page swapped it for a fresh copy meanwhile (the
/// checkpoints panel is re-rendered live).
async fn click(b: &Browser, css: &str) {
    let mut tries = 0;
    loop {
        let found = b.client.find(Locator::Css(css)).await;
        match found {
            Ok(el) => match el.click().await {
                Ok(()) => return,
                Err(e) if tries < 20 => {
                    let _ = e;
                }
                Err(e) => panic!("click {css}: {e}"),
            },
            Err(e) if tries < 20 => {
                let _ = e;
            }
            Err(e) => panic!("{css}: {e}"),
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn fine_tune_from_here_trains_lora_on_the_checkpoints_model_and_refuses_another_model() {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "base", "name": "pretrained"}))
        .await;
    let cache = tempfile::tempdir().expect("cache");
    crate::export::write_checkpoint(&app.data_dir.join("runs").join(&id), cache.path());
    app.patch(&id, json!({"status": "finished"})).await;

    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    click(&b, "#checkpoints tr[data-checkpoint] a.finetune-lora").await;
    let yaml = b
        .wait_for(
            "const t = document.getElementById('l-yaml'); return t && t.value",
            WAIT,
        )
        .await;
    let yaml = yaml.as_str().unwrap_or_default().to_string();
    assert!(
        yaml.contains("init_from:") && yaml.contains(&id) && yaml.contains("lora:"),
        "{yaml}"
    );
    assert!(
        !yaml.lines().any(|l| l.starts_with("model:")),
        "the model is not asked: {yaml}"
    );

    // A model key that differs from the checkpoint's is refused at its line, the form kept.
    let edited = format!("{yaml}\nmodel:\n  d_ff: 128\n");
    b.eval(&format!(
        "document.getElementById('l-yaml').value = {}; return null",
        serde_json::to_string(&edited).expect("json")
    ))
    .await;
    click(&b, "#launch-submit").await;
    let error = b
        .wait_for(
            "const e = document.getElementById('launch-error'); return e && e.textContent",
            WAIT,
        )
        .await;
    let error = error.as_str().unwrap_or_default();
    assert!(
        error.contains("model.d_ff") && error.contains("64"),
        "names the key and the checkpoint's value: {error}"
    );
    let marked = b
        .eval("const l = document.querySelector('[data-error-line]'); return l && l.textContent")
        .await;
    assert!(
        marked.as_str().unwrap_or_default().contains("d_ff: 128"),
        "marked at the d_ff line: {marked}"
    );
    let kept = b
        .eval("return document.getElementById('l-yaml').value")
        .await;
    assert_eq!(kept, json!(edited), "what was typed is kept");

    // Without it the fine-tune launches and trains on the checkpoint's model.
    b.eval(&format!(
        "document.getElementById('l-yaml').value = {}; return null",
        serde_json::to_string(&yaml).expect("json")
    ))
    .await;
    click(&b, "#launch-submit").await;
    let new_id = b
        .wait_for(
            &format!(
                "const m = /^\\/runs\\/([0-9a-f]{{32}})$/.exec(location.pathname); \
                 return m && m[1] !== '{id}' && m[1]"
            ),
            WAIT,
        )
        .await;
    let new_id = new_id.as_str().expect("new run id").to_string();
    let run = app.run(&new_id).await;
    assert_eq!(run["config"]["model"]["d_model"], 32, "{run}");
    assert_eq!(run["config"]["model"]["d_ff"], 64, "{run}");
    assert!(run["config"]["training"]["lora"].is_object(), "{run}");
    b.wait_for(
        "return ['finished', 'failed'].includes(document.getElementById('status-badge').textContent)",
        WAIT,
    )
    .await;
    let run = app.run(&new_id).await;
    assert_eq!(run["status"], "finished", "{run}");
    b.screenshot("finetune-launched").await;
    b.close().await;
}
