//! Live catch-up (`points_since`) finds a run's points through the store's record of its
//! writes, not through an index on every point's seq: whatever mix of writes a run had, paging
//! from any position returns every later point of that run exactly once, in seq order.

use std::collections::BTreeMap;

use trainyard::store::{DynStore, StoredPoint};

use crate::harness::TestDb;
use crate::metrics::pt;
use crate::runs::new_run;

/// Writes a mix to `id` (one-step trainer batches, a large batch, a late batch filling gaps
/// of stored steps, a resent batch, a batch mixing new and stored points) with another run
/// written in between; returns every point stored for `id`, by seq.
async fn write_a_mix(store: &DynStore, id: &str, other: &str) -> BTreeMap<i64, StoredPoint> {
    let mut stored = BTreeMap::new();
    let mut keep = |points: Vec<StoredPoint>| {
        for p in points {
            assert!(
                stored.insert(p.seq, p).is_none(),
                "a seq was handed out twice"
            );
        }
    };
    for step in 0..40 {
        let batch = [
            pt("loss", step, 1.0),
            pt("lr", step, 0.1),
            pt("grad", step, 2.0),
        ];
        keep(
            store
                .append_points(id, &batch, 0)
                .await
                .expect("small")
                .stored,
        );
        let noise = [pt("loss", step, 5.0)];
        store.append_points(other, &noise, 0).await.expect("other");
    }
    let big: Vec<_> = (0..300)
        .flat_map(|i| [pt("loss", 100 + 2 * i, 0.5), pt("val", 100 + 2 * i, 0.7)])
        .collect();
    keep(store.append_points(id, &big, 0).await.expect("big").stored);
    // Odd steps inside the big batch's range: new points among stored ones.
    let late: Vec<_> = (0..50).map(|i| pt("loss", 101 + 2 * i, 0.4)).collect();
    keep(
        store
            .append_points(id, &late, 0)
            .await
            .expect("late")
            .stored,
    );
    let resent = store.append_points(id, &late, 0).await.expect("resent");
    assert!(resent.stored.is_empty(), "a resent batch stores nothing");
    let mixed: Vec<_> = (30..50).map(|s| pt("grad", s, 2.0)).collect();
    keep(
        store
            .append_points(id, &mixed, 0)
            .await
            .expect("mixed")
            .stored,
    );
    stored
}

/// Every page of `limit` from `after` until the store has no more.
async fn page_through(
    store: &DynStore,
    id: &str,
    after: Option<i64>,
    limit: usize,
) -> Vec<StoredPoint> {
    let (mut out, mut position) = (Vec::new(), after);
    loop {
        let page = store
            .points_since(id, position, None, limit)
            .await
            .expect("page");
        assert!(page.len() <= limit, "a page holds at most its limit");
        let done = page.len() < limit;
        position = page.last().map(|p| p.seq).or(position);
        out.extend(page);
        if done {
            return out;
        }
    }
}

pub async fn catching_up_from_any_position_returns_every_later_point_once_in_seq_order(
    store: DynStore,
) {
    let id = new_run(&store, "catch-up").await;
    let other = new_run(&store, "beside").await;
    let stored = write_a_mix(&store, &id, &other).await;
    let all: Vec<StoredPoint> = stored.values().cloned().collect();
    assert_eq!(all.len(), 40 * 3 + 600 + 50 + 10);

    for limit in [1, 7, 1_000, 100_000] {
        assert_eq!(
            page_through(&store, &id, None, limit).await,
            all,
            "limit {limit}"
        );
    }
    for (i, p) in all.iter().enumerate().step_by(37) {
        let rest = page_through(&store, &id, Some(p.seq), 50).await;
        assert_eq!(rest, all[i + 1..], "after seq {}", p.seq);
    }
    let last = all.last().expect("points").seq;
    assert!(store
        .points_since(&id, Some(last), None, 10)
        .await
        .expect("at the end")
        .is_empty());
    for after_step in [-1, 39, 150, 10_000] {
        let by_step = store
            .points_since(&id, None, Some(after_step), 100_000)
            .await
            .expect("by step");
        let expected: Vec<_> = all
            .iter()
            .filter(|p| p.step > after_step)
            .cloned()
            .collect();
        assert_eq!(by_step, expected, "after step {after_step}");
    }
    // The other run's points are its own, numbered apart.
    let beside = page_through(&store, &other, None, 16).await;
    assert_eq!(beside.len(), 40);
    assert!(beside.iter().all(|p| p.value == 5.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_deleting_a_run_deletes_its_points_and_rollups() {
    use sqlx::Connection;
    let db = TestDb::postgres().await;
    let store = db.store.clone();
    let id = new_run(&store, "doomed").await;
    let kept = new_run(&store, "kept").await;
    for run in [&id, &kept] {
        let batch: Vec<_> = (0..200).map(|s| pt("loss", s, 1.0)).collect();
        store.append_points(run, &batch, 0).await.expect("points");
    }
    let url = db.postgres_url().expect("a Postgres test database");
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    let mut series = Vec::new();
    for run in [&id, &kept] {
        let sid: i64 = sqlx::query_scalar("SELECT id FROM metric_series WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut conn)
            .await
            .expect("series");
        series.push(sid);
    }
    let rows = async |conn: &mut sqlx::PgConnection, sid: i64| -> [i64; 2] {
        let mut counts = [0; 2];
        for (count, table) in counts.iter_mut().zip(["metric_points", "metric_rollups"]) {
            *count = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM {table} WHERE series_id = $1"
            ))
            .bind(sid)
            .fetch_one(&mut *conn)
            .await
            .expect("count");
        }
        counts
    };
    let kept_before = rows(&mut conn, series[1]).await;
    assert_eq!(kept_before[0], 200);
    assert!(kept_before[1] > 0);
    store.delete_run(&id).await.expect("delete");
    assert_eq!(
        rows(&mut conn, series[0]).await,
        [0, 0],
        "no point or rollup is left"
    );
    assert_eq!(
        rows(&mut conn, series[1]).await,
        kept_before,
        "the other run keeps its own"
    );
    let _ = conn.close().await;
}
