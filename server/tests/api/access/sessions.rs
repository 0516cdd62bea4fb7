//! Signing in and out: the session cookie, sign-out, sessions ended by a password change or a
//! disabled user, throttled guessing, the CSRF token on cookie writes, and no secret in any
//! response or log line.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{accounts, add_user, admin, send, sign_in, Auth, ADMIN_TOKEN, PASSWORD};
use crate::helpers::TestApp;

async fn whoami(app: &TestApp, auth: &Auth) -> Value {
    let r = send(app, auth, Method::GET, "/api/v1/session", None).await;
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.expect("json")
}

async fn reads(app: &TestApp, auth: &Auth) -> StatusCode {
    send(app, auth, Method::GET, "/api/v1/runs", None)
        .await
        .status()
}

async fn sign_in_sets_a_locked_down_cookie_and_sign_out_ends_the_session(app: &TestApp) {
    add_user(app, "alice", false).await;
    let response = send(
        app,
        &Auth::Nobody,
        Method::POST,
        "/api/v1/session",
        Some(&json!({"name": "alice", "password": PASSWORD})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(cookie.starts_with("trainyard_session="), "{cookie}");
    for attribute in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(cookie.contains(attribute), "{attribute} missing: {cookie}");
    }
    assert!(
        !cookie.contains("Secure"),
        "a plain-http server cannot set Secure: {cookie}"
    );
    let body = response.text().await.expect("body");
    assert!(!body.contains(PASSWORD));

    let session = sign_in(app, "alice", PASSWORD).await;
    assert_eq!(whoami(app, &session).await["user"]["name"], "alice");
    assert_eq!(reads(app, &session).await, StatusCode::OK);
    let out = send(app, &session, Method::DELETE, "/api/v1/session", None).await;
    assert_eq!(out.status(), StatusCode::NO_CONTENT);
    assert!(out.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .contains("Max-Age=0"));
    assert_eq!(reads(app, &session).await, StatusCode::UNAUTHORIZED);
    assert_eq!(whoami(app, &session).await["user"], Value::Null);
}

async fn a_wrong_password_and_an_unknown_user_get_the_same_answer(app: &TestApp) {
    add_user(app, "alice", false).await;
    let mut answers = Vec::new();
    for (name, password) in [("alice", "not the password"), ("nobody", PASSWORD)] {
        let r = send(
            app,
            &Auth::Nobody,
            Method::POST,
            "/api/v1/session",
            Some(&json!({"name": name, "password": password})),
        )
        .await;
        answers.push((r.status(), r.text().await.expect("body")));
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0].0, StatusCode::UNAUTHORIZED);
}

async fn changing_a_password_or_disabling_a_user_ends_their_sessions(app: &TestApp) {
    add_user(app, "rita", false).await;
    let first = sign_in(app, "rita", PASSWORD).await;
    let second = sign_in(app, "rita", PASSWORD).await;
    admin(
        app,
        Method::PATCH,
        "/api/v1/users/rita",
        json!({"password": "a new long password"}),
    )
    .await;
    assert_eq!(reads(app, &first).await, StatusCode::UNAUTHORIZED);
    assert_eq!(reads(app, &second).await, StatusCode::UNAUTHORIZED);
    let old = send(
        app,
        &Auth::Nobody,
        Method::POST,
        "/api/v1/session",
        Some(&json!({"name": "rita", "password": PASSWORD})),
    )
    .await;
    assert_eq!(old.status(), StatusCode::UNAUTHORIZED);

    let fresh = sign_in(app, "rita", "a new long password").await;
    assert_eq!(reads(app, &fresh).await, StatusCode::OK);
    admin(
        app,
        Method::PATCH,
        "/api/v1/users/rita",
        json!({"disabled": true}),
    )
    .await;
    assert_eq!(reads(app, &fresh).await, StatusCode::UNAUTHORIZED);
    let refused = send(
        app,
        &Auth::Nobody,
        Method::POST,
        "/api/v1/session",
        Some(&json!({"name": "rita", "password": "a new long password"})),
    )
    .await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
}

