//! Secrets at rest and in transit: the store keeps a session's CSRF token only as its hash,
//! and no response that carries a secret may be kept by a cache.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{accounts, add_user, raw_client, send, sign_in, Auth, PASSWORD};
use crate::helpers::TestApp;

/// Every text value of every row of the `sessions` table, read straight from the database.
async fn session_values(app: &TestApp) -> Vec<String> {
    use sqlx::{Connection, Row};
    let settings = &app.state.settings;
    let query = "SELECT * FROM sessions";
    let texts = |columns: usize, get: &dyn Fn(usize) -> Option<String>| {
        (0..columns).filter_map(get).collect::<Vec<_>>()
    };
    match settings.database_url.as_deref() {
        Some(url) if url.starts_with("postgres") => {
            let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
            let rows = sqlx::query(query).fetch_all(&mut conn).await.expect("rows");
            rows.iter()
                .flat_map(|r| texts(r.columns().len(), &|i| r.try_get::<String, _>(i).ok()))
                .collect()
        }
        _ => {
            let path = settings.data_dir.join("trainyard.db");
            let url = format!("sqlite://{}?mode=ro", path.display());
            let mut conn = sqlx::SqliteConnection::connect(&url)
                .await
                .expect("connect");
            let rows = sqlx::query(query).fetch_all(&mut conn).await.expect("rows");
            rows.iter()
                .flat_map(|r| texts(r.columns().len(), &|i| r.try_get::<String, _>(i).ok()))
                .collect()
        }
    }
}

async fn a_sessions_csrf_token_is_stored_only_as_its_hash(app: &TestApp) {
    use trainyard::access::secret::hash_secret;
    add_user(app, "alice", false).await;
    let session = sign_in(app, "alice", PASSWORD).await;
    let Auth::Session { cookie, csrf } = &session else {
        unreachable!()
    };
    let secret = cookie.split_once('=').map(|(_, v)| v).expect("cookie");
    let stored = session_values(app).await;
    assert!(!stored.is_empty());
    for value in &stored {
        assert!(
            !value.contains(&csrf[3..]),
            "CSRF token in clear: {stored:?}"
        );
        assert!(!value.contains(&secret[3..]), "cookie secret in clear");
    }
    assert!(stored.contains(&hash_secret(csrf)), "{stored:?}");
    assert!(stored.contains(&hash_secret(secret)), "{stored:?}");
    // Compared by its hash, the token still lets the session write; another does not.
    let write = |token: String| {
        let auth = Auth::Session {
            cookie: cookie.clone(),
            csrf: token,
        };
        async move {
            send(
                app,
                &auth,
                Method::POST,
                "/api/v1/experiments",
                Some(&json!({"name": format!("e-{}", uuid::Uuid::new_v4().simple())})),
            )
            .await
            .status()
        }
    };
    assert_eq!(write(csrf.clone()).await, StatusCode::CREATED);
    assert_eq!(write(hash_secret(csrf)).await, StatusCode::FORBIDDEN);
    assert_eq!(write(secret.to_owned()).await, StatusCode::FORBIDDEN);
}

fn cache_control(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("cache-control")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

async fn responses_that_carry_a_secret_are_never_cached(app: &TestApp) {
    add_user(app, "alice", false).await;
    let signed_in = send(
        app,
        &Auth::Nobody,
        Method::POST,
        "/api/v1/session",
        Some(&json!({"name": "alice", "password": PASSWORD})),
    )
    .await;
    assert_eq!(signed_in.status(), StatusCode::OK);
    assert_eq!(
        cache_control(&signed_in),
        "no-store",
        "POST /api/v1/session"
    );
    let session = sign_in(app, "alice", PASSWORD).await;
    let Auth::Session { cookie, csrf } = &session else {
        unreachable!()
    };

    let whoami = send(app, &session, Method::GET, "/api/v1/session", None).await;
    assert_eq!(cache_control(&whoami), "no-store", "GET /api/v1/session");

    let token = send(
        app,
        &session,
        Method::POST,
        "/api/v1/tokens",
        Some(&json!({"name": "laptop"})),
    )
    .await;
    assert_eq!(token.status(), StatusCode::CREATED);
    assert_eq!(cache_control(&token), "no-store", "POST /api/v1/tokens");
    let body: Value = token.json().await.expect("json");
    assert!(body["secret"].as_str().is_some());

    // The account page, and the page that shows a new token's secret once.
    let client = raw_client();
    let page = client
        .get(app.url("/account"))
        .header("cookie", cookie.as_str())
        .send()
        .await
        .expect("get");
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(cache_control(&page), "no-store", "GET /account");
    let shown = client
        .post(app.url("/account/tokens"))
        .header("cookie", cookie.as_str())
        .form(&[("name", "ci"), ("scope", "read"), ("csrf", csrf.as_str())])
        .send()
        .await
        .expect("post");
    assert_eq!(shown.status(), StatusCode::OK);
    assert_eq!(cache_control(&shown), "no-store", "POST /account/tokens");
    let text = shown.text().await.expect("page");
    assert!(
        text.replace(csrf.as_str(), "").contains("ty_"),
        "no new secret shown"
    );
}

crate::on_both_backends_with!(accounts;
    a_sessions_csrf_token_is_stored_only_as_its_hash,
    responses_that_carry_a_secret_are_never_cached,
);
