//! The shared `Default` experiment: every signed-in user may add runs to it and read them all,
//! but a run there is changed only by its creator, administrators and those granted on it
//! (`access::policy::run_level`). The walk below is the role matrix for every run and sweep
//! route with the world's run and sweep in `Default`; the launch form starts with the
//! experiment the user launched into last, so runs need not land there at all.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use trainyard::access::policy::{self, Rule, Target};
use trainyard::store::accounts::Level;

use super::matrix::{
    deletes, deletes_a_model, ends_the_session, expected_at, outcome, registered_model, user_id,
    Role, World,
};
use super::{accounts, add_user, admin, send, sign_in, Auth, PASSWORD};
use crate::helpers::TestApp;

/// A run in `Default` created by `who` (no experiment named, as `trainyard submit` does).
async fn run_in_default(app: &TestApp, who: &Auth) -> String {
    let r = send(app, who, Method::POST, "/api/v1/runs", Some(&json!({}))).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let run: Value = r.json().await.expect("run");
    assert_eq!(run["experiment_id"], "0", "{run}");
    run["id"].as_str().expect("id").to_owned()
}

async fn grant_on_default(app: &TestApp, grant: Value) {
    admin(app, Method::PUT, "/api/v1/experiments/0/grants", grant).await;
}

/// Each role of the matrix, with the run and the sweep in `Default` made by `alice` (the
/// owner role here is the creator), and grants there: `ed` EDIT, `mia` MANAGE, the team of
/// `rita` READ; `olga` only has what everyone has on `Default` (EDIT, its default level).
async fn default_world(app: &TestApp) -> World {
    for (name, is_admin) in [
        ("alice", false),
        ("rita", false),
        ("ed", false),
        ("mia", false),
        ("olga", false),
        ("adam", true),
    ] {
        add_user(app, name, is_admin).await;
    }
    admin(
        app,
        Method::POST,
        "/api/v1/teams",
        json!({"name": "readers"}),
    )
    .await;
    admin(
        app,
        Method::PUT,
        "/api/v1/teams/readers/members/rita",
        json!({}),
    )
    .await;
    grant_on_default(app, json!({"team": "readers", "level": "read"})).await;
    grant_on_default(app, json!({"user": "ed", "level": "edit"})).await;
    grant_on_default(app, json!({"user": "mia", "level": "manage"})).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let run = run_in_default(app, &alice).await;
    let points = json!({"points": [{"key": "train/loss", "step": 1, "value": 2.5}]});
    let posted = send(
        app,
        &alice,
        Method::POST,
        &format!("/api/v1/runs/{run}/metrics"),
        Some(&points),
    )
    .await;
    assert!(posted.status().is_success());
    let token = send(
        app,
        &alice,
        Method::POST,
        "/api/v1/tokens",
        Some(&json!({"name": "read only", "scope": "read"})),
    )
    .await;
    let token: Value = token.json().await.expect("token");
    let run_secret = trainyard::access::issue_run_token(app.state.store.as_ref(), &run)
        .await
        .expect("run token");
    let owner = app
        .state
        .store
        .user_by_name("alice")
        .await
        .expect("alice")
        .expect("alice exists");
    let spec = json!({"name": "shared", "base": {"command": "true"}, "method": "random",
        "metric": {"name": "loss"}, "max_trials": 1,
        "parameters": {"x": {"values": [1, 2]}}});
    let sweep = app
        .state
        .store
        .create_sweep("0", "shared", &spec, Some(&owner.id))
        .await
        .expect("sweep");
    let mut callers = vec![(Role::Anonymous, Auth::Nobody)];
    for (role, name) in [
        (Role::Outsider, "olga"),
        (Role::Reader, "rita"),
        (Role::Editor, "ed"),
        (Role::Manager, "mia"),
        (Role::Admin, "adam"),
    ] {
        callers.push((role, sign_in(app, name, PASSWORD).await));
    }
    callers.push((Role::Owner, alice));
    callers.push((
        Role::ReadToken,
        Auth::Bearer(token["secret"].as_str().expect("secret").into()),
    ));
    callers.push((Role::RunToken, Auth::Bearer(run_secret)));
    let model = registered_model(app, "0", &run, &owner.id).await;
    World {
        experiment: "0".into(),
        run,
        sweep: sweep.id,
        model,
        callers,
    }
}