async fn repeated_failed_sign_ins_are_throttled_with_retry_after(app: &TestApp) {
    add_user(app, "alice", false).await;
    for attempt in 0..trainyard::access::throttle::PER_USER {
        let r = send(
            app,
            &Auth::Nobody,
            Method::POST,
            "/api/v1/session",
            Some(&json!({"name": "alice", "password": format!("guess {attempt}")})),
        )
        .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "attempt {attempt}");
    }
    // Now even the right password waits: the guesser learns nothing from it.
    let r = send(
        app,
        &Auth::Nobody,
        Method::POST,
        "/api/v1/session",
        Some(&json!({"name": "alice", "password": PASSWORD})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!(wait >= 1);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "too_many_requests");
    // The audit log has the failures, for an administrator to see.
    let log = admin(
        app,
        Method::GET,
        "/api/v1/audit?action=sign_in_failed",
        json!({}),
    )
    .await;
    assert_eq!(log["entries"].as_array().expect("entries").len(), 5);
    assert_eq!(log["entries"][0]["actor"], "alice");
}

async fn a_cookie_write_needs_the_sessions_csrf_token(app: &TestApp) {
    add_user(app, "alice", false).await;
    let session = sign_in(app, "alice", PASSWORD).await;
    let Auth::Session { cookie, csrf } = &session else {
        unreachable!()
    };
    let body = json!({"experiment": "mine"}).to_string();
    let url = app.url("/api/v1/runs");
    let client = super::raw_client();
    let post = |token: Option<&str>| {
        let mut r = client
            .post(&url)
            .header("cookie", cookie.as_str())
            .header("content-type", "application/json")
            .body(body.clone());
        if let Some(t) = token {
            r = r.header("x-csrf-token", t);
        }
        r.send()
    };
    assert_eq!(
        post(None).await.expect("post").status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        post(Some("forged")).await.expect("post").status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        post(Some(csrf)).await.expect("post").status(),
        StatusCode::CREATED
    );
    // From another site, even with the token, a write is refused.
    let cross = client
        .post(&url)
        .header("cookie", cookie.as_str())
        .header("x-csrf-token", csrf.as_str())
        .header("origin", "https://evil.example")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("post");
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
}

