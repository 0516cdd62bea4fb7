use crate::runs::new_run;
use trainyard::store::{Conflict, DynStore, MetricPoint, StoreError};

pub fn pt(key: &str, step: i64, value: f64) -> MetricPoint {
    MetricPoint {
        key: key.into(),
        step,
        value,
        time: Some(1_000 + step),
    }
}

pub async fn a_resent_batch_stores_each_point_once_and_keeps_the_first_value(store: DynStore) {
    let id = new_run(&store, "retry").await;
    let batch: Vec<_> = (0..100).map(|s| pt("loss", s, s as f64)).collect();
    let stored = store
        .append_points(&id, &batch, 0)
        .await
        .expect("first")
        .stored;
    assert_eq!(stored.len(), 100);
    assert!(stored
        .windows(2)
        .all(|w| w[0].step < w[1].step && w[0].seq < w[1].seq));
    // The retry carries other values: the first ones stay.
    let retry: Vec<_> = (0..100).map(|s| pt("loss", s, -1.0)).collect();
    let again = store
        .append_points(&id, &retry, 0)
        .await
        .expect("retry")
        .stored;
    assert!(again.is_empty(), "nothing new in a resent batch");
    // A batch that repeats a step inside itself keeps its first value too.
    let dup = vec![pt("acc", 5, 0.5), pt("acc", 5, 0.9), pt("loss", 100, 100.0)];
    let stored = store.append_points(&id, &dup, 0).await.expect("dup").stored;
    assert_eq!(stored.len(), 2);
    let keys = store.metric_keys(&id).await.expect("keys");
    let loss = keys.iter().find(|k| k.key == "loss").expect("loss key");
    assert_eq!(loss.count, 101);
    let acc = keys.iter().find(|k| k.key == "acc").expect("acc key");
    assert_eq!((acc.count, acc.last_value), (1, 0.5));
    let series = store
        .read_series(&id, "loss", None, None, 1000)
        .await
        .expect("read");
    assert_eq!(series.total, 101);
    assert!(series
        .points
        .iter()
        .take(100)
        .all(|p| p.value == p.step as f64));
}

pub async fn concurrent_writers_to_one_run_store_every_point_exactly_once(store: DynStore) {
    let id = new_run(&store, "concurrent").await;
    let mut tasks = Vec::new();
    for w in 0..8i64 {
        let store = store.clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            for b in 0..10i64 {
                // Each writer owns a stripe of steps; every batch is sent twice (a retry) and
                // overlaps the neighbouring writer's "shared" key.
                let batch: Vec<_> = (0..50)
                    .flat_map(|i| {
                        let step = (w * 10 + b) * 50 + i;
                        [pt("loss", step, step as f64), pt("shared", step % 400, 1.0)]
                    })
                    .collect();
                store.append_points(&id, &batch, 0).await?;
                store.append_points(&id, &batch, 0).await?;
            }
            Ok::<_, StoreError>(())
        }));
    }
    for t in tasks {
        t.await.expect("task").expect("writer");
    }
    let keys = store.metric_keys(&id).await.expect("keys");
    let count = |k: &str| keys.iter().find(|m| m.key == k).map(|m| m.count);
    assert_eq!(count("loss"), Some(4000));
    assert_eq!(count("shared"), Some(400));
    let series = store
        .read_series(&id, "loss", None, None, 10_000)
        .await
        .expect("read");
    let steps: Vec<i64> = series.points.iter().map(|p| p.step).collect();
    assert_eq!(steps, (0..4000).collect::<Vec<_>>());
    let all = store
        .points_since(&id, None, None, 100_000)
        .await
        .expect("since");
    assert_eq!(all.len(), 4400);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    // The rollups saw each point once: a downsampled read counts them right.
    let small = store
        .read_series(&id, "loss", None, None, 100)
        .await
        .expect("small");
    assert_eq!(small.total, 4000);
    assert!(small.downsampled);
}

pub async fn the_latest_metric_is_the_highest_step_not_the_last_written(store: DynStore) {
    let id = new_run(&store, "latest").await;
    store
        .append_points(&id, &[pt("val/loss", 10, 2.0), pt("val/loss", 20, 1.5)], 0)
        .await
        .expect("first");
    store
        .append_points(&id, &[pt("val/loss", 15, 9.0)], 0)
        .await
        .expect("late point");
    let run = store.get_run(&id).await.expect("get");
    let latest = &run.latest_metrics["val/loss"];
    assert_eq!((latest.step, latest.value, latest.time), (20, 1.5, 1_020));
    let keys = store.metric_keys(&id).await.expect("keys");
    assert_eq!(keys.len(), 1);
    assert_eq!(
        (keys[0].count, keys[0].last_step, keys[0].last_value),
        (3, 20, 1.5)
    );
}

