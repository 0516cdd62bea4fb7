//! The role matrix: every route with an access rule, for every kind of caller, answers as its
//! rule says. The routes come from `access::policy` and the API's OpenAPI document (a
//! documented route without a rule fails here), so a route added later is covered without
//! anyone remembering to add it.

use reqwest::header::CONTENT_TYPE;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use trainyard::access::policy::{self, Rule};
use trainyard::store::accounts::Level;
use trainyard::store::models::{NewModel, NewVersion};

use super::{accounts, add_user, admin, raw_client, send, sign_in, Auth};
use crate::helpers::TestApp;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Anonymous,
    Outsider,
    Reader,
    Editor,
    Manager,
    Owner,
    Admin,
    ReadToken,
    RunToken,
}

/// What a caller got: through, asked to sign in, refused, or told the target does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Allowed,
    SignIn,
    Forbidden,
    Hidden,
}

pub(super) struct World {
    pub(super) experiment: String,
    pub(super) run: String,
    pub(super) sweep: String,
    /// A registered model in the experiment, made by its owner, with version 1 (from the run)
    /// and the alias `champion`.
    pub(super) model: String,
    pub(super) callers: Vec<(Role, Auth)>,
}

impl Role {
    /// The role's level on the experiment of the world.
    fn level(self) -> Level {
        match self {
            Role::Anonymous | Role::Outsider | Role::RunToken => Level::None,
            Role::Reader | Role::ReadToken => Level::Read,
            Role::Editor => Level::Edit,
            Role::Manager | Role::Owner | Role::Admin => Level::Manage,
        }
    }
}

/// Users with each role on experiment `shared`: its owner made it and granted a team READ, one
/// user EDIT and one MANAGE; an outsider is in another team; the admin is an administrator.
async fn world(app: &TestApp) -> World {
    for (name, is_admin) in [
        ("alice", false),
        ("rita", false),
        ("ed", false),
        ("mia", false),
        ("olga", false),
        ("adam", true),
        ("zed", false),
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
        Method::POST,
        "/api/v1/teams",
        json!({"name": "others"}),
    )
    .await;
    admin(
        app,
        Method::PUT,
        "/api/v1/teams/readers/members/rita",
        json!({}),
    )
    .await;
    admin(
        app,
        Method::PUT,
        "/api/v1/teams/others/members/olga",
        json!({}),
    )
    .await;

    let alice = sign_in(app, "alice", super::PASSWORD).await;
    let created = send(
        app,
        &alice,
        Method::POST,
        "/api/v1/runs",
        Some(&json!({"experiment": "shared"})),
    )
    .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let run: Value = created.json().await.expect("run");
    let run_id = run["id"].as_str().expect("id").to_owned();
    let experiment = run["experiment_id"]
        .as_str()
        .expect("experiment")
        .to_owned();
    let points = json!({"points": [{"key": "train/loss", "step": 1, "value": 2.5}]});
    let posted = send(
        app,
        &alice,
        Method::POST,
        &format!("/api/v1/runs/{run_id}/metrics"),
        Some(&points),
    )
    .await;
    assert!(posted.status().is_success());
    for grant in [
        json!({"team": "readers", "level": "read"}),
        json!({"user": "ed", "level": "edit"}),
        json!({"user": "mia", "level": "manage"}),
    ] {
        let r = send(
            app,
            &alice,
            Method::PUT,
            &format!("/api/v1/experiments/{experiment}/grants"),
            Some(&grant),
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK, "grant {grant}");
    }
    let token = send(
        app,
        &alice,
        Method::POST,
        "/api/v1/tokens",
        Some(&json!({"name": "read only", "scope": "read"})),
    )
    .await;
    assert_eq!(token.status(), StatusCode::CREATED);
    let token: Value = token.json().await.expect("token");
    let run_secret = trainyard::access::issue_run_token(app.state.store.as_ref(), &run_id)
        .await
        .expect("run token");

    let mut callers = vec![(Role::Anonymous, Auth::Nobody)];
    for (role, name) in [
        (Role::Outsider, "olga"),
        (Role::Reader, "rita"),
        (Role::Editor, "ed"),
        (Role::Manager, "mia"),
        (Role::Admin, "adam"),
    ] {
        callers.push((role, sign_in(app, name, super::PASSWORD).await));
    }
    callers.push((Role::Owner, alice));
    callers.push((
        Role::ReadToken,
        Auth::Bearer(token["secret"].as_str().expect("secret").into()),
    ));
    callers.push((Role::RunToken, Auth::Bearer(run_secret)));
    // A sweep in the experiment, written to the store directly: no controller runs for it, so
    // the calls below launch nothing (a resume would, and its command launches are refused).
    let owner = app
        .state
        .store
        .user_by_name("alice")
        .await
        .expect("alice")
        .expect("alice exists");
    let spec = json!({"name": "matrix", "base": {"command": "true"}, "method": "random",
        "metric": {"name": "loss"}, "max_trials": 1,
        "parameters": {"x": {"values": [1, 2]}}});
    let sweep = app
        .state
        .store
        .create_sweep(&experiment, "matrix", &spec, Some(&owner.id))
        .await
        .expect("sweep");
    let model = registered_model(app, &experiment, &run_id, &owner.id).await;
    World {
        experiment,
        run: run_id,
        sweep: sweep.id,
        model,
        callers,
    }
}

