//! A full disk on SQLite. SQLite's `max_page_count` makes the database file "full" at a chosen
//! size: a write past it fails with SQLITE_FULL on the same code paths as a full disk, without
//! filling a real one. A write that was not committed must never be acknowledged, the store must
//! take writes again once there is room, and every acknowledged write must survive a reopen.

use std::sync::Arc;

use sqlx::Connection;

use crate::harness::{app_over, call};
use trainyard::store::SqlStore;
use trainyard::store::{DynStore, MetricPoint, NewRun, RunUpdate, StoreError};

fn batch(key: &str, first_step: i64, n: i64) -> Vec<MetricPoint> {
    (first_step..first_step + n)
        .map(|step| MetricPoint {
            key: key.into(),
            step,
            value: step as f64 * 0.5,
            time: Some(1_000 + step),
        })
        .collect()
}

async fn page_count(url: &str) -> u64 {
    let mut conn = sqlx::SqliteConnection::connect(url)
        .await
        .expect("a connection of the test's own");
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(&mut conn)
        .await
        .expect("page count");
    let _ = conn.close().await;
    pages as u64
}

fn new_run(name: &str) -> NewRun {
    NewRun {
        experiment_id: "0".into(),
        name: Some(name.into()),
        ..Default::default()
    }
}

/// What the store said it stored.
#[derive(Default)]
struct Acknowledged {
    /// Steps of `loss` the store reported as newly stored.
    steps: Vec<i64>,
    runs: Vec<String>,
    notes: Option<String>,
}

struct Full {
    _dir: tempfile::TempDir,
    url: String,
    sqlite: Arc<SqlStore>,
    store: DynStore,
    run: String,
}

/// A store with one run, capped a few dozen pages above its current size.
async fn nearly_full_store() -> Full {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let sqlite = Arc::new(SqlStore::open(&url).await.expect("open"));
    let store: DynStore = sqlite.clone();
    let run = store.create_run(new_run("filling")).await.expect("run").id;
    let pages = page_count(&url).await;
    sqlite
        .set_page_limit(Some(pages + 40))
        .await
        .expect("page limit");
    Full {
        _dir: dir,
        url,
        sqlite,
        store,
        run,
    }
}

