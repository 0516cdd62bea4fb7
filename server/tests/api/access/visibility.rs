//! What a user may not read is not there for them: searches filter in the query (pages stay
//! full), the global event stream leaves other experiments' runs out, a hidden run answers like
//! a missing one, and runs record who created them.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{accounts, add_user, admin, send, sign_in, Auth, PASSWORD};
use crate::helpers::{SseClient, TestApp};

async fn create_runs(app: &TestApp, who: &Auth, experiment: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let r = send(
            app,
            who,
            Method::POST,
            "/api/v1/runs",
            Some(&json!({"experiment": experiment})),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let run: Value = r.json().await.expect("run");
        ids.push(run["id"].as_str().expect("id").to_owned());
    }
    ids
}

async fn walk(app: &TestApp, who: &Auth, query: &str) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/api/v1/runs?limit=2{query}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let r = send(app, who, Method::GET, &path, None).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let page: Value = r.json().await.expect("page");
        pages.push(
            page["runs"]
                .as_array()
                .expect("runs")
                .iter()
                .map(|r| r["id"].as_str().expect("id").to_owned())
                .collect(),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return pages,
        }
    }
}

async fn a_search_shows_only_readable_runs_in_full_pages(app: &TestApp) {
    add_user(app, "alice", false).await;
    add_user(app, "bob", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    // Interleaved, so hidden rows sit between visible ones in every sort order.
    let mut alices = Vec::new();
    let mut bobs = Vec::new();
    for _ in 0..3 {
        alices.extend(create_runs(app, &alice, "alice-private", 1).await);
        bobs.extend(create_runs(app, &bob, "bob-private", 1).await);
    }
    let pages = walk(app, &bob, "").await;
    let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![2, 1], "pages of bob's search: {pages:?}");
    let seen: Vec<String> = pages.concat();
    let mut expected = bobs.clone();
    expected.reverse();
    assert_eq!(seen, expected);

    let everything = walk(app, &Auth::Bearer(super::ADMIN_TOKEN.into()), "")
        .await
        .concat();
    assert_eq!(everything.len(), 6);
    let by_alice = walk(
        app,
        &Auth::Bearer(super::ADMIN_TOKEN.into()),
        "&q=user%20%3D%20%27alice%27",
    )
    .await
    .concat();
    let mut sorted = by_alice.clone();
    sorted.sort();
    let mut want = alices.clone();
    want.sort();
    assert_eq!(sorted, want, "user = 'alice'");

    let experiments: Value = send(app, &bob, Method::GET, "/api/v1/experiments", None)
        .await
        .json()
        .await
        .expect("json");
    let names: Vec<&str> = experiments["experiments"]
        .as_array()
        .expect("list")
        .iter()
        .map(|e| e["name"].as_str().expect("name"))
        .collect();
    assert!(
        names.contains(&"bob-private") && !names.contains(&"alice-private"),
        "{names:?}"
    );
}