/// A new registered model in `experiment` made by `creator`, with version 1 from `run` and the
/// alias `champion` on it, written to the store directly.
pub(super) async fn registered_model(
    app: &TestApp,
    experiment: &str,
    run: &str,
    creator: &str,
) -> String {
    let unique = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("matrix-model-{unique}");
    let store = &app.state.store;
    store
        .create_model(NewModel {
            name: name.clone(),
            experiment_id: experiment.to_owned(),
            created_by: Some(creator.to_owned()),
            ..NewModel::default()
        })
        .await
        .expect("model");
    store
        .create_version(
            &name,
            NewVersion {
                run_id: Some(run.to_owned()),
                source: format!("mlflow-artifacts:/{experiment}/{run}/artifacts/model"),
                created_by: Some(creator.to_owned()),
                ..NewVersion::default()
            },
        )
        .await
        .expect("version");
    store.set_alias(&name, "champion", 1).await.expect("alias");
    name
}

/// Whether the route is one of the model registry's.
fn is_registry(pattern: &str) -> bool {
    pattern.contains("/registered-models/") || pattern.contains("/model-versions/")
}

/// Whether the route speaks the MLflow protocol (its target is named in the query or body).
fn is_mlflow(pattern: &str) -> bool {
    pattern.contains("/mlflow")
}

/// An MLflow route's path in this world: its target in the query string (GETs) or the
/// artifact path (`<experiment>/<run>/artifacts/...`).
fn concrete_mlflow(pattern: &str, w: &World) -> String {
    let (exp, run) = (&w.experiment, &w.run);
    let path = pattern.replace("{*path}", &format!("{exp}/{run}/artifacts/matrix.txt"));
    if pattern.ends_with("/mlflow-artifacts/artifacts") {
        return format!("{path}?path={exp}/{run}/artifacts");
    }
    if pattern.ends_with("get-by-name") {
        return format!("{path}?experiment_name=shared");
    }
    format!(
        "{path}?run_id={run}&experiment_id={exp}&metric_key=train/loss&run_ids={run}\
         &experiment_ids={exp}&name={}&version=1&alias=champion",
        w.model
    )
}

/// The concrete path for a route pattern in this world.
pub(super) fn concrete(pattern: &str, w: &World) -> String {
    if is_mlflow(pattern) {
        return concrete_mlflow(pattern, w);
    }
    let id = if pattern.contains("/experiments/{id}") {
        w.experiment.as_str()
    } else if pattern.contains("/models/{id}") {
        w.model.as_str()
    } else if pattern.contains("/sweeps/{id}") {
        w.sweep.as_str()
    } else if pattern.contains("/teams/{id}") {
        "others"
    } else if pattern.contains("/tokens/{id}") {
        "no-such-token"
    } else {
        w.run.as_str()
    };
    let mut path = pattern
        .replace("{id}", id)
        .replace(
            "{name}",
            if pattern.contains("/users/") {
                "zed"
            } else {
                "step-999"
            },
        )
        .replace("{user}", "zed")
        .replace("{alias}", "champion")
        .replace("{version}", "1")
        .replace("{*file}", "train/loss.svg")
        .replace("{file}", "compare.svg");
    // Routes that name runs in the query string.
    if path == "/compare" {
        path = format!("/compare?runs={}", w.run);
    }
    if path == "/api/v1/charts/compare.svg" {
        path = format!("{path}?runs={}&key=train/loss", w.run);
    }
    path
}

/// What the rule promises a role (`write`: the method changes something).
fn expected(rule: Rule, role: Role, write: bool, run_named: bool) -> Outcome {
    expected_at(rule, role, role.level(), write, run_named)
}