/// Posts 1,000-point batches until one is refused; returns the error and the next step.
async fn fill(full: &Full, acked: &mut Acknowledged) -> (StoreError, i64) {
    let mut step = 0;
    loop {
        assert!(step < 2_000_000, "the database never filled up");
        match full
            .store
            .append_points(&full.run, &batch("loss", step, 1_000), 0)
            .await
        {
            Ok(appended) => acked.steps.extend(appended.stored.iter().map(|p| p.step)),
            Err(e) => return (e, step),
        }
        step += 1_000;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_after_a_full_disk_every_acknowledged_write_survives_a_reopen() {
    let full = nearly_full_store().await;
    let store = &full.store;
    let mut acked = Acknowledged::default();
    let (err, mut step) = fill(&full, &mut acked).await;
    assert!(
        matches!(err, StoreError::StorageFull(_)),
        "a full database is reported as such, got {err:?}"
    );

    // Still full: a batch as big as the refused one is refused again, and every other kind of
    // write either fails or is stored for good (checked after the reopen).
    for round in 0..3 {
        // Big enough to need pages of its own: SQLite fails a one-row statement that finds no
        // room by rolling back the whole transaction, not just the statement.
        let note = format!("note {round} {}", "x".repeat(50_000));
        let update = RunUpdate {
            notes: Some(note.clone()),
            ..Default::default()
        };
        if let Ok(run) = store.update_run(&full.run, update).await {
            assert_eq!(run.notes, note, "an acknowledged update reads back");
            acked.notes = Some(note);
        }
        let refused = store
            .append_points(&full.run, &batch("loss", step, 1_000), 0)
            .await;
        assert!(
            refused.is_err(),
            "round {round}: a write the database has no room for was acknowledged"
        );
        if let Ok(run) = store.create_run(new_run(&format!("full-{round}"))).await {
            acked.runs.push(run.id);
        }
        if let Ok(stored) = store
            .append_points(&full.run, &batch("loss", step, 1), 0)
            .await
        {
            acked.steps.extend(stored.stored.iter().map(|p| p.step));
        }
        step += 1_000;
    }

    // Room again: writes go through without a restart.
    full.sqlite.set_page_limit(None).await.expect("lift limit");
    let stored = store
        .append_points(&full.run, &batch("loss", step, 1_000), 0)
        .await
        .expect("a write once there is room")
        .stored;
    assert_eq!(stored.len(), 1_000);
    acked.steps.extend(stored.iter().map(|p| p.step));
    let later = store
        .create_run(new_run("after"))
        .await
        .expect("a run once there is room");
    acked.runs.push(later.id);
    let update = RunUpdate {
        notes: Some("after".into()),
        ..Default::default()
    };
    store
        .update_run(&full.run, update)
        .await
        .expect("an update once there is room");
    acked.notes = Some("after".into());

    // Everything acknowledged is on disk.
    full.sqlite.close().await;
    let reopened = SqlStore::open(&full.url).await.expect("reopen");
    let series =
        trainyard::store::Store::read_series(&reopened, &full.run, "loss", None, None, 100_000)
            .await
            .expect("series");
    let mut on_disk: Vec<i64> = series.points.iter().map(|p| p.step).collect();
    on_disk.sort_unstable();
    acked.steps.sort_unstable();
    assert_eq!(
        on_disk.len(),
        acked.steps.len(),
        "points acknowledged vs stored"
    );
    assert_eq!(on_disk, acked.steps);
    for id in &acked.runs {
        trainyard::store::Store::get_run(&reopened, id)
            .await
            .unwrap_or_else(|e| panic!("acknowledged run {id} is gone: {e}"));
    }
    let run = trainyard::store::Store::get_run(&reopened, &full.run)
        .await
        .expect("run");
    assert_eq!(Some(run.notes), acked.notes);
}

fn points_body(first_step: i64, n: i64) -> serde_json::Value {
    let points: Vec<_> = batch("loss", first_step, n)
        .into_iter()
        .map(|p| serde_json::json!({"key": p.key, "step": p.step, "value": p.value}))
        .collect();
    serde_json::json!({ "points": points })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_full_disk_is_a_507_and_healthz_is_unhealthy_until_there_is_room() {
    let full = nearly_full_store().await;
    let app = app_over(full.store.clone(), full._dir.path());
    let (status, _, body) = call(&app, "GET", "/healthz", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ok");

    let metrics = format!("/api/v1/runs/{}/metrics", full.run);
    let mut step = 0;
    let refused = loop {
        assert!(step < 2_000_000, "the database never filled up");
        let (status, retry_after, body) =
            call(&app, "POST", &metrics, Some(points_body(step, 1_000))).await;
        step += 1_000;
        if status != 200 {
            break (status, retry_after, body);
        }
    };
    let (status, retry_after, body) = refused;
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["error"]["code"], "insufficient_storage", "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("disk space"), "{message}");
    assert!(retry_after.is_some(), "a 507 says when to retry");

    let (status, retry_after, body) = call(&app, "GET", "/healthz", None).await;
    assert_eq!(status, 503, "healthz while full: {body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert!(retry_after.is_some());
    // Asking again changes nothing while there is no room.
    let (status, _, _) = call(&app, "GET", "/healthz", None).await;
    assert_eq!(status, 503);
    let (status, _, body) = call(&app, "POST", &metrics, Some(points_body(step, 1_000))).await;
    assert_eq!(status, 507, "still full: {body}");
    let (status, _, body) = call(
        &app,
        "PATCH",
        &format!("/api/v1/runs/{}", full.run),
        Some(serde_json::json!({"notes": "x".repeat(200_000)})),
    )
    .await;
    assert_eq!(status, 507, "an update that needs room: {body}");

    full.sqlite.set_page_limit(None).await.expect("lift limit");
    let (status, _, body) = call(&app, "GET", "/healthz", None).await;
    assert_eq!(status, 200, "healthz once there is room: {body}");
    let (status, _, body) = call(&app, "POST", &metrics, Some(points_body(step, 1_000))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stored"], 1_000);
}
