//! Accounts and access control, black-box: a server with accounts on, users with each role on
//! one experiment, and what each of them gets from every route.

mod cli;
mod hidden_keys;
mod launch_roots;
mod matrix;
mod names;
mod revocation;
mod secrets;
mod sessions;
mod shared_default;
mod sign_in_next;
mod tokens;
mod upgrade;
mod visibility;

use reqwest::header::{CONTENT_TYPE, COOKIE};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::{json, Value};
use trainyard::app::Settings;

use crate::helpers::TestApp;

pub const ADMIN_TOKEN: &str = "admin-bootstrap-secret";
pub const PASSWORD: &str = "correct horse battery";

/// Accounts on, with the admin token as the bootstrap credential.
pub fn accounts(s: &mut Settings) {
    s.auth = true;
    s.admin_token = Some(ADMIN_TOKEN.into());
}

/// How a caller authenticates.
#[derive(Clone, Debug)]
pub enum Auth {
    Nobody,
    Bearer(String),
    /// A browser session: the cookie, and the CSRF token its writes echo.
    Session {
        cookie: String,
        csrf: String,
    },
}

impl Auth {
    pub fn apply(&self, request: RequestBuilder) -> RequestBuilder {
        match self {
            Auth::Nobody => request,
            Auth::Bearer(token) => request.bearer_auth(token),
            Auth::Session { cookie, csrf } => request
                .header(COOKIE, cookie.as_str())
                .header("x-csrf-token", csrf.as_str()),
        }
    }
}

/// A client that does not follow redirects (a page answering "sign in first" is a 303).
pub fn raw_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .expect("client")
}

pub async fn send(
    app: &TestApp,
    auth: &Auth,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Response {
    let mut request = raw_client().request(method, app.url(path));
    if let Some(body) = body {
        request = request
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string());
    }
    auth.apply(request).send().await.expect("request")
}

pub async fn admin(app: &TestApp, method: Method, path: &str, body: Value) -> Value {
    let response = send(
        app,
        &Auth::Bearer(ADMIN_TOKEN.into()),
        method,
        path,
        Some(&body),
    )
    .await;
    let status = response.status();
    let text = response.text().await.expect("body");
    assert!(status.is_success(), "{path}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

pub async fn add_user(app: &TestApp, name: &str, is_admin: bool) {
    admin(
        app,
        Method::POST,
        "/api/v1/users",
        json!({"name": name, "password": PASSWORD, "admin": is_admin}),
    )
    .await;
}

/// Signs in through the API and returns the session (cookie and CSRF token).
pub async fn sign_in(app: &TestApp, name: &str, password: &str) -> Auth {
    let response = send(
        app,
        &Auth::Nobody,
        Method::POST,
        "/api/v1/session",
        Some(&json!({"name": name, "password": password})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK, "sign-in of {name}");
    let cookie = response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .expect("session cookie")
        .to_owned();
    let body: Value = response.json().await.expect("json");
    Auth::Session {
        cookie,
        csrf: body["csrf_token"].as_str().expect("csrf").to_owned(),
    }
}