/// The level each role has on the world's run (or sweep) in `Default`, as the docs' table
/// says: READ for everyone but its creator (MANAGE: it may delete its own run), the users
/// granted more, and administrators.
fn level_on_run_in_default(role: Role) -> Level {
    match role {
        Role::Anonymous | Role::RunToken => Level::None,
        Role::Outsider | Role::Reader | Role::ReadToken => Level::Read,
        Role::Editor => Level::Edit,
        Role::Manager | Role::Owner | Role::Admin => Level::Manage,
    }
}

/// Whether the route acts on the run, the sweep or the model (not on the experiment, or on
/// nothing): a model in `Default` is changed by the same people as a run there.
fn on_run_or_sweep(rule: Rule) -> bool {
    matches!(
        rule,
        Rule::Run(_)
            | Rule::Report
            | Rule::Sweep(_)
            | Rule::Model(_)
            | Rule::InRequest(Target::Run(_))
            | Rule::InRequest(Target::Report)
            | Rule::InRequest(Target::Model(_))
    )
}

async fn every_run_and_sweep_route_in_default_answers_as_the_shared_rule_says(app: &TestApp) {
    let w = default_world(app).await;
    let mut failures = Vec::new();
    let mut checked = 0;
    for (method, pattern, rule) in policy::routes() {
        if !on_run_or_sweep(rule) || ends_the_session(method, pattern) {
            continue;
        }
        let write = policy::changes(method, pattern);
        for (role, auth) in &w.callers {
            let want = expected_at(rule, *role, level_on_run_in_default(*role), write, false);
            // A deletion gets a run of its own (made by the same creator).
            let fresh;
            let w = if deletes(method, pattern) {
                let (_, creator) = w
                    .callers
                    .iter()
                    .find(|(r, _)| *r == Role::Owner)
                    .expect("the creator");
                fresh = World {
                    run: run_in_default(app, creator).await,
                    experiment: w.experiment.clone(),
                    sweep: w.sweep.clone(),
                    model: w.model.clone(),
                    callers: Vec::new(),
                };
                &fresh
            } else if deletes_a_model(method, pattern) {
                let owner = user_id(app, "alice").await;
                fresh = World {
                    run: w.run.clone(),
                    experiment: w.experiment.clone(),
                    sweep: w.sweep.clone(),
                    model: registered_model(app, "0", &w.run, &owner).await,
                    callers: Vec::new(),
                };
                &fresh
            } else {
                &w
            };
            let (got, said) = outcome(app, w, auth, method, pattern).await;
            checked += 1;
            if got != want {
                failures.push(format!(
                    "{role:?} {method} {pattern}: expected {want:?}, got {got:?} ({said})"
                ));
            }
        }
    }
    assert!(checked > 300, "only {checked} checks ran");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

async fn another_users_run_in_default_is_read_only_to_a_user_without_a_grant(app: &TestApp) {
    for (name, is_admin) in [("alice", false), ("bob", false), ("adam", true)] {
        add_user(app, name, is_admin).await;
    }
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    let adam = sign_in(app, "adam", PASSWORD).await;
    let run = run_in_default(app, &alice).await;
    let path = format!("/api/v1/runs/{run}");
    // Bob reads it, and changes nothing of it.
    let r = send(app, &bob, Method::GET, &path, None).await;
    assert_eq!(r.status(), StatusCode::OK);
    let tag = json!({"tags": {"mine": "now"}});
    let attempts = [
        (Method::PATCH, path.clone(), tag.clone()),
        (Method::POST, format!("{path}/stop"), json!({})),
        (Method::POST, format!("{path}/resume"), json!({})),
        (Method::DELETE, path.clone(), json!({})),
        (
            Method::POST,
            "/api/2.0/mlflow/runs/set-tag".into(),
            json!({"run_id": run, "key": "mine", "value": "now"}),
        ),
        (
            Method::POST,
            "/api/2.0/mlflow/runs/delete".into(),
            json!({"run_id": run}),
        ),
    ];
    for (method, target, body) in &attempts {
        let r = send(app, &bob, method.clone(), target, Some(body)).await;
        let status = r.status();
        let text = r.text().await.expect("body");
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "bob {method} {target}: {text}"
        );
        assert!(text.contains("Default"), "the refusal says why: {text}");
    }
    let got: Value = send(app, &bob, Method::GET, &path, None)
        .await
        .json()
        .await
        .expect("run");
    assert!(got["tags"].get("mine").is_none(), "{got}");
    assert!(got["deleted_at"].is_null(), "{got}");
    // The run's page offers bob no action on it, and its creator every one.
    let page = |who: &Auth| {
        let who = who.clone();
        let run = run.clone();
        async move {
            let r = send(app, &who, Method::GET, &format!("/runs/{run}"), None).await;
            assert_eq!(r.status(), StatusCode::OK);
            r.text().await.expect("html")
        }
    };
    let bobs = page(&bob).await;
    assert!(
        !bobs.contains("id=\"stop-form\"") && !bobs.contains("id=\"tag-form\""),
        "bob is offered actions on alice's run"
    );
    let alices = page(&alice).await;
    assert!(alices.contains("id=\"tag-form\"") && alices.contains("id=\"delete-form\""));

    // Its creator and an administrator may: tag, stop, delete.
    for who in [&alice, &adam] {
        let r = send(app, who, Method::PATCH, &path, Some(&tag)).await;
        assert_eq!(r.status(), StatusCode::OK, "tag");
        let r = send(app, who, Method::POST, &format!("{path}/stop"), None).await;
        assert!(
            r.status().is_success() || r.status() == StatusCode::CONFLICT,
            "stop: {}",
            r.status()
        );
    }
    let r = send(app, &alice, Method::DELETE, &path, None).await;
    assert!(
        r.status().is_success(),
        "the creator deletes: {}",
        r.status()
    );
    let theirs = run_in_default(app, &alice).await;
    let r = send(
        app,
        &adam,
        Method::DELETE,
        &format!("/api/v1/runs/{theirs}"),
        None,
    )
    .await;
    assert!(r.status().is_success(), "an admin deletes: {}", r.status());

    // A grant of EDIT on Default lets bob change others' runs there.
    grant_on_default(app, json!({"user": "bob", "level": "edit"})).await;
    let another = run_in_default(app, &alice).await;
    let r = send(
        app,
        &bob,
        Method::PATCH,
        &format!("/api/v1/runs/{another}"),
        Some(&tag),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "a grantee tags");
}