async fn a_page_asks_an_anonymous_browser_to_sign_in_and_brings_it_back(app: &TestApp) {
    add_user(app, "alice", false).await;
    let client = super::raw_client();
    let r = client
        .get(app.url("/compare?runs=x"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/sign-in?next=/compare%3Fruns%3Dx");
    let form = client
        .post(app.url("/sign-in"))
        .form(&[
            ("name", "alice"),
            ("password", PASSWORD),
            ("next", "/compare?runs=x"),
        ])
        .send()
        .await
        .expect("post");
    assert_eq!(form.status(), StatusCode::SEE_OTHER);
    assert_eq!(form.headers()["location"], "/compare?runs=x");
    // A `next` that leaves the server is not followed.
    let away = client
        .post(app.url("/sign-in"))
        .form(&[
            ("name", "alice"),
            ("password", PASSWORD),
            ("next", "//evil.example/"),
        ])
        .send()
        .await
        .expect("post");
    assert_eq!(away.headers()["location"], "/");
    let wrong = client
        .post(app.url("/sign-in"))
        .form(&[("name", "alice"), ("password", "nope nope nope")])
        .send()
        .await
        .expect("post");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong
        .text()
        .await
        .expect("body")
        .contains("Wrong user name or password"));
}

crate::on_both_backends_with!(accounts;
    sign_in_sets_a_locked_down_cookie_and_sign_out_ends_the_session,
    a_wrong_password_and_an_unknown_user_get_the_same_answer,
    changing_a_password_or_disabling_a_user_ends_their_sessions,
    repeated_failed_sign_ins_are_throttled_with_retry_after,
    a_cookie_write_needs_the_sessions_csrf_token,
    a_page_asks_an_anonymous_browser_to_sign_in_and_brings_it_back,
);

#[cfg(unix)]
#[test]
fn no_password_or_token_secret_reaches_a_log_line() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["serve", "--auth", "--addr", "127.0.0.1:0"])
        .env("TRAINYARD_DATA_DIR", dir.path())
        .env("TRAINYARD_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "trace,hyper=info,h2=info,sqlx=debug")
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start");
    let mut stderr = child.stderr.take().expect("stderr");
    let mut stdout = child.stdout.take().expect("stdout");
    // Read the logs on threads, so the server never blocks on a full pipe.
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    let err_reader = std::thread::spawn(move || {
        let mut all = String::new();
        let mut buf = [0u8; 4096];
        let mut sent = false;
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.push_str(&String::from_utf8_lossy(&buf[..n]));
            if !sent {
                if let Some(port) = crate::kit::listening_port(&all) {
                    let _ = port_tx.send(port);
                    sent = true;
                }
            }
        }
        all
    });
    let port = port_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the server says where it listens");
    let base = format!("http://127.0.0.1:{port}");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let secrets = rt.block_on(async {
        let client = super::raw_client();
        let password = "log-canary-password-42";
        let wrong = "log-canary-wrong-password";
        let add = client
            .post(format!("{base}/api/v1/users"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"name": "alice", "password": password}))
            .send()
            .await
            .expect("add");
        assert_eq!(add.status(), StatusCode::CREATED);
        let mut bodies = add.text().await.expect("body");
        let failed = client
            .post(format!("{base}/api/v1/session"))
            .json(&json!({"name": "alice", "password": wrong}))
            .send()
            .await
            .expect("sign in");
        bodies.push_str(&failed.text().await.expect("body"));
        let ok = client
            .post(format!("{base}/api/v1/session"))
            .json(&json!({"name": "alice", "password": password}))
            .send()
            .await
            .expect("sign in");
        let cookie = ok.headers()["set-cookie"]
            .to_str()
            .expect("ascii")
            .to_owned();
        let session_secret = cookie
            .split(';')
            .next()
            .and_then(|c| c.split_once('='))
            .map(|(_, v)| v.to_owned())
            .expect("cookie value");
        let me: Value = ok.json().await.expect("json");
        let csrf = me["csrf_token"].as_str().expect("csrf").to_owned();
        let token = client
            .post(format!("{base}/api/v1/tokens"))
            .header("cookie", format!("trainyard_session={session_secret}"))
            .header("x-csrf-token", &csrf)
            .json(&json!({"name": "laptop"}))
            .send()
            .await
            .expect("token");
        assert_eq!(token.status(), StatusCode::CREATED);
        let token: Value = token.json().await.expect("json");
        let secret = token["secret"].as_str().expect("secret").to_owned();
        let listed = client
            .get(format!("{base}/api/v1/tokens"))
            .bearer_auth(&secret)
            .send()
            .await
            .expect("list")
            .text()
            .await
            .expect("body");
        assert!(
            !listed.contains(&secret),
            "a listing shows the secret: {listed}"
        );
        bodies.push_str(&listed);
        for s in [password, wrong] {
            assert!(
                !bodies.contains(s),
                "a response contains a password: {bodies}"
            );
        }
        vec![
            password.to_owned(),
            wrong.to_owned(),
            session_secret,
            secret,
            csrf,
            ADMIN_TOKEN.to_owned(),
        ]
    });
    // SAFETY: sending SIGTERM to our own child process.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let _ = child.wait();
    let logs = format!(
        "{}{}",
        err_reader.join().expect("stderr"),
        out_reader.join().expect("stdout")
    );
    assert!(
        logs.contains("/api/v1/session"),
        "the logs are too quiet to mean anything: {logs}"
    );
    for secret in secrets {
        assert!(
            !logs.contains(&secret),
            "a log line contains a secret ({} chars)",
            secret.len()
        );
    }
}

fn accounts_behind_https(s: &mut trainyard::app::Settings) {
    accounts(s);
    s.public_url = Some("https://trainyard.example".parse().expect("url"));
}

async fn behind_an_https_public_url_the_session_cookie_is_secure(app: &TestApp) {
    add_user(app, "alice", false).await;
    let response = send(
        app,
        &Auth::Nobody,
        Method::POST,
        "/api/v1/session",
        Some(&json!({"name": "alice", "password": PASSWORD})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(cookie.contains("; Secure"), "{cookie}");
}

crate::on_both_backends_with!(accounts_behind_https;
    behind_an_https_public_url_the_session_cookie_is_secure,
);
