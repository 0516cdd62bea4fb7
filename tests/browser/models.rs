//! The model registry in the browser, in a person's order: on a finished run's page they
//! register a checkpoint under a new model name, land on the model's page, go to the Models
//! page and find it there, point the alias `champion` at the version, and launch a fine-tune
//! from `model:NAME@champion`, which trains on the checkpoint's model.

use fantoccini::Locator;
use serde_json::json;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);

/// Clicks `css`, finding it again if the page swapped it for a fresh copy meanwhile.
async fn click(b: &Browser, css: &str) {
    for tries in 0.. {
        let error = match b.client.find(Locator::Css(css)).await {
            Ok(el) => match el.click().await {
                Ok(()) => return,
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        assert!(tries < 20, "click {css}: {error}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Types `text` into the field `css`, finding it again if the page swapped it meanwhile.
async fn type_into(b: &Browser, css: &str, text: &str) {
    for tries in 0.. {
        let error = match b.client.find(Locator::Css(css)).await {
            Ok(field) => match field.clear().await {
                Ok(()) => match field.send_keys(text).await {
                    Ok(()) => return,
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        assert!(tries < 20, "type into {css}: {error}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_checkpoint_registered_from_its_run_is_aliased_on_the_models_page_and_fine_tuned_by_alias(
) {
    let app = spawn_app().await;
    let id = app
        .create_run(json!({"experiment": "registry", "name": "pretrained"}))
        .await;
    let cache = tempfile::tempdir().expect("cache");
    crate::export::write_checkpoint(&app.data_dir.join("runs").join(&id), cache.path());
    app.patch(&id, json!({"status": "finished"})).await;

    // The run page: register the checkpoint as the model `tiny-lm`.
    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    b.wait_for("return document.body.dataset.ready === 'true'", WAIT)
        .await;
    let row = "#checkpoints tr[data-checkpoint]";
    b.wait_for(
        &format!("return !!document.querySelector('{row} .register-form input[name=model]')"),
        WAIT,
    )
    .await;
    type_into(
        &b,
        &format!("{row} .register-form input[name=model]"),
        "tiny-lm",
    )
    .await;
    click(&b, &format!("{row} .register-form button[type=submit]")).await;
    b.wait_for("return location.pathname === '/models/tiny-lm'", WAIT)
        .await;
    let version = b
        .wait_for(
            "const r = document.querySelector('#versions tr[data-version=\"1\"]'); \
             return r && r.textContent",
            WAIT,
        )
        .await;
    let version = version.as_str().unwrap_or_default().to_string();
    assert!(
        version.contains(&id),
        "the version links its run: {version}"
    );
    assert!(version.contains("checkpoint:step-"), "{version}");
    b.screenshot("model-registered").await;

    // The Models page lists it; its name leads back to the model.
    click(&b, "a[href='/models']").await;
    b.wait_for("return location.pathname === '/models'", WAIT)
        .await;
    let listed = b
        .wait_for(
            "const r = document.querySelector('tr[data-model-row=\"tiny-lm\"]'); \
             return r && r.textContent",
            WAIT,
        )
        .await;
    assert!(
        listed.as_str().unwrap_or_default().contains("registry"),
        "the row names the experiment: {listed}"
    );
    b.screenshot("models-page").await;
    click(&b, "tr[data-model-row='tiny-lm'] a").await;
    b.wait_for("return location.pathname === '/models/tiny-lm'", WAIT)
        .await;

    // Point `champion` at version 1.
    b.wait_for("return !!document.getElementById('alias-form')", WAIT)
        .await;
    assert_eq!(
        b.eval("return !!document.getElementById('no-aliases')")
            .await,
        json!(true)
    );
    type_into(&b, "#alias-form input[name=alias]", "champion").await;
    click(&b, "#alias-form button[type=submit]").await;
    let alias = b
        .wait_for(
            "const r = document.querySelector('#aliases tr[data-alias=\"champion\"]'); \
             return r && r.textContent",
            WAIT,
        )
        .await;
    assert!(alias.as_str().unwrap_or_default().contains('1'), "{alias}");
    b.screenshot("model-aliased").await;

    // Launch from the alias: the form comes with the reference, and the run trains on the
    // checkpoint's model.
    click(&b, "#aliases tr[data-alias='champion'] a").await;
    let yaml = b
        .wait_for(
            "const t = document.getElementById('l-yaml'); return t && t.value",
            WAIT,
        )
        .await;
    let yaml = yaml.as_str().unwrap_or_default().to_string();
    assert!(
        yaml.contains("init_from: model:tiny-lm@champion") && yaml.contains("lora:"),
        "{yaml}"
    );
    assert!(
        !yaml.lines().any(|l| l.starts_with("model:")),
        "the model is the checkpoint's, not asked: {yaml}"
    );
    click(&b, "#launch-submit").await;
    let landed = b
        .wait_for(
            &format!(
                "const m = /^\\/runs\\/([0-9a-f]{{32}})$/.exec(location.pathname); \
                 if (m && m[1] !== '{id}') return {{run: m[1]}}; \
                 const e = document.getElementById('launch-error'); \
                 return e && e.textContent.trim() && {{error: e.textContent.trim()}}"
            ),
            WAIT,
        )
        .await;
    let new_id = landed["run"]
        .as_str()
        .unwrap_or_else(|| panic!("the launch was refused: {landed}"))
        .to_string();
    let run = app.run(&new_id).await;
    assert_eq!(run["config"]["model"]["d_model"], 32, "{run}");
    assert_eq!(
        run["tags"]["trainyard.init_model"]
            .as_str()
            .map(|t| t.starts_with("model:tiny-lm@champion")),
        Some(true),
        "{run}"
    );
    b.wait_for(
        "return ['finished', 'failed'].includes(document.getElementById('status-badge').textContent)",
        WAIT,
    )
    .await;
    let run = app.run(&new_id).await;
    assert_eq!(run["status"], "finished", "{run}");
    b.screenshot("model-fine-tuned").await;
    b.close().await;
}
