//! A param or metric key that only runs the caller may not read have is as unknown to it as a
//! key no run has: the same 400 with the same message shape, no "did you mean" naming it, and
//! the runs page neither suggests nor shows it. Its readers still get it.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{accounts, add_user, send, sign_in, Auth, ADMIN_TOKEN, PASSWORD};
use crate::helpers::TestApp;

const HIDDEN_PARAM: &str = "zeta_codename_project";
const HIDDEN_METRIC: &str = "zeta/secret_loss";

/// A run of `who` in `experiment` with `config`, and a point of `metric`; returns the
/// experiment's id.
async fn run_with(
    app: &TestApp,
    who: &Auth,
    experiment: &str,
    config: Value,
    metric: &str,
) -> String {
    let r = send(
        app,
        who,
        Method::POST,
        "/api/v1/runs",
        Some(&json!({"experiment": experiment, "config": config})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let run: Value = r.json().await.expect("run");
    let id = run["id"].as_str().expect("id");
    let points = json!({"points": [{"key": metric, "step": 1, "value": 1.5}]});
    let r = send(
        app,
        who,
        Method::POST,
        &format!("/api/v1/runs/{id}/metrics"),
        Some(&points),
    )
    .await;
    assert!(r.status().is_success());
    run["experiment_id"]
        .as_str()
        .expect("experiment")
        .to_owned()
}

/// The status and the JSON body of a run search.
async fn search(app: &TestApp, who: &Auth, query: &[(&str, &str)]) -> (StatusCode, Value) {
    let mut url = reqwest::Url::parse(&app.url("/api/v1/runs")).expect("url");
    url.query_pairs_mut().extend_pairs(query);
    let path = format!("/api/v1/runs?{}", url.query().unwrap_or(""));
    let r = send(app, who, Method::GET, &path, None).await;
    let status = r.status();
    (status, r.json().await.expect("json"))
}

fn message(body: &Value) -> String {
    body["error"]["message"].as_str().unwrap_or("").to_owned()
}

async fn runs_page(app: &TestApp, who: &Auth, query: &str) -> String {
    let r = send(app, who, Method::GET, &format!("/?{query}"), None).await;
    assert_eq!(r.status(), StatusCode::OK, "/?{query}");
    r.text().await.expect("html")
}

/// Alice's private experiment has the hidden keys; bob's own has others; carol may read
/// alice's through a grant.
async fn world(app: &TestApp) -> (Auth, Auth, Auth, String) {
    for name in ["alice", "bob", "carol"] {
        add_user(app, name, false).await;
    }
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    let carol = sign_in(app, "carol", PASSWORD).await;
    let private = run_with(
        app,
        &alice,
        "alice-private",
        json!({HIDDEN_PARAM: "x", "training": {"learning_rate": 0.1}}),
        HIDDEN_METRIC,
    )
    .await;
    run_with(
        app,
        &bob,
        "bob-own",
        json!({"training": {"learning_rate": 0.2}}),
        "train/loss",
    )
    .await;
    let r = send(
        app,
        &alice,
        Method::PUT,
        &format!("/api/v1/experiments/{private}/grants"),
        Some(&json!({"user": "carol", "level": "read"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    (alice, bob, carol, private)
}

async fn a_key_only_hidden_runs_have_answers_like_an_unknown_key(app: &TestApp) {
    let (alice, bob, carol, private) = world(app).await;
    let unknown_param = "zzqq_never_logged_key";
    let unknown_metric = "zzqq/never_logged";
    // Sorting by a hidden key: the same 400 as by a key no run has, word for word but the key.
    for (hidden, unknown) in [
        (
            format!("params.{HIDDEN_PARAM}"),
            format!("params.{unknown_param}"),
        ),
        (
            format!("-metrics.{HIDDEN_METRIC}"),
            format!("-metrics.{unknown_metric}"),
        ),
    ] {
        let (status, body) = search(app, &bob, &[("sort", &hidden)]).await;
        let (unknown_status, unknown_body) = search(app, &bob, &[("sort", &unknown)]).await;
        assert_eq!(unknown_status, StatusCode::BAD_REQUEST, "{unknown_body}");
        assert_eq!(status, unknown_status, "sort={hidden}: {body}");
        assert_eq!(body["error"]["field"], unknown_body["error"]["field"]);
        let key = |s: &str| s.trim_start_matches('-').to_owned();
        assert_eq!(
            message(&body).replace(&key(&hidden), "KEY"),
            message(&unknown_body).replace(&key(&unknown), "KEY"),
        );
    }
    // A near miss is not answered with the hidden key, in `q` or in `sort`.
    let typo = &HIDDEN_PARAM[..HIDDEN_PARAM.len() - 1];
    for (field, value) in [
        ("q", format!("params.{typo} = 'x'")),
        ("sort", format!("params.{typo}")),
        ("q", "metrics.zeta/secret_los < 2".to_owned()),
    ] {
        let (status, body) = search(app, &bob, &[(field, &value)]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}={value}");
        let said = message(&body);
        assert!(
            !said.contains(&format!("{HIDDEN_PARAM}`")) && !said.contains(HIDDEN_METRIC),
            "{field}={value} names a hidden key: {said}"
        );
    }
    // A search of the hidden experiment with a bad key is "not found", like a missing one,
    // not a 400 naming the experiment.
    let (status, body) = search(
        app,
        &bob,
        &[("experiment", &private), ("sort", "params.bogus")],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(message(&body), format!("experiment `{private}` not found"));

    // The runs page: no suggestion, no column.
    for query in ["", "q=params.zeta_codename_projec%20%3D%20'x'"] {
        let html = runs_page(app, &bob, query).await;
        assert!(
            !html.contains(HIDDEN_PARAM) && !html.contains(HIDDEN_METRIC),
            "bob's runs page /?{query} shows a hidden key"
        );
    }

    // Those who may read the runs get the key: the owner, a grantee, an administrator.
    for who in [&alice, &carol, &Auth::Bearer(ADMIN_TOKEN.into())] {
        let (status, body) = search(app, who, &[("sort", &format!("params.{HIDDEN_PARAM}"))]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, body) = search(app, who, &[("q", &format!("params.{typo} = 'x'"))]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            message(&body).contains(&format!("did you mean `params.{HIDDEN_PARAM}`")),
            "{body}"
        );
    }
    let html = runs_page(app, &carol, "q=params.zeta_codename_projec%20%3D%20'x'").await;
    assert!(
        html.contains(HIDDEN_PARAM),
        "carol's runs page suggests the key"
    );
}

crate::on_both_backends_with!(accounts;
    a_key_only_hidden_runs_have_answers_like_an_unknown_key,
);
