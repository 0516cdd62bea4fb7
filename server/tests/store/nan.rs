//! NaN metric points: stored, read back as NaN, left out of extremes, rollups and latest
//! values, and found by `metrics.<key> IS NAN`.

use crate::metrics::pt;
use crate::runs::new_run;
use trainyard::store::filter::Filter;
use trainyard::store::{DynStore, RunQuery, SortDir, SortKey};

fn values(points: impl IntoIterator<Item = (i64, f64)>) -> Vec<(i64, String)> {
    points
        .into_iter()
        .map(|(s, v)| (s, format!("{v}")))
        .collect()
}

pub async fn a_nan_point_is_stored_and_read_back_but_is_no_extreme_or_latest_value(
    store: DynStore,
) {
    let id = new_run(&store, "diverged").await;
    let batch = [
        pt("loss", 0, 1.0),
        pt("loss", 1, f64::NAN),
        pt("loss", 2, 0.5),
        pt("loss", 3, f64::NAN),
    ];
    let stored = store.append_points(&id, &batch, 0).await.expect("append");
    assert_eq!(
        stored.stored.len(),
        4,
        "every point is stored, NaN ones too"
    );
    assert!(stored.stored[1].value.is_nan());
    let want = values([(0, 1.0), (1, f64::NAN), (2, 0.5), (3, f64::NAN)]);

    let history = store
        .metric_history(&id, "loss", None, 100)
        .await
        .expect("history");
    assert_eq!(values(history.iter().map(|p| (p.step, p.value))), want);
    let series = store
        .read_series(&id, "loss", None, None, 1000)
        .await
        .expect("series");
    assert_eq!(series.total, 4);
    assert_eq!(
        values(series.points.iter().map(|p| (p.step, p.value))),
        want
    );
    let live = store
        .points_since(&id, None, None, 100)
        .await
        .expect("catch-up");
    assert_eq!(values(live.iter().map(|p| (p.step, p.value))), want);

    // The latest value is the latest finite one; extremes are the finite points'.
    let keys = store.metric_keys(&id).await.expect("keys");
    let loss = keys.iter().find(|k| k.key == "loss").expect("loss");
    assert_eq!((loss.count, loss.last_step, loss.last_value), (4, 2, 0.5));
    let run = store.get_run(&id).await.expect("run");
    let latest = run.latest_metrics.get("loss").expect("latest loss");
    assert_eq!((latest.step, latest.value), (2, 0.5));
    let extremes = store
        .metric_extremes(std::slice::from_ref(&id), &["loss".to_string()])
        .await
        .expect("extremes");
    assert_eq!(extremes.len(), 1);
    assert_eq!((extremes[0].min, extremes[0].max), (0.5, 1.0));

    // Sending the batch again is no conflict: a NaN is the NaN stored.
    let again = store.append_points(&id, &batch, 0).await.expect("again");
    assert!(again.stored.is_empty());
    assert!(again.conflicts.is_empty(), "{:?}", again.conflicts);
    // A finite value sent for a NaN step is one.
    let other = store
        .append_points(&id, &[pt("loss", 1, 2.0)], 0)
        .await
        .expect("other");
    assert_eq!(other.conflicts.len(), 1);
    assert!(other.conflicts[0].stored_value.is_nan());
}

pub async fn a_series_of_only_nan_points_has_no_latest_value_or_extremes(store: DynStore) {
    let id = new_run(&store, "all-nan").await;
    store
        .append_points(&id, &[pt("loss", 0, f64::NAN), pt("loss", 1, f64::NAN)], 0)
        .await
        .expect("append");
    let keys = store.metric_keys(&id).await.expect("keys");
    let loss = keys
        .iter()
        .find(|k| k.key == "loss")
        .expect("the key is listed");
    assert_eq!(loss.count, 2);
    assert!(loss.last_value.is_nan(), "{loss:?}");
    let run = store.get_run(&id).await.expect("run");
    assert!(!run.latest_metrics.contains_key("loss"), "no latest value");
    let extremes = store
        .metric_extremes(std::slice::from_ref(&id), &["loss".to_string()])
        .await
        .expect("extremes");
    assert!(extremes.is_empty(), "{extremes:?}");
    let history = store
        .metric_history(&id, "loss", None, 10)
        .await
        .expect("history");
    assert_eq!(history.len(), 2);
    assert!(history.iter().all(|p| p.value.is_nan()));
}