async fn a_hidden_run_answers_exactly_like_a_missing_one(app: &TestApp) {
    add_user(app, "alice", false).await;
    add_user(app, "bob", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    let id = create_runs(app, &alice, "alice-private", 1).await.remove(0);
    let missing = "0123456789abcdef0123456789abcdef";
    for path in ["", "/metrics?key=loss", "/logs", "/checkpoints"] {
        let hidden = send(
            app,
            &bob,
            Method::GET,
            &format!("/api/v1/runs/{id}{path}"),
            None,
        )
        .await;
        let absent = send(
            app,
            &bob,
            Method::GET,
            &format!("/api/v1/runs/{missing}{path}"),
            None,
        )
        .await;
        assert_eq!(hidden.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(absent.status(), StatusCode::NOT_FOUND, "{path}");
        let hidden = hidden.text().await.expect("body").replace(&id, "ID");
        let absent = absent.text().await.expect("body").replace(missing, "ID");
        assert_eq!(hidden, absent, "{path}");
    }
    // A grant makes it visible; taking the grant back hides it again.
    let grant = |level: &str| json!({"user": "bob", "level": level});
    let exp = "alice-private";
    let r = send(
        app,
        &alice,
        Method::PUT,
        &format!("/api/v1/experiments/{exp}/grants"),
        Some(&grant("read")),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        send(app, &bob, Method::GET, &format!("/api/v1/runs/{id}"), None)
            .await
            .status(),
        StatusCode::OK
    );
    send(
        app,
        &alice,
        Method::PUT,
        &format!("/api/v1/experiments/{exp}/grants"),
        Some(&grant("none")),
    )
    .await;
    assert_eq!(
        send(app, &bob, Method::GET, &format!("/api/v1/runs/{id}"), None)
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
}

async fn the_global_stream_carries_only_readable_runs(app: &TestApp) {
    add_user(app, "alice", false).await;
    add_user(app, "bob", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    let hidden = create_runs(app, &alice, "alice-private", 1).await.remove(0);
    let visible = create_runs(app, &bob, "bob-private", 1).await.remove(0);
    let response = bob
        .apply(
            super::raw_client()
                .get(app.url("/api/v1/events"))
                .header("accept", "text/event-stream"),
        )
        .send()
        .await
        .expect("events");
    assert_eq!(response.status(), StatusCode::OK);
    let mut events = SseClient::from_response(response);
    for (who, id) in [(&alice, &hidden), (&bob, &visible)] {
        let r = send(
            app,
            who,
            Method::PATCH,
            &format!("/api/v1/runs/{id}"),
            Some(&json!({"status": "running"})),
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    // Events come in order: the first one bob gets must be his own run's.
    let event = events.next_event().await;
    assert_eq!(event.event, "status");
    assert_eq!(event.data["run_id"], visible.as_str());
}

async fn runs_record_their_creator_and_a_new_experiment_its_owner(app: &TestApp) {
    add_user(app, "alice", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let id = create_runs(app, &alice, "mine", 1).await.remove(0);
    let run = admin(app, Method::GET, &format!("/api/v1/runs/{id}"), json!({})).await;
    assert_eq!(run["created_by"], "alice");
    let table = send(app, &alice, Method::GET, "/", None)
        .await
        .text()
        .await
        .expect("page");
    assert!(
        table.contains(&format!("data-user-of=\"{id}\">by alice")),
        "{table}"
    );
    let sharing = admin(
        app,
        Method::GET,
        "/api/v1/experiments/mine/grants",
        json!({}),
    )
    .await;
    assert_eq!(sharing["owner"], "alice");
}

crate::on_both_backends_with!(accounts;
    a_search_shows_only_readable_runs_in_full_pages,
    a_hidden_run_answers_exactly_like_a_missing_one,
    the_global_stream_carries_only_readable_runs,
    runs_record_their_creator_and_a_new_experiment_its_owner,
);

fn accounts_sharing_by_default(s: &mut trainyard::app::Settings) {
    accounts(s);
    s.default_level = trainyard::store::accounts::Level::Read;
}

async fn the_default_level_lets_every_signed_in_user_read_new_experiments(app: &TestApp) {
    add_user(app, "alice", false).await;
    add_user(app, "bob", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    let id = create_runs(app, &alice, "open-lab", 1).await.remove(0);
    assert_eq!(
        send(app, &bob, Method::GET, &format!("/api/v1/runs/{id}"), None)
            .await
            .status(),
        StatusCode::OK
    );
    // Reading is not editing.
    let tag = json!({"tags": {"k": "v"}});
    let r = send(
        app,
        &bob,
        Method::PATCH,
        &format!("/api/v1/runs/{id}"),
        Some(&tag),
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Its owner can make it private again.
    let private = json!({"default_level": "none"});
    let r = send(
        app,
        &alice,
        Method::PATCH,
        "/api/v1/experiments/open-lab",
        Some(&private),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        send(app, &bob, Method::GET, &format!("/api/v1/runs/{id}"), None)
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
}

crate::on_both_backends_with!(accounts_sharing_by_default;
    the_default_level_lets_every_signed_in_user_read_new_experiments,
);

async fn deleting_a_run_takes_manage_and_a_stopped_run(app: &TestApp) {
    add_user(app, "alice", false).await;
    add_user(app, "ed", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let ed = sign_in(app, "ed", PASSWORD).await;
    let ids = create_runs(app, &alice, "mine", 2).await;
    let grant = json!({"user": "ed", "level": "edit"});
    send(
        app,
        &alice,
        Method::PUT,
        "/api/v1/experiments/mine/grants",
        Some(&grant),
    )
    .await;
    let path = format!("/api/v1/runs/{}", ids[0]);
    assert_eq!(
        send(app, &ed, Method::DELETE, &path, None).await.status(),
        StatusCode::FORBIDDEN
    );
    let running = json!({"status": "running"});
    send(app, &alice, Method::PATCH, &path, Some(&running)).await;
    let busy = send(app, &alice, Method::DELETE, &path, None).await;
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    let finished = json!({"status": "finished"});
    send(app, &alice, Method::PATCH, &path, Some(&finished)).await;
    assert_eq!(
        send(app, &alice, Method::DELETE, &path, None)
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        send(app, &alice, Method::GET, &path, None).await.status(),
        StatusCode::NOT_FOUND
    );
    // The other run is untouched; the deletion is in the audit log.
    let other = format!("/api/v1/runs/{}", ids[1]);
    assert_eq!(
        send(app, &alice, Method::GET, &other, None).await.status(),
        StatusCode::OK
    );
    let log = admin(
        app,
        Method::GET,
        "/api/v1/audit?action=run_delete",
        json!({}),
    )
    .await;
    assert_eq!(log["entries"][0]["target"], ids[0].as_str());
    assert_eq!(log["entries"][0]["actor"], "alice");
}

crate::on_both_backends_with!(accounts;
    deleting_a_run_takes_manage_and_a_stopped_run,
);

/// Sweeps follow their experiment: the list leaves out sweeps of experiments the caller may not
/// read, naming such an experiment is "not found", and its sweep answers like a missing one.
async fn a_sweep_is_listed_and_readable_only_where_its_experiment_is(app: &TestApp) {
    add_user(app, "alice", false).await;
    add_user(app, "bob", false).await;
    let alice = sign_in(app, "alice", PASSWORD).await;
    let bob = sign_in(app, "bob", PASSWORD).await;
    create_runs(app, &alice, "alices", 1).await;
    create_runs(app, &bob, "bobs", 1).await;
    let store = &app.state.store;
    let mut ids = Vec::new();
    for (owner, experiment) in [("alice", "alices"), ("bob", "bobs")] {
        let user = store
            .user_by_name(owner)
            .await
            .expect("user")
            .expect("exists");
        let experiment = store.get_experiment(experiment).await.expect("experiment");
        let spec = json!({"name": format!("{owner}-sweep"), "base": {"command": "true"},
            "method": "random", "metric": {"name": "loss"}, "max_trials": 1,
            "parameters": {"x": {"values": [1]}}});
        let sweep = store
            .create_sweep(
                &experiment.id,
                &format!("{owner}-sweep"),
                &spec,
                Some(&user.id),
            )
            .await
            .expect("sweep");
        ids.push(sweep.id);
    }
    let names = |list: &Value| -> Vec<String> {
        list["sweeps"]
            .as_array()
            .expect("sweeps")
            .iter()
            .map(|s| s["name"].as_str().expect("name").to_owned())
            .collect()
    };
    let r = send(app, &bob, Method::GET, "/api/v1/sweeps", None).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(names(&r.json().await.expect("list")), vec!["bob-sweep"]);
    let r = send(app, &alice, Method::GET, "/api/v1/sweeps", None).await;
    assert_eq!(names(&r.json().await.expect("list")), vec!["alice-sweep"]);
    let r = send(
        app,
        &bob,
        Method::GET,
        "/api/v1/sweeps?experiment=alices",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = send(
        app,
        &bob,
        Method::GET,
        &format!("/api/v1/sweeps/{}", ids[0]),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let hidden: Value = r.json().await.expect("error");
    let r = send(
        app,
        &bob,
        Method::GET,
        &format!("/api/v1/sweeps/{}", "f".repeat(32)),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let missing: Value = r.json().await.expect("error");
    assert_eq!(
        hidden["error"]["message"]
            .as_str()
            .map(|m| m.replace(&ids[0], "ID")),
        missing["error"]["message"]
            .as_str()
            .map(|m| m.replace(&"f".repeat(32), "ID")),
        "a hidden sweep answers like a missing one"
    );
}

crate::on_both_backends_with!(accounts;
    a_sweep_is_listed_and_readable_only_where_its_experiment_is,
);