/// What the rule promises a role whose level on the route's target is `have`.
pub(super) fn expected_at(
    rule: Rule,
    role: Role,
    have: Level,
    write: bool,
    run_named: bool,
) -> Outcome {
    if rule == Rule::Public {
        return Outcome::Allowed;
    }
    if role == Role::Anonymous {
        return Outcome::SignIn;
    }
    if role == Role::ReadToken && write {
        return Outcome::Forbidden;
    }
    let rule = match rule {
        Rule::InRequest(target) => target.rule(),
        other => other,
    };
    if role == Role::RunToken {
        return if rule == Rule::Report {
            Outcome::Allowed
        } else {
            Outcome::Forbidden
        };
    }
    let needed = match rule {
        Rule::Public => return Outcome::Allowed,
        Rule::InRequest(_) => unreachable!("replaced by its target's rule above"),
        Rule::SignedIn if run_named => Level::Read,
        Rule::SignedIn => return Outcome::Allowed,
        Rule::Admin if role == Role::Admin => return Outcome::Allowed,
        Rule::Admin => return Outcome::Forbidden,
        Rule::Run(level) | Rule::Experiment(level) | Rule::Sweep(level) | Rule::Model(level) => {
            level
        }
        Rule::Report => Level::Edit,
    };
    if have < Level::Read {
        Outcome::Hidden
    } else if have < needed {
        Outcome::Forbidden
    } else {
        Outcome::Allowed
    }
}

/// A request body that gets past the access check and fails (or does nothing) after it.
fn body_for(method: &Method, pattern: &str, page: bool, w: &World) -> Option<String> {
    if *method == Method::GET || *method == Method::DELETE {
        return None;
    }
    if is_mlflow(pattern) {
        if *method == Method::PUT {
            return Some("artifact".into());
        }
        // Names the world's run and experiment; `name` makes `experiments/create` a new one
        // (which every signed-in caller may do).
        let unique = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        if pattern.ends_with("/registered-models/create") {
            // A new model in the world's experiment: EDIT there creates it.
            return Some(
                json!({"name": format!("matrix-{unique}"),
                       "tags": [{"key": "trainyard.experiment", "value": w.experiment}]})
                .to_string(),
            );
        }
        if is_registry(pattern) {
            // Names the world's model; a rename keeps its name, a new version comes from the
            // world's run, the alias points at version 1.
            let (exp, run) = (&w.experiment, &w.run);
            return Some(
                json!({"name": w.model, "new_name": w.model, "version": "1",
                       "alias": "champion", "key": "matrix", "value": "1",
                       "run_id": run,
                       "source": format!("mlflow-artifacts:/{exp}/{run}/artifacts/model")})
                .to_string(),
            );
        }
        return Some(
            json!({"run_id": w.run, "experiment_id": w.experiment, "experiment_ids": [w.experiment],
                   "key": "matrix", "value": "1", "name": format!("matrix-{unique}")})
            .to_string(),
        );
    }
    Some(if page {
        match pattern {
            // An unparsable config: refused after the experiment's access check.
            "/launch" => "experiment=shared&name=m&gpus=0&profile=tiny&yaml=model%3A+%5B".into(),
            _ => String::new(),
        }
    } else {
        match pattern {
            "/api/v1/runs" => json!({"experiment": "shared"}).to_string(),
            _ => "{}".into(),
        }
    })
}

pub(super) async fn outcome(
    app: &TestApp,
    w: &World,
    auth: &Auth,
    method: &Method,
    pattern: &str,
) -> (Outcome, String) {
    let page = !(pattern.starts_with("/api/") || pattern == "/healthz");
    let path = concrete(pattern, w);
    let mut request = raw_client().request(method.clone(), app.url(&path));
    if let Some(body) = body_for(method, pattern, page, w) {
        if page {
            let csrf = match auth {
                Auth::Session { csrf, .. } => csrf.clone(),
                _ => String::new(),
            };
            let sep = if body.is_empty() { "" } else { "&" };
            request = request
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(format!("{body}{sep}csrf={csrf}"));
        } else {
            request = request.header(CONTENT_TYPE, "application/json").body(body);
        }
    }
    let response = auth.apply(request).send().await.expect("request");
    let status = response.status();
    let location = response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let stream = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    // An event stream never ends: its status says all (the body is not read).
    let text = if stream {
        String::new()
    } else {
        response.text().await.unwrap_or_default()
    };
    let said = format!(
        "{status} {location} {}",
        text.chars().take(200).collect::<String>()
    );
    assert!(!status.is_server_error(), "{method} {path}: {said}");
    // Hidden: exactly the answer for a run or experiment that does not exist (not, say, a
    // missing checkpoint of a run the caller may read).
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| {
            // The API's error shape, or the MLflow protocol's.
            v["error"]["message"]
                .as_str()
                .or_else(|| v["message"].as_str())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| {
            // An HTML error page: its message is the alert box's text.
            text.split("role=\"alert\">")
                .nth(1)
                .and_then(|rest| rest.split('<').next())
                .unwrap_or("")
                .to_owned()
        });
    let hidden = status == StatusCode::NOT_FOUND
        && [
            format!("run `{}` not found", w.run),
            format!("experiment `{}` not found", w.experiment),
            "experiment `shared` not found".to_owned(),
            format!("sweep `{}` not found", w.sweep),
            format!("registered model `{}` not found", w.model),
        ]
        .contains(&message);
    let got = match status {
        StatusCode::UNAUTHORIZED => Outcome::SignIn,
        StatusCode::SEE_OTHER if location.starts_with("/sign-in") => Outcome::SignIn,
        StatusCode::FORBIDDEN => Outcome::Forbidden,
        _ if hidden => Outcome::Hidden,
        StatusCode::NOT_FOUND if text.contains("no route for") => {
            panic!("{method} {path} has a rule but no route: {said}")
        }
        _ => Outcome::Allowed,
    };
    (got, said)
}

