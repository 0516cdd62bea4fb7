//! Postgres keeps the series ids of recently written metrics in memory. The ids are hints:
//! a series that disappears behind the store's back (no API deletes one today) must not
//! receive points under its old id.

use crate::harness::TestDb;
use crate::metrics::pt;
use crate::runs::new_run;
use sqlx::Connection;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_series_removed_behind_the_store_is_created_again_on_the_next_write() {
    let db = TestDb::postgres().await;
    let store = db.store.clone();
    let id = new_run(&store, "cache").await;
    let first: Vec<_> = (0..100).map(|s| pt("loss", s, 1.0)).collect();
    store.append_points(&id, &first, 0).await.expect("first");
    // Cached now; a second batch takes the cached id.
    let second: Vec<_> = (100..200).map(|s| pt("loss", s, 2.0)).collect();
    store.append_points(&id, &second, 0).await.expect("second");

    let url = db.postgres_url().expect("a Postgres test database");
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    let old: i64 = sqlx::query_scalar("SELECT id FROM metric_series WHERE run_id = $1")
        .bind(&id)
        .fetch_one(&mut conn)
        .await
        .expect("series id");
    for sql in [
        "DELETE FROM metric_points WHERE series_id = $1",
        "DELETE FROM metric_rollups WHERE series_id = $1",
        "DELETE FROM metric_series WHERE id = $1",
    ] {
        sqlx::query(sql)
            .bind(old)
            .execute(&mut conn)
            .await
            .expect("delete");
    }

    let third: Vec<_> = (200..250).map(|s| pt("loss", s, 3.0)).collect();
    let stored = store
        .append_points(&id, &third, 0)
        .await
        .expect("third")
        .stored;
    assert_eq!(stored.len(), 50);
    let orphans: i64 =
        sqlx::query_scalar("SELECT count(*) FROM metric_points WHERE series_id = $1")
            .bind(old)
            .fetch_one(&mut conn)
            .await
            .expect("orphans");
    assert_eq!(orphans, 0, "no point went to the removed series");
    let keys = store.metric_keys(&id).await.expect("keys");
    assert_eq!(keys.len(), 1);
    assert_eq!((keys[0].count, keys[0].last_step), (50, 249));
    let series = store
        .read_series(&id, "loss", None, None, 1_000)
        .await
        .expect("read");
    assert_eq!(series.total, 50);
    assert!(series.points.iter().all(|p| p.value == 3.0));
    // And the new id is used (and cached) from here on.
    let fourth: Vec<_> = (250..300).map(|s| pt("loss", s, 4.0)).collect();
    store.append_points(&id, &fourth, 0).await.expect("fourth");
    let keys = store.metric_keys(&id).await.expect("keys");
    assert_eq!((keys[0].count, keys[0].last_step), (100, 299));
    let _ = conn.close().await;
}
