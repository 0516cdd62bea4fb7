use crate::metrics::pt;
use crate::runs::new_run;
use trainyard::store::{DynStore, MetricPoint, StoreError, MAX_STEP};

/// A bumpy but bounded curve (values in [1, 2)), so spikes stand out.
fn curve(step: i64) -> f64 {
    1.0 + ((step * 7919) % 1000) as f64 / 1000.0
}

async fn write(store: &DynStore, id: &str, points: Vec<MetricPoint>) {
    for batch in points.chunks(5_000) {
        store.append_points(id, batch, 0).await.expect("append");
    }
}

pub async fn a_series_within_the_budget_is_returned_whole(store: DynStore) {
    let id = new_run(&store, "short").await;
    write(
        &store,
        &id,
        (0..500).map(|s| pt("loss", s * 3, curve(s))).collect(),
    )
    .await;
    let s = store
        .read_series(&id, "loss", None, None, 500)
        .await
        .expect("read");
    assert_eq!(s.total, 500);
    assert!(!s.downsampled);
    assert_eq!(s.points.len(), 500);
    assert!(s
        .points
        .iter()
        .enumerate()
        .all(|(i, p)| p.step == i as i64 * 3
            && p.value == curve(i as i64)
            && p.time == 1_000 + p.step));
}

pub async fn a_long_series_keeps_every_spike_and_the_global_extremes(store: DynStore) {
    let id = new_run(&store, "long").await;
    let n = 60_000i64;
    // Spikes up and down every 1,700 steps (wider than any bucket at max_points = 200).
    let value = |s: i64| match s % 1_700 {
        0 => 100.0 + s as f64,
        850 => -100.0 - s as f64,
        _ => curve(s),
    };
    // Written out of order, in two halves, so rollups merge across batches.
    let points: Vec<_> = (n / 2..n)
        .chain(0..n / 2)
        .map(|s| pt("loss", s, value(s)))
        .collect();
    write(&store, &id, points).await;

    for max_points in [200usize, 1_000] {
        let s = store
            .read_series(&id, "loss", None, None, max_points)
            .await
            .expect("read");
        assert_eq!(s.total, n);
        assert!(s.downsampled);
        assert!(s.points.len() <= max_points, "{} points", s.points.len());
        assert!(
            s.points.len() >= max_points / 4,
            "only {} points",
            s.points.len()
        );
        assert!(s.points.windows(2).all(|w| w[0].step < w[1].step));
        for p in &s.points {
            assert_eq!(p.value, value(p.step), "a returned point is a stored point");
        }
        for spike in (0..n).filter(|s| s % 1_700 == 0 || s % 1_700 == 850) {
            assert!(
                s.points.iter().any(|p| p.step == spike),
                "spike at step {spike} vanished with max_points={max_points}"
            );
        }
        let max = s.points.iter().map(|p| p.value).fold(f64::MIN, f64::max);
        let min = s.points.iter().map(|p| p.value).fold(f64::MAX, f64::min);
        assert_eq!(max, value(59_500), "the last up-spike is the global max");
        assert_eq!(min, value(58_650), "the last down-spike is the global min");
    }
}

pub async fn step_bounds_limit_the_points_and_the_total(store: DynStore) {
    let id = new_run(&store, "bounds").await;
    write(
        &store,
        &id,
        (0..20_000).map(|s| pt("loss", s, curve(s))).collect(),
    )
    .await;
    // Unaligned bounds: edges come from raw points, the middle from rollups.
    let s = store
        .read_series(&id, "loss", Some(1_037), Some(17_001), 300)
        .await
        .expect("read");
    assert_eq!(s.total, 17_001 - 1_037 + 1);
    assert!(s.downsampled && s.points.len() <= 300);
    assert!(s.points.iter().all(|p| (1_037..=17_001).contains(&p.step)));
    let lowest = (1_037..=17_001).map(curve).fold(f64::MAX, f64::min);
    assert!(s.points.iter().any(|p| p.value == lowest));
    // A narrow range within the budget comes back whole.
    let s = store
        .read_series(&id, "loss", Some(100), Some(199), 300)
        .await
        .expect("narrow");
    assert_eq!((s.total, s.downsampled), (100, false));
    assert_eq!(s.points.first().map(|p| p.step), Some(100));
    assert_eq!(s.points.last().map(|p| p.step), Some(199));
    let s = store
        .read_series(&id, "loss", Some(50_000), None, 300)
        .await
        .expect("beyond");
    assert_eq!((s.total, s.points.len()), (0, 0));
    let s = store
        .read_series(&id, "loss", Some(10), Some(5), 300)
        .await
        .expect("inverted");
    assert_eq!(s.total, 0);
}

pub async fn downsampling_after_resent_batches_counts_each_point_once(store: DynStore) {
    let id = new_run(&store, "resent").await;
    let points: Vec<_> = (0..12_000).map(|s| pt("loss", s, curve(s))).collect();
    write(&store, &id, points.clone()).await;
    // Every batch again, with other values: nothing may change.
    let changed: Vec<_> = points.iter().map(|p| pt("loss", p.step, -5.0)).collect();
    write(&store, &id, changed).await;
    let s = store
        .read_series(&id, "loss", None, None, 100)
        .await
        .expect("read");
    assert_eq!(s.total, 12_000);
    assert!(s.points.iter().all(|p| p.value >= 1.0));
}