pub(super) fn deletes(method: &Method, pattern: &str) -> bool {
    (*method == Method::DELETE && pattern == "/api/v1/runs/{id}")
        || (*method == Method::POST && pattern == "/runs/{id}/delete")
}

/// Routes that delete the world's model or one of its versions: each call gets a model of its
/// own.
pub(super) fn deletes_a_model(method: &Method, pattern: &str) -> bool {
    *method == Method::DELETE
        && (pattern.ends_with("/registered-models/delete")
            || pattern.ends_with("/model-versions/delete"))
}

/// The id of the user `name`.
pub(super) async fn user_id(app: &TestApp, name: &str) -> String {
    app.state
        .store
        .user_by_name(name)
        .await
        .expect("user")
        .expect("user exists")
        .id
}

/// A new run in the world's experiment, created with the admin token.
async fn disposable_run(app: &TestApp, w: &World) -> String {
    let run = admin(
        app,
        Method::POST,
        "/api/v1/runs",
        json!({"experiment": w.experiment}),
    )
    .await;
    run["id"].as_str().expect("id").to_owned()
}

/// Routes whose call would end the caller's own session; they are checked in `sessions.rs`.
pub(super) fn ends_the_session(method: &Method, pattern: &str) -> bool {
    (*method == Method::DELETE && pattern == "/api/v1/session")
        || (*method == Method::POST && pattern == "/sign-out")
}

async fn every_route_answers_each_role_as_its_rule_says(app: &TestApp) {
    let w = world(app).await;
    let mut failures = Vec::new();
    let mut checked = 0;
    for (method, pattern, rule) in policy::routes() {
        if ends_the_session(method, pattern) {
            continue;
        }
        let write = policy::changes(method, pattern);
        // Routes that act on runs or an experiment named in the query or body.
        let run_named = matches!(pattern, "/compare" | "/api/v1/charts/{file}");
        let rule = match (method.as_str(), pattern) {
            ("POST", "/api/v1/runs")
            | ("POST", "/launch")
            | ("POST", "/api/2.0/mlflow/registered-models/create") => Rule::Experiment(Level::Edit),
            _ => rule,
        };
        for (role, auth) in &w.callers {
            let want = expected(rule, *role, write, run_named);
            // A deletion gets a run of its own, so the others keep theirs.
            let fresh;
            let w = if deletes(method, pattern) {
                fresh = World {
                    run: disposable_run(app, &w).await,
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
                    model: registered_model(app, &w.experiment, &w.run, &owner).await,
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
    assert!(checked > 500, "only {checked} checks ran");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

async fn every_documented_api_route_has_an_access_rule(app: &TestApp) {
    let doc: Value = raw_client()
        .get(app.url("/api/v1/openapi.json"))
        .send()
        .await
        .expect("openapi")
        .json()
        .await
        .expect("json");
    let paths = doc["paths"].as_object().expect("paths");
    let mut missing = Vec::new();
    for (path, item) in paths {
        for method in item.as_object().expect("item").keys() {
            let Ok(m) = method.to_uppercase().parse::<Method>() else {
                continue;
            };
            if !matches!(
                m,
                Method::GET | Method::POST | Method::PUT | Method::PATCH | Method::DELETE
            ) {
                continue;
            }
            let m = axum::http::Method::from_bytes(m.as_str().as_bytes()).expect("method");
            // The document cannot write a catch-all segment: `{file}` stands for `{*file}`.
            let catch_all = match path.rfind("/{") {
                Some(at) => format!("{}/{{*{}", &path[..at], &path[at + 2..]),
                None => path.clone(),
            };
            if policy::rule(&m, path).is_none() && policy::rule(&m, &catch_all).is_none() {
                missing.push(format!("{m} {path}"));
            }
        }
    }
    assert!(paths.len() > 25, "the document lists {} paths", paths.len());
    assert!(
        missing.is_empty(),
        "documented routes without an access rule: {missing:?}"
    );
}

crate::on_both_backends_with!(accounts;
    every_route_answers_each_role_as_its_rule_says,
    every_documented_api_route_has_an_access_rule,
);
