//! What names reveal (docs/security.md): an experiment name taken by a hidden experiment is
//! refused as taken, and says nothing more; whether a user name exists is told only to those
//! who may manage an experiment's grants.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{accounts, add_user, send, sign_in, Auth, PASSWORD};
use crate::helpers::TestApp;

async fn json_of(response: reqwest::Response) -> (StatusCode, String) {
    let status = response.status();
    (status, response.text().await.expect("body"))
}

async fn a_hidden_experiments_name_is_taken_and_nothing_more_is_said(app: &TestApp) {
    add_user(app, "alice", false).await;
    add_user(app, "bob", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    let create = |who: &Auth, name: &str| {
        let body = json!({ "name": name });
        let who = who.clone();
        async move { send(app, &who, Method::POST, "/api/v1/experiments", Some(&body)).await }
    };
    let created = create(&alice, "zeta-secret").await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let hidden: Value = created.json().await.expect("json");
    let hidden_id = hidden["id"].as_str().expect("id").to_owned();

    // Names are unique on the server, as MLflow's are: a taken name answers 409...
    let (status, body) = json_of(create(&bob, "zeta-secret").await).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let error: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(error["error"]["field"], "name", "{body}");
    // ...and a free one is created.
    let (status, free) = json_of(create(&bob, "bobs-own").await).await;
    assert_eq!(status, StatusCode::CREATED, "{free}");
    // Renaming onto it, and MLflow's create, say the same and no more.
    let (rename_status, rename) = json_of(
        send(
            app,
            &bob,
            Method::PATCH,
            "/api/v1/experiments/bobs-own",
            Some(&json!({"name": "zeta-secret"})),
        )
        .await,
    )
    .await;
    assert_eq!(rename_status, StatusCode::CONFLICT, "{rename}");
    let (mlflow_status, mlflow) = json_of(
        send(
            app,
            &bob,
            Method::POST,
            "/api/2.0/mlflow/experiments/create",
            Some(&json!({"name": "zeta-secret"})),
        )
        .await,
    )
    .await;
    assert_eq!(mlflow_status, StatusCode::BAD_REQUEST, "{mlflow}");
    assert!(mlflow.contains("RESOURCE_ALREADY_EXISTS"), "{mlflow}");
    for answer in [&body, &rename, &mlflow] {
        assert!(!answer.contains(&hidden_id), "the id leaks: {answer}");
        assert!(!answer.contains("alice"), "the owner leaks: {answer}");
    }
    // Reading it by name answers like a name nobody has.
    let bob = &bob;
    let by_name = |name: &str| {
        let path = format!("/api/v1/experiments/{name}");
        async move { json_of(send(app, bob, Method::GET, &path, None).await).await }
    };
    let (hidden_status, hidden_body) = by_name("zeta-secret").await;
    let (missing_status, missing_body) = by_name("zeta-absent").await;
    assert_eq!(hidden_status, StatusCode::NOT_FOUND);
    assert_eq!(missing_status, StatusCode::NOT_FOUND);
    assert_eq!(
        hidden_body.replace("zeta-secret", "NAME"),
        missing_body.replace("zeta-absent", "NAME")
    );
}

async fn only_who_may_manage_grants_learns_whether_a_user_name_exists(app: &TestApp) {
    for name in ["alice", "bob", "carol", "dave"] {
        add_user(app, name, false).await;
    }
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    let dave = sign_in(app, "dave", PASSWORD).await;
    let created = send(
        app,
        &alice,
        Method::POST,
        "/api/v1/experiments",
        Some(&json!({"name": "shared"})),
    )
    .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let grant = |who: &Auth, user: &str, level: &str| {
        let who = who.clone();
        let body = json!({ "user": user, "level": level });
        async move {
            json_of(
                send(
                    app,
                    &who,
                    Method::PUT,
                    "/api/v1/experiments/shared/grants",
                    Some(&body),
                )
                .await,
            )
            .await
        }
    };
    assert_eq!(grant(&alice, "bob", "read").await.0, StatusCode::OK);

    // A reader (bob) and a stranger (dave) get one answer whether the user exists or not.
    for (who, want) in [
        (&bob, StatusCode::FORBIDDEN),
        (&dave, StatusCode::NOT_FOUND),
    ] {
        let existing = grant(who, "carol", "read").await;
        let unknown = grant(who, "nobody-such", "read").await;
        assert_eq!(existing.0, want, "{}", existing.1);
        assert_eq!(existing, unknown);
    }
    // The owner, who manages the grants, is told.
    assert_eq!(grant(&alice, "carol", "read").await.0, StatusCode::OK);
    let (status, body) = grant(&alice, "nobody-such", "read").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("no user named `nobody-such`"), "{body}");
}

crate::on_both_backends_with!(accounts;
    a_hidden_experiments_name_is_taken_and_nothing_more_is_said,
    only_who_may_manage_grants_learns_whether_a_user_name_exists,
);