pub async fn points_since_returns_later_points_in_seq_order(store: DynStore) {
    let id = new_run(&store, "sse").await;
    let first = store
        .append_points(&id, &[pt("loss", 0, 3.0), pt("acc", 0, 0.1)], 0)
        .await
        .expect("first")
        .stored;
    let second = store
        .append_points(&id, &[pt("loss", 1, 2.0), pt("acc", 1, 0.2)], 0)
        .await
        .expect("second")
        .stored;
    let after = store
        .points_since(&id, Some(first[1].seq), None, 100)
        .await
        .expect("after seq");
    assert_eq!(after, second);
    let by_step = store
        .points_since(&id, None, Some(0), 100)
        .await
        .expect("after step");
    assert_eq!(by_step, second);
    let limited = store
        .points_since(&id, None, None, 3)
        .await
        .expect("limited");
    assert_eq!(limited.len(), 3);
    assert_eq!(limited[..2], first[..]);
    // Server time fills in a missing point time.
    let untimed = MetricPoint {
        key: "lr".into(),
        step: 0,
        value: 0.1,
        time: None,
    };
    let stored = store
        .append_points(&id, &[untimed], 4242)
        .await
        .expect("untimed")
        .stored;
    assert_eq!(stored[0].time, 4242);
    let other = new_run(&store, "other").await;
    assert!(store
        .points_since(&other, None, None, 100)
        .await
        .expect("other")
        .is_empty());
}

pub async fn bad_points_are_rejected_as_invalid_and_nothing_is_stored(store: DynStore) {
    let id = new_run(&store, "bad").await;
    let cases = [
        ("infinite value", pt("loss", 1, f64::INFINITY)),
        ("negative infinity", pt("loss", 1, f64::NEG_INFINITY)),
        ("negative step", pt("loss", -1, 1.0)),
        ("empty key", pt("", 1, 1.0)),
    ];
    for (what, bad) in cases {
        let result = store
            .append_points(&id, &[pt("loss", 0, 1.0), bad], 0)
            .await;
        assert!(
            matches!(
                &result,
                Err(StoreError::Rejected(invalid)) if invalid.field.starts_with("points[1].")
            ),
            "{what}: {result:?}"
        );
    }
    let too_many: Vec<_> = (0..10_001).map(|s| pt("loss", s, 1.0)).collect();
    let result = store.append_points(&id, &too_many, 0).await;
    assert!(
        matches!(&result, Err(StoreError::Rejected(invalid)) if invalid.field == "points"),
        "{result:?}"
    );
    assert!(store.metric_keys(&id).await.expect("keys").is_empty());
}

