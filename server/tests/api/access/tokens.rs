//! Personal access tokens and the run-scoped tokens launched runs report with.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{accounts, add_user, send, sign_in, Auth, PASSWORD};
use crate::helpers::TestApp;

async fn a_personal_token_is_shown_once_works_by_scope_and_stops_when_revoked(app: &TestApp) {
    add_user(app, "alice", false).await;
    let session = sign_in(app, "alice", PASSWORD).await;
    let mut secrets = Vec::new();
    for scope in ["write", "read"] {
        let r = send(
            app,
            &session,
            Method::POST,
            "/api/v1/tokens",
            Some(&json!({"name": scope, "scope": scope})),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let body: Value = r.json().await.expect("json");
        assert_eq!(body["token"]["scope"], scope);
        secrets.push((
            body["token"]["id"].as_str().expect("id").to_owned(),
            body["secret"].as_str().expect("secret").to_owned(),
        ));
    }
    let listed = send(app, &session, Method::GET, "/api/v1/tokens", None)
        .await
        .text()
        .await
        .expect("body");
    for (_, secret) in &secrets {
        assert!(!listed.contains(secret.as_str()), "{listed}");
    }
    let write = Auth::Bearer(secrets[0].1.clone());
    let read = Auth::Bearer(secrets[1].1.clone());
    let body = json!({"experiment": "alices"});
    assert_eq!(
        send(app, &write, Method::POST, "/api/v1/runs", Some(&body))
            .await
            .status(),
        StatusCode::CREATED
    );
    let refused = send(app, &read, Method::POST, "/api/v1/runs", Some(&body)).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let message: Value = refused.json().await.expect("json");
    assert!(message["error"]["message"]
        .as_str()
        .expect("message")
        .contains("only read"));
    assert_eq!(
        send(app, &read, Method::GET, "/api/v1/runs", None)
            .await
            .status(),
        StatusCode::OK
    );

    let revoked = send(
        app,
        &session,
        Method::DELETE,
        &format!("/api/v1/tokens/{}", secrets[0].0),
        None,
    )
    .await;
    assert_eq!(revoked.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        send(app, &write, Method::GET, "/api/v1/runs", None)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    // Another user cannot revoke (or even see) alice's token.
    add_user(app, "bob", false).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    let r = send(
        app,
        &bob,
        Method::DELETE,
        &format!("/api/v1/tokens/{}", secrets[1].0),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        send(app, &read, Method::GET, "/api/v1/runs", None)
            .await
            .status(),
        StatusCode::OK
    );
}

async fn an_expired_token_is_refused(app: &TestApp) {
    add_user(app, "alice", false).await;
    let user = app
        .state
        .store
        .user_by_name("alice")
        .await
        .expect("store")
        .expect("alice");
    let secret = "ty_expired_token_for_the_test";
    app.state
        .store
        .create_token(trainyard::store::accounts::TokenNew {
            id: "expired".into(),
            secret_hash: trainyard::access::secret::hash_secret(secret),
            user_id: Some(user.id),
            run_id: None,
            name: "old".into(),
            scope: trainyard::store::accounts::TokenScope::Write,
            created_at: 0,
            expires_at: Some(1),
        })
        .await
        .expect("token");
    let r = send(
        app,
        &Auth::Bearer(secret.into()),
        Method::GET,
        "/api/v1/runs",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

async fn a_run_token_reports_its_own_run_only_and_ends_with_it(app: &TestApp) {
    add_user(app, "alice", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let r = send(
            app,
            &alice,
            Method::POST,
            "/api/v1/runs",
            Some(&json!({"experiment": "e"})),
        )
        .await;
        let run: Value = r.json().await.expect("run");
        runs.push(run["id"].as_str().expect("id").to_owned());
    }
    let secret = trainyard::access::issue_run_token(app.state.store.as_ref(), &runs[0])
        .await
        .expect("token");
    let token = Auth::Bearer(secret);
    let points = json!({"points": [{"key": "loss", "step": 1, "value": 1.0}]});
    let own = send(
        app,
        &token,
        Method::POST,
        &format!("/api/v1/runs/{}/metrics", runs[0]),
        Some(&points),
    )
    .await;
    assert_eq!(own.status(), StatusCode::OK);
    let other = send(
        app,
        &token,
        Method::POST,
        &format!("/api/v1/runs/{}/metrics", runs[1]),
        Some(&points),
    )
    .await;
    assert_eq!(other.status(), StatusCode::FORBIDDEN);
    let read = send(
        app,
        &token,
        Method::GET,
        &format!("/api/v1/runs/{}", runs[0]),
        None,
    )
    .await;
    assert_eq!(read.status(), StatusCode::FORBIDDEN);
    let list = send(app, &token, Method::GET, "/api/v1/runs", None).await;
    assert_eq!(list.status(), StatusCode::FORBIDDEN);
    for status in ["running", "finished"] {
        let r = send(
            app,
            &token,
            Method::PATCH,
            &format!("/api/v1/runs/{}", runs[0]),
            Some(&json!({"status": status})),
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK, "{status}");
    }
    let after = send(
        app,
        &token,
        Method::POST,
        &format!("/api/v1/runs/{}/heartbeat", runs[0]),
        None,
    )
    .await;
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED);
}

async fn a_launched_run_gets_its_own_token_not_the_admin_token(app: &TestApp) {
    add_user(app, "alice", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let launch = json!({
        "experiment": "e",
        "launch": true,
        "command": ["sh", "-c", "echo \"token=$TRAINYARD_TOKEN\""],
    });
    let r = send(app, &alice, Method::POST, "/api/v1/runs", Some(&launch)).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let run: Value = r.json().await.expect("run");
    let id = run["id"].as_str().expect("id");
    let mut log = String::new();
    for _ in 0..600 {
        let run: Value = send(
            app,
            &alice,
            Method::GET,
            &format!("/api/v1/runs/{id}"),
            None,
        )
        .await
        .json()
        .await
        .expect("run");
        if ["finished", "failed"].contains(&run["status"].as_str().unwrap_or("")) {
            log = send(
                app,
                &alice,
                Method::GET,
                &format!("/api/v1/runs/{id}/logs"),
                None,
            )
            .await
            .text()
            .await
            .expect("log");
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let token = log
        .lines()
        .find_map(|l| l.trim().strip_prefix("token="))
        .unwrap_or_else(|| panic!("no token line in the log: {log}"))
        .trim()
        .to_owned();
    assert!(!token.is_empty());
    assert_ne!(token, super::ADMIN_TOKEN);
    // The run has ended, and its token with it.
    let r = send(
        app,
        &Auth::Bearer(token),
        Method::POST,
        &format!("/api/v1/runs/{id}/heartbeat"),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

fn accounts_with_commands(s: &mut trainyard::app::Settings) {
    accounts(s);
    s.allow_command_launch = true;
}

/// A wrong or stale credential is refused where a credential is needed, and ignored where none
/// is: a monitor with an old token still sees the health, a browser with one can still sign in.
async fn a_wrong_token_is_ignored_on_public_routes_and_refused_elsewhere(app: &TestApp) {
    let wrong = Auth::Bearer("ty_not-a-token-of-this-server".into());
    for path in ["/healthz", "/api/v1/openapi.json", "/sign-in"] {
        let response = send(app, &wrong, Method::GET, path, None).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    let response = send(app, &wrong, Method::GET, "/api/v1/runs", None).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

crate::on_both_backends_with!(accounts;
    a_wrong_token_is_ignored_on_public_routes_and_refused_elsewhere,
    a_personal_token_is_shown_once_works_by_scope_and_stops_when_revoked,
    an_expired_token_is_refused,
    a_run_token_reports_its_own_run_only_and_ends_with_it,
);

crate::on_both_backends_with!(accounts_with_commands;
    a_launched_run_gets_its_own_token_not_the_admin_token,
);
