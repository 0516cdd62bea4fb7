//! Where signing in sends the browser: `next` only ever leads to a path on this server, and no
//! `next` makes the sign-in page or its form fail.

use reqwest::StatusCode;

use super::{accounts, add_user, raw_client, PASSWORD};
use crate::helpers::TestApp;

/// Values a browser would read as another host (or that broke the sign-in before).
const HOSTILE: &[&str] = &[
    "//evil.example/x",
    "/\t/evil.example/x",
    "/\n/evil.example/x",
    "/\r/evil.example/x",
    "/\\evil.example/x",
    "\\/evil.example/x",
    " //evil.example/x",
    "https://evil.example/x",
    "javascript:alert(1)",
    "/%09/evil.example/x",
    "/%2F/evil.example/x",
    "/%5Cevil.example/x",
    "/%252F%252Fevil.example/x",
    "/runs\u{0}",
];

fn hidden_next(page: &str) -> Option<&str> {
    let (_, rest) = page.split_once("name=\"next\" value=\"")?;
    rest.split_once('"').map(|(value, _)| value)
}

async fn a_hostile_next_leads_home_and_never_fails(app: &TestApp) {
    add_user(app, "alice", false).await;
    let client = raw_client();

    // The very URL of the report, sent as it was written.
    let page = client
        .get(app.url("/sign-in?next=/%09/evil.example/x"))
        .send()
        .await
        .expect("get");
    assert_eq!(page.status(), StatusCode::OK);
    let text = page.text().await.expect("body");
    assert_eq!(hidden_next(&text), Some("/"), "{text}");

    for (i, next) in HOSTILE.iter().enumerate() {
        let page = client
            .get(app.url("/sign-in"))
            .query(&[("next", next)])
            .send()
            .await
            .expect("get");
        let status = page.status();
        // NUL in a query parameter is refused before any page (400 naming it); all else is
        // the sign-in page with the root as its `next`.
        if next.contains('\0') {
            assert_eq!(status, StatusCode::BAD_REQUEST, "{next:?}");
        } else {
            assert_eq!(status, StatusCode::OK, "{next:?}");
            let text = page.text().await.expect("body");
            assert_eq!(hidden_next(&text), Some("/"), "{next:?}");
        }

        let signed_in = client
            .post(app.url("/sign-in"))
            .form(&[("name", "alice"), ("password", PASSWORD), ("next", next)])
            .send()
            .await
            .expect("post");
        // NUL in a form field, too, is refused at the edge for every body (422 naming it).
        if next.contains('\0') {
            assert_eq!(
                signed_in.status(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "{next:?}"
            );
            continue;
        }
        assert_eq!(signed_in.status(), StatusCode::SEE_OTHER, "{next:?}");
        assert_eq!(signed_in.headers()["location"], "/", "{next:?}");

        // A name of its own each time: five failures of one name are throttled.
        let nobody = format!("nobody-{i}");
        let wrong = client
            .post(app.url("/sign-in"))
            .form(&[
                ("name", nobody.as_str()),
                ("password", "wrong password"),
                ("next", next),
            ])
            .send()
            .await
            .expect("post");
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{next:?}");
        let text = wrong.text().await.expect("body");
        assert_eq!(hidden_next(&text), Some("/"), "{next:?}");
    }

    // A path on this server is where the browser goes.
    let kept = client
        .post(app.url("/sign-in"))
        .form(&[
            ("name", "alice"),
            ("password", PASSWORD),
            ("next", "/runs?filter=params.lr%3E0.1"),
        ])
        .send()
        .await
        .expect("post");
    assert_eq!(kept.status(), StatusCode::SEE_OTHER);
    assert_eq!(kept.headers()["location"], "/runs?filter=params.lr%3E0.1");
}

crate::on_both_backends_with!(accounts;
    a_hostile_next_leads_home_and_never_fails,
);
