//! Forms answer their mistakes in place, at the field, keeping what was typed: sharing with
//! `vision` instead of `team:vision`, adding an unknown user to a team, a refused override.

use fantoccini::Locator;
use serde_json::json;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);
const ADMIN_TOKEN: &str = "browser-admin-token";
const PASSWORD: &str = "correct horse battery";

async fn type_into(b: &Browser, css: &str, text: &str) {
    let field = b.client.find(Locator::Css(css)).await.expect(css);
    field.clear().await.expect("clear");
    field.send_keys(text).await.expect("type");
}

async fn click(b: &Browser, css: &str) {
    b.client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e}"));
}

async fn admin_post(app: &TestApp, path: &str, body: serde_json::Value) -> serde_json::Value {
    let r = app
        .http
        .post(app.url(path))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .expect(path);
    assert!(r.status().is_success(), "{path}: {}", r.status());
    r.json().await.unwrap_or(serde_json::Value::Null)
}

#[tokio::test]
async fn the_sharing_and_team_forms_answer_a_mistake_at_the_field_keeping_what_was_typed() {
    let (app, _store) = spawn_app_with(|s| {
        s.auth = true;
        s.admin_token = Some(ADMIN_TOKEN.into());
    })
    .await;
    admin_post(
        &app,
        "/api/v1/users",
        json!({"name": "root", "password": PASSWORD, "admin": true}),
    )
    .await;
    admin_post(&app, "/api/v1/teams", json!({"name": "vision"})).await;
    let experiment = admin_post(&app, "/api/v1/experiments", json!({"name": "lab"})).await;
    let experiment = experiment["id"]
        .as_str()
        .expect("experiment id")
        .to_string();

    let b = browser().await;
    b.client
        .goto(&app.url(&format!("/experiments/{experiment}/sharing")))
        .await
        .expect("goto");
    b.wait_for("return !!document.getElementById('sign-in-form')", WAIT)
        .await;
    type_into(&b, "#s-name", "root").await;
    type_into(&b, "#s-password", PASSWORD).await;
    click(&b, "#sign-in-submit").await;
    b.wait_for("return !!document.getElementById('grant-form')", WAIT)
        .await;

    // `vision` instead of `team:vision`: the form stays, says how at the field, keeps the text.
    type_into(&b, "#g-subject", "vision").await;
    click(&b, "#g-level option[value=edit]").await;
    click(&b, "#grant-form button[type=submit]").await;
    let error = b
        .wait_for(
            "const e = document.getElementById('g-subject-error'); return e && e.textContent",
            WAIT,
        )
        .await;
    assert!(
        error.as_str().unwrap_or_default().contains("team:vision"),
        "{error}"
    );
    let kept = b
        .eval("return [document.getElementById('g-subject').value, document.getElementById('g-level').value]")
        .await;
    assert_eq!(kept, json!(["vision", "edit"]));
    b.screenshot("sharing-error").await;
    // Corrected, it is granted.
    type_into(&b, "#g-subject", "team:vision").await;
    click(&b, "#grant-form button[type=submit]").await;
    let granted = b
        .wait_for(
            "const e = document.getElementById('g-subject-error'); \
             const t = document.getElementById('grants-table'); \
             return (t && t.textContent.includes('team vision') && !e) || (e && e.textContent !== 'write user:NAME or team:NAME (for example team:vision or user:vision)' && e.textContent)",
            WAIT,
        )
        .await;
    assert_eq!(granted, json!(true), "the corrected grant is refused");

    // An unknown user for a team: the error is in the team's row, with the typed name.
    b.client
        .goto(&app.url("/admin/users"))
        .await
        .expect("goto users");
    type_into(&b, "form[data-team=vision] input[name=user]", "nobody").await;
    click(&b, "form[data-team=vision] button[type=submit]").await;
    let row = b
        .wait_for(
            "const f = document.querySelector('form[data-team=vision]'); const e = f && f.querySelector('.field-error'); \
             return e && [e.textContent, f.querySelector('input[name=user]').value]",
            WAIT,
        )
        .await;
    assert!(
        row[0].as_str().unwrap_or_default().contains("nobody"),
        "{row}"
    );
    assert_eq!(row[1], "nobody");
    b.close().await;
}

#[tokio::test]
async fn the_launch_form_marks_a_refused_override_on_the_overrides_line() {
    let app = spawn_app().await;
    let b = browser().await;
    b.client
        .goto(&app.url("/launch?profile=tiny"))
        .await
        .expect("goto");
    b.wait_for("return !!document.getElementById('l-overrides')", WAIT)
        .await;
    let overrides = "training.max_steps=5\ntraining.learning_rate=-1";
    b.client
        .find(Locator::Id("l-overrides"))
        .await
        .expect("overrides")
        .send_keys(overrides)
        .await
        .expect("type");
    click(&b, "#launch-submit").await;
    let marked = b
        .wait_for(
            "const d = document.querySelector('[data-override-error-line]'); return d && d.textContent",
            WAIT,
        )
        .await;
    let marked = marked.as_str().unwrap_or_default();
    assert!(
        marked.contains("training.learning_rate=-1") && marked.contains("learning_rate"),
        "{marked}"
    );
    assert_eq!(
        b.eval("return document.querySelector('[data-error-line]') === null")
            .await,
        json!(true),
        "no YAML line is blamed"
    );
    assert_eq!(
        b.eval("return document.getElementById('l-overrides').value")
            .await,
        json!(overrides)
    );
    b.close().await;
}