/// The launch form's experiment field, as the page renders it.
async fn launch_form_experiment(app: &TestApp, who: &Auth) -> String {
    let r = send(app, who, Method::GET, "/launch", None).await;
    assert_eq!(r.status(), StatusCode::OK);
    let html = r.text().await.expect("html");
    let field = html
        .split("id=\"l-experiment\"")
        .nth(1)
        .expect("the experiment field");
    let value = field
        .split("value=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .expect("its value");
    value.to_owned()
}

async fn the_launch_form_starts_with_the_experiment_the_user_used_last(app: &TestApp) {
    add_user(app, "alice", false).await;
    add_user(app, "bob", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    // Nothing launched yet: Default.
    assert_eq!(launch_form_experiment(app, &alice).await, "Default");
    for experiment in ["alice-first", "alice-second"] {
        let r = send(
            app,
            &alice,
            Method::POST,
            "/api/v1/runs",
            Some(&json!({"experiment": experiment})),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    assert_eq!(launch_form_experiment(app, &alice).await, "alice-second");
    // Another user's runs do not count, and an experiment it may not read is never offered.
    assert_eq!(launch_form_experiment(app, &bob).await, "Default");
    let html = send(app, &bob, Method::GET, "/launch", None)
        .await
        .text()
        .await
        .expect("html");
    assert!(!html.contains("alice-second"), "bob is offered alice's");
}

crate::on_both_backends_with!(accounts;
    every_run_and_sweep_route_in_default_answers_as_the_shared_rule_says,
    another_users_run_in_default_is_read_only_to_a_user_without_a_grant,
    the_launch_form_starts_with_the_experiment_the_user_used_last,
);
