//! A lab's server with accounts, in a browser: sign in, launch a run and watch it live; a
//! forged stop is refused; share the experiment with a reader, who sees the run live but no
//! Stop button; after signing out the page is gone.

use fantoccini::Locator;
use serde_json::{json, Value};
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);
const ADMIN_TOKEN: &str = "browser-admin-token";
const PASSWORD: &str = "correct horse battery";

async fn add_user(app: &TestApp, name: &str) {
    let r = app
        .http
        .post(app.url("/api/v1/users"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": name, "password": PASSWORD}))
        .send()
        .await
        .expect("add user");
    assert_eq!(r.status().as_u16(), 201);
}

async fn type_into(b: &Browser, id: &str, text: &str) {
    let field = b.client.find(Locator::Id(id)).await.expect(id);
    field.clear().await.expect("clear");
    field.send_keys(text).await.expect("type");
}

async fn click(b: &Browser, css: &str) {
    b.client
        .find(Locator::Css(css))
        .await
        .expect(css)
        .click()
        .await
        .expect("click");
}

/// Signs in on the page the browser was sent to, as a person would.
async fn sign_in_here(b: &Browser, name: &str) {
    b.wait_for("return !!document.getElementById('sign-in-form')", WAIT)
        .await;
    type_into(b, "s-name", name).await;
    type_into(b, "s-password", PASSWORD).await;
    click(b, "#sign-in-submit").await;
}

async fn path(b: &Browser) -> String {
    b.client.current_url().await.expect("url").path().to_owned()
}

#[tokio::test]
async fn a_signed_in_user_launches_and_watches_a_run_and_a_reader_sees_it_without_stop() {
    let (app, _store) = spawn_app_with(|s| {
        s.auth = true;
        s.admin_token = Some(ADMIN_TOKEN.into());
    })
    .await;
    add_user(&app, "alice").await;
    add_user(&app, "rita").await;
    let b = browser().await;

    // Alice opens the launch form; the server asks her to sign in first, then brings her back.
    b.client
        .goto(&app.url("/launch?profile=tiny"))
        .await
        .expect("goto");
    assert_eq!(path(&b).await, "/sign-in");
    b.screenshot("sign-in").await;
    sign_in_here(&b, "alice").await;
    b.wait_for("return location.pathname === '/launch'", WAIT)
        .await;
    type_into(&b, "l-experiment", "lab").await;
    type_into(&b, "l-name", "shared-run").await;
    type_into(&b, "l-overrides", "training.max_steps=3000").await;
    click(&b, "#launch-submit").await;
    let id = b
        .wait_for(
            "const m = document.querySelector('main[data-run-id]'); return m && m.dataset.runId",
            WAIT,
        )
        .await;
    let id = id.as_str().expect("run id").to_owned();
    // Its charts appear live as the trainer reports (with its own run token).
    b.wait_for(
        "const c = window.__trainyard && window.__trainyard.charts['train/loss']; return !!c && c.points > 0",
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(
        b.eval("return document.getElementById('account-link').textContent")
            .await,
        "alice"
    );

    // A stop forged with alice's cookie: without the CSRF token, and from another site.
    let forged = b
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch('/api/v1/runs/' + arguments[0] + '/stop', {method: 'POST'}).then(r => done(r.status));",
            vec![json!(id)],
        )
        .await
        .expect("fetch");
    assert_eq!(forged, json!(403));
    let cookie = b
        .client
        .get_named_cookie("trainyard_session")
        .await
        .expect("session cookie");
    let csrf = b
        .eval("return document.querySelector('meta[name=\"csrf-token\"]').content")
        .await;
    let cross = app
        .http
        .post(app.url(&format!("/api/v1/runs/{id}/stop")))
        .header("cookie", format!("trainyard_session={}", cookie.value()))
        .header("x-csrf-token", csrf.as_str().expect("csrf"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .expect("post");
    assert_eq!(cross.status().as_u16(), 403);
    let run: Value = app
        .http
        .get(app.url(&format!("/api/v1/runs/{id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert!(
        ["queued", "running"].contains(&run["status"].as_str().unwrap_or("")),
        "{run}"
    );
    b.screenshot("teams-owner").await;

    // Alice shares the experiment with rita (READ): from the run page, through the
    // experiment's "sharing" link, as a person would.
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    click(&b, "#sharing-link").await;
    b.wait_for("return !!document.getElementById('grant-form')", WAIT)
        .await;
    type_into(&b, "g-subject", "user:rita").await;
    click(&b, "#grant-form button").await;
    b.wait_for(
        "return document.getElementById('grants-table').textContent.includes('user rita')",
        WAIT,
    )
    .await;

    // Alice signs out: the run page is gone for this browser.
    click(&b, "#sign-out").await;
    b.wait_for("return location.pathname === '/sign-in'", WAIT)
        .await;
    b.client
        .goto(&app.url(&format!("/runs/{id}")))
        .await
        .expect("goto");
    assert_eq!(path(&b).await, "/sign-in");

    // Rita signs in: she sees the run, live, and no Stop button.
    sign_in_here(&b, "rita").await;
    b.wait_for(&format!("return location.pathname === '/runs/{id}'"), WAIT)
        .await;
    b.wait_for(
        "const c = window.__trainyard && window.__trainyard.charts['train/loss']; return !!c && c.points > 0",
        WAIT,
    )
    .await;
    let stop = b
        .eval("return !!document.getElementById('stop-button')")
        .await;
    assert_eq!(stop, json!(false), "a reader has no Stop button");
    let refused = b
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             const csrf = document.querySelector('meta[name=\"csrf-token\"]').content;
             fetch('/api/v1/runs/' + arguments[0] + '/stop', {method: 'POST', headers: {'x-csrf-token': csrf}})
               .then(r => done(r.status));",
            vec![json!(id)],
        )
        .await
        .expect("fetch");
    assert_eq!(refused, json!(403), "a reader cannot stop the run");
    b.screenshot("teams-reader").await;

    // The run is stopped by its owner's credential (the admin token here), and the reader
    // sees the badge follow, live.
    let stop = app
        .http
        .post(app.url(&format!("/api/v1/runs/{id}/stop")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("stop");
    assert!(stop.status().is_success());
    b.wait_for(
        "const s = document.getElementById('status-badge'); return ['stopped', 'finished'].includes(s.dataset.status || s.textContent.trim())",
        Duration::from_secs(120),
    )
    .await;
    b.close().await;
}