pub async fn a_downsampled_read_keeps_finite_extremes_and_every_nan_point(store: DynStore) {
    let id = new_run(&store, "long").await;
    let nan_at = [1_234, 3_000, 4_321];
    let points: Vec<_> = (0..5_000)
        .map(|s| {
            let v = if nan_at.contains(&s) {
                f64::NAN
            } else {
                ((s * 37) % 1_000) as f64
            };
            pt("loss", s, v)
        })
        .collect();
    for chunk in points.chunks(1_000) {
        store.append_points(&id, chunk, 0).await.expect("append");
    }
    let series = store
        .read_series(&id, "loss", None, None, 100)
        .await
        .expect("series");
    assert!(series.downsampled);
    assert_eq!(series.total, 5_000);
    let nan_steps: Vec<i64> = series
        .points
        .iter()
        .filter(|p| p.value.is_nan())
        .map(|p| p.step)
        .collect();
    assert_eq!(nan_steps, nan_at);
    let finite: Vec<f64> = series
        .points
        .iter()
        .map(|p| p.value)
        .filter(|v| !v.is_nan())
        .collect();
    assert!(
        finite.contains(&0.0) && finite.contains(&999.0),
        "{finite:?}"
    );
    assert!(series.points.windows(2).all(|w| w[0].step < w[1].step));
}

fn query(filter: Option<&str>, sort: SortKey) -> RunQuery {
    RunQuery {
        experiment_id: None,
        status: None,
        tag: None,
        filter: filter.map(|f| Filter::parse(f).expect("filter")),
        sort,
        dir: SortDir::Asc,
        limit: 100,
        cursor: None,
        visible_experiments: None,
        lifecycle: Default::default(),
    }
}

async fn ids(store: &DynStore, q: RunQuery) -> Vec<String> {
    let page = store.search_runs(&q).await.expect("search");
    page.runs.into_iter().map(|r| r.id).collect()
}

pub async fn runs_with_a_nan_point_are_found_by_is_nan(store: DynStore) {
    let fine = new_run(&store, "fine").await;
    let spiked = new_run(&store, "spiked").await;
    let lost = new_run(&store, "lost").await;
    let other = new_run(&store, "other").await;
    let write = |id: &String, points: Vec<_>| {
        let store = store.clone();
        let id = id.clone();
        async move { store.append_points(&id, &points, 0).await.expect("append") }
    };
    write(&fine, vec![pt("loss", 0, 2.0), pt("loss", 1, 1.0)]).await;
    write(
        &spiked,
        vec![
            pt("loss", 0, 3.0),
            pt("loss", 1, f64::NAN),
            pt("loss", 2, 0.5),
        ],
    )
    .await;
    write(&lost, vec![pt("loss", 0, f64::NAN)]).await;
    write(&other, vec![pt("acc", 0, f64::NAN)]).await;
    let created = SortKey::CreatedAt;

    let mut nan = ids(&store, query(Some("metrics.loss IS NAN"), created.clone())).await;
    nan.sort();
    let mut want = vec![spiked.clone(), lost.clone()];
    want.sort();
    assert_eq!(nan, want);
    let not_nan = ids(
        &store,
        query(Some("metrics.loss IS NOT NAN"), created.clone()),
    )
    .await;
    assert_eq!(not_nan, std::slice::from_ref(&fine));
    // A comparison reads the latest finite value; a series of NaN only has none.
    let mut below = ids(&store, query(Some("metrics.loss < 10"), created.clone())).await;
    below.sort();
    let mut want = vec![fine.clone(), spiked.clone()];
    want.sort();
    assert_eq!(below, want);
    // Sorting by the metric puts the NaN-only run with the runs lacking it (after the others).
    let sorted = ids(&store, query(None, SortKey::Metric("loss".into()))).await;
    assert_eq!(sorted[..2], [spiked.clone(), fine.clone()]);
    let mut rest = sorted[2..].to_vec();
    rest.sort();
    let mut want = vec![lost.clone(), other.clone()];
    want.sort();
    assert_eq!(rest, want);

    let error = Filter::parse("params.lr IS NAN").expect_err("params cannot be NaN");
    assert!(error.message.contains("IS NAN tests a metric"), "{error:?}");
}