pub async fn a_batch_mixing_new_and_stored_points_stores_only_the_new_ones(store: DynStore) {
    let id = new_run(&store, "overlap").await;
    // Even steps first; then a batch of every step, whose range covers the stored ones.
    let evens: Vec<_> = (0..500).map(|s| pt("loss", s * 2, 1.0)).collect();
    let first = store
        .append_points(&id, &evens, 0)
        .await
        .expect("evens")
        .stored;
    assert_eq!(first.len(), 500);
    let all: Vec<_> = (0..1_000).map(|s| pt("loss", s, 2.0)).collect();
    let second = store.append_points(&id, &all, 0).await.expect("all").stored;
    assert_eq!(second.len(), 500, "only the odd steps are new");
    assert!(second.iter().all(|p| p.step % 2 == 1 && p.value == 2.0));
    let last_seq = first.iter().map(|p| p.seq).max().expect("seqs");
    assert!(second.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(second.iter().all(|p| p.seq > last_seq));
    // A batch that only extends the series beyond what is stored.
    let later: Vec<_> = (1_000..1_500).map(|s| pt("loss", s, 3.0)).collect();
    assert_eq!(
        store
            .append_points(&id, &later, 0)
            .await
            .expect("later")
            .stored
            .len(),
        500
    );
    let keys = store.metric_keys(&id).await.expect("keys");
    assert_eq!(
        (keys[0].count, keys[0].last_step, keys[0].last_value),
        (1_500, 1_499, 3.0)
    );
    let series = store
        .read_series(&id, "loss", None, None, 10_000)
        .await
        .expect("read");
    let expected = |s: i64| match s {
        s if s >= 1_000 => 3.0,
        s if s % 2 == 0 => 1.0,
        _ => 2.0,
    };
    assert_eq!(series.points.len(), 1_500);
    assert!(series
        .points
        .iter()
        .enumerate()
        .all(|(i, p)| p.step == i as i64 && p.value == expected(p.step)));
    // The rollups counted each point once.
    let small = store
        .read_series(&id, "loss", None, None, 10)
        .await
        .expect("downsampled");
    assert_eq!((small.total, small.downsampled), (1_500, true));
    assert_eq!(
        store
            .points_since(&id, None, None, 10_000)
            .await
            .expect("since")
            .len(),
        1_500
    );
}

fn conflict(key: &str, step: i64, stored_value: f64, sent_value: f64) -> Conflict {
    Conflict {
        key: key.into(),
        step,
        stored_value,
        sent_value,
    }
}

pub async fn a_resent_point_with_another_value_is_reported_as_a_conflict(store: DynStore) {
    let id = new_run(&store, "conflicts").await;
    let first: Vec<_> = (0..10).map(|s| pt("loss", s, s as f64)).collect();
    let appended = store.append_points(&id, &first, 0).await.expect("first");
    assert_eq!(appended.stored.len(), 10);
    assert!(appended.conflicts.is_empty());

    // Steps 0-4 resent as they were, 5-9 with other values, 10-11 new.
    let value = |s: i64| if (5..10).contains(&s) { -1.0 } else { s as f64 };
    let resent: Vec<_> = (0..12).map(|s| pt("loss", s, value(s))).collect();
    let appended = store.append_points(&id, &resent, 0).await.expect("resent");
    let new: Vec<i64> = appended.stored.iter().map(|p| p.step).collect();
    assert_eq!(new, vec![10, 11]);
    let expected: Vec<_> = (5..10)
        .map(|s| conflict("loss", s, s as f64, -1.0))
        .collect();
    assert_eq!(appended.conflicts, expected);

    // Within one batch of new points the first value wins and a different repeat conflicts
    // (a repeat with the same value does not).
    let batch = [
        pt("acc", 0, 0.5),
        pt("acc", 0, 0.9),
        pt("acc", 0, 0.5),
        pt("acc", 1, 1.0),
    ];
    let appended = store.append_points(&id, &batch, 0).await.expect("repeats");
    assert_eq!(appended.stored.len(), 2);
    assert_eq!(appended.conflicts, vec![conflict("acc", 0, 0.5, 0.9)]);

    // Stored, repeated and new points mixed: every conflict is against the kept value.
    let batch = [
        pt("loss", 20, 1.0),
        pt("loss", 6, 6.0),
        pt("loss", 6, 8.0),
        pt("loss", 20, 2.0),
        pt("acc", 1, 3.0),
    ];
    let appended = store.append_points(&id, &batch, 0).await.expect("mixed");
    assert_eq!(appended.stored.len(), 1);
    assert_eq!(
        appended.conflicts,
        vec![
            conflict("loss", 6, 6.0, 8.0),
            conflict("loss", 20, 1.0, 2.0),
            conflict("acc", 1, 1.0, 3.0),
        ]
    );

    // Idempotent all the same: the stored values did not change.
    let series = store
        .read_series(&id, "loss", None, None, 1_000)
        .await
        .expect("read");
    let values: Vec<(i64, f64)> = series.points.iter().map(|p| (p.step, p.value)).collect();
    let mut expected: Vec<(i64, f64)> = (0..12).map(|s| (s, s as f64)).collect();
    expected.push((20, 1.0));
    assert_eq!(values, expected);
}

pub async fn the_extremes_of_each_runs_metrics_are_read_in_one_query(store: DynStore) {
    let a = new_run(&store, "a").await;
    let b = new_run(&store, "b").await;
    store
        .append_points(
            &a,
            &[
                pt("val/loss", 1, 3.0),
                pt("val/loss", 2, 1.5),
                pt("val/loss", 3, 2.0),
            ],
            0,
        )
        .await
        .expect("a");
    store
        .append_points(&b, &[pt("val/loss", 1, 4.0), pt("val/acc", 1, 0.25)], 0)
        .await
        .expect("b");
    let mut got = store
        .metric_extremes(
            &[a.clone(), b.clone()],
            &[
                "val/loss".to_string(),
                "val/acc".to_string(),
                "missing".to_string(),
            ],
        )
        .await
        .expect("extremes");
    got.sort_by(|x, y| (&x.run_id, &x.key).cmp(&(&y.run_id, &y.key)));
    let mut want = vec![
        (a.clone(), "val/loss", 1.5, 3.0),
        (b.clone(), "val/acc", 0.25, 0.25),
        (b.clone(), "val/loss", 4.0, 4.0),
    ];
    want.sort_by(|x, y| (&x.0, x.1).cmp(&(&y.0, y.1)));
    let got: Vec<_> = got
        .iter()
        .map(|e| (e.run_id.clone(), e.key.as_str(), e.min, e.max))
        .collect();
    assert_eq!(got, want);
    assert!(store
        .metric_extremes(&[], &["val/loss".into()])
        .await
        .expect("none")
        .is_empty());
}