pub async fn an_unknown_key_of_a_known_run_is_an_empty_series(store: DynStore) {
    let id = new_run(&store, "empty").await;
    let s = store
        .read_series(&id, "nope", None, None, 100)
        .await
        .expect("read");
    assert_eq!((s.key.as_str(), s.total, s.points.len()), ("nope", 0, 0));
}

pub async fn a_window_no_wider_than_the_budget_comes_back_whole(store: DynStore) {
    let id = new_run(&store, "windows").await;
    write(
        &store,
        &id,
        (0..20_000).map(|s| pt("loss", s, curve(s))).collect(),
    )
    .await;
    let exact = |s: &trainyard::store::Series, from: i64, to: i64| {
        s.points.len() as i64 == to - from + 1
            && s.points
                .iter()
                .zip(from..)
                .all(|(p, step)| p.step == step && p.value == curve(step) && p.time == 1_000 + step)
    };
    // Exactly max_points steps.
    let s = store
        .read_series(&id, "loss", Some(3_000), Some(3_999), 1_000)
        .await
        .expect("window");
    assert_eq!((s.total, s.downsampled), (1_000, false));
    assert!(exact(&s, 3_000, 3_999));
    // A window reaching past the last point.
    let s = store
        .read_series(&id, "loss", Some(19_900), Some(20_899), 1_000)
        .await
        .expect("tail");
    assert_eq!((s.total, s.downsampled), (100, false));
    assert!(exact(&s, 19_900, 19_999));
    // Wider than the budget, too narrow for any rollup: raw points, downsampled.
    let s = store
        .read_series(&id, "loss", Some(0), Some(1_499), 1_000)
        .await
        .expect("wide");
    assert_eq!(s.total, 1_500);
    assert!(s.downsampled && s.points.len() <= 1_000);
    let lowest = (0..1_500).map(curve).fold(f64::MAX, f64::min);
    let highest = (0..1_500).map(curve).fold(f64::MIN, f64::max);
    assert!(s.points.iter().any(|p| p.value == lowest));
    assert!(s.points.iter().any(|p| p.value == highest));
    assert!(s.points.windows(2).all(|w| w[0].step < w[1].step));
}

pub async fn a_sparse_window_wider_than_the_budget_fits_and_comes_back_whole(store: DynStore) {
    let id = new_run(&store, "sparse").await;
    write(
        &store,
        &id,
        (0..2_000).map(|s| pt("loss", s * 3, curve(s))).collect(),
    )
    .await;
    // 3,000 steps holding 1,000 points: within a budget of 1,000.
    let s = store
        .read_series(&id, "loss", Some(0), Some(2_999), 1_000)
        .await
        .expect("sparse");
    assert_eq!(
        (s.total, s.downsampled, s.points.len()),
        (1_000, false, 1_000)
    );
    assert!(s
        .points
        .iter()
        .enumerate()
        .all(|(i, p)| p.step == i as i64 * 3 && p.value == curve(i as i64)));
}

pub async fn a_few_far_away_steps_leave_the_dense_part_its_resolution(store: DynStore) {
    let id = new_run(&store, "outliers").await;
    let outliers = [1_000_000_000_000, MAX_STEP];
    let mut points: Vec<_> = (0..20_000).map(|s| pt("loss", s, curve(s))).collect();
    points.extend(outliers.iter().map(|&s| pt("loss", s, 5.0)));
    write(&store, &id, points).await;
    for max_points in [100usize, 1_000] {
        let s = store
            .read_series(&id, "loss", None, None, max_points)
            .await
            .expect("read");
        assert_eq!(s.total, 20_002);
        assert!(s.downsampled);
        assert!(s.points.len() <= max_points, "{} points", s.points.len());
        assert!(s.points.windows(2).all(|w| w[0].step < w[1].step));
        for o in outliers {
            assert!(s.points.iter().any(|p| p.step == o), "outlier {o} kept");
        }
        let dense = s.points.iter().filter(|p| p.step < 20_000).count();
        assert!(
            dense >= max_points * 2 / 5,
            "the dense part kept {dense} of {max_points} points"
        );
        let lowest = (0..20_000).map(curve).fold(f64::MAX, f64::min);
        assert!(s.points.iter().any(|p| p.value == lowest));
    }
    // Past the documented range: refused whole, nothing of the batch stored.
    let err = store
        .append_points(
            &id,
            &[pt("loss", 30_000, 1.0), pt("loss", MAX_STEP + 1, 1.0)],
            0,
        )
        .await
        .expect_err("a step past MAX_STEP");
    assert!(matches!(err, StoreError::Rejected(_)), "{err:?}");
    let keys = store.metric_keys(&id).await.expect("keys");
    assert_eq!(keys[0].count, 20_002);
}
