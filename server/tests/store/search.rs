use crate::metrics::pt;
use crate::runs::{new_run, tags};
use serde_json::json;
use std::collections::HashSet;
use trainyard::store::filter::Filter;
use trainyard::store::{DynStore, NewRun, RunQuery, RunStatus, SortDir, SortKey, StoreError};

fn query(sort: SortKey, dir: SortDir, limit: usize) -> RunQuery {
    RunQuery {
        experiment_id: None,
        status: None,
        tag: None,
        filter: None,
        sort,
        dir,
        limit,
        cursor: None,
        visible_experiments: None,
        lifecycle: Default::default(),
    }
}

/// Walks every page and returns the run ids in page order.
async fn walk(store: &DynStore, mut q: RunQuery) -> Vec<String> {
    let mut ids = Vec::new();
    for page in 0.. {
        let p = store.search_runs(&q).await.expect("page");
        assert!(p.runs.len() <= q.limit);
        ids.extend(p.runs.iter().map(|r| r.id.clone()));
        match p.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => break,
        }
        assert!(page < 1000, "pagination does not end");
    }
    ids
}

fn assert_unique(ids: &[String]) {
    let set: HashSet<_> = ids.iter().collect();
    assert_eq!(set.len(), ids.len(), "a run appeared on two pages");
}

pub async fn runs_are_found_by_status_tag_and_experiment(store: DynStore) {
    let exp = store.create_experiment("other").await.expect("exp");
    let a = store
        .create_run(NewRun {
            experiment_id: exp.id.clone(),
            tags: tags(&[("team", "nlp")]),
            ..Default::default()
        })
        .await
        .expect("a")
        .id;
    let b = store
        .create_run(NewRun {
            experiment_id: "0".into(),
            tags: tags(&[("team", "vision"), ("best", "")]),
            ..Default::default()
        })
        .await
        .expect("b")
        .id;
    let c = new_run(&store, "c").await;
    store
        .set_status(&c, RunStatus::Running, None, None)
        .await
        .expect("status");
    let find = |f: &dyn Fn(&mut RunQuery)| {
        let mut q = query(SortKey::CreatedAt, SortDir::Asc, 100);
        f(&mut q);
        let store = store.clone();
        async move {
            let mut ids: Vec<String> = store
                .search_runs(&q)
                .await
                .expect("search")
                .runs
                .into_iter()
                .map(|r| r.id)
                .collect();
            ids.sort();
            ids
        }
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(
        find(&|q| q.experiment_id = Some(exp.id.clone())).await,
        vec![a.clone()]
    );
    assert_eq!(
        find(&|q| q.experiment_id = Some("0".into())).await,
        sorted(vec![b.clone(), c.clone()])
    );
    assert_eq!(
        find(&|q| q.status = Some(RunStatus::Running)).await,
        vec![c.clone()]
    );
    assert_eq!(
        find(&|q| q.tag = Some("team".into())).await,
        sorted(vec![a.clone(), b.clone()])
    );
    assert_eq!(
        find(&|q| q.tag = Some("team=nlp".into())).await,
        vec![a.clone()]
    );
    assert_eq!(
        find(&|q| q.tag = Some("best".into())).await,
        vec![b.clone()]
    );
    assert_eq!(
        find(&|q| q.tag = Some("best=".into())).await,
        vec![b.clone()]
    );
    assert!(find(&|q| q.tag = Some("team=audio".into()))
        .await
        .is_empty());
    let page = store
        .search_runs(&query(SortKey::CreatedAt, SortDir::Asc, 100))
        .await
        .expect("all");
    assert_eq!(page.runs.len(), 3);
    assert!(page.next_cursor.is_none());
    let run_a = page.runs.iter().find(|r| r.id == a).expect("a listed");
    assert_eq!(run_a.tags, tags(&[("team", "nlp")]));
}

pub async fn pagination_by_creation_time_is_stable_and_complete_with_inserts_between_pages(
    store: DynStore,
) {
    // Created back to back, many runs share a millisecond: ties break by id.
    let mut original = Vec::new();
    for i in 0..40 {
        original.push(new_run(&store, &format!("r{i}")).await);
    }
    for dir in [SortDir::Asc, SortDir::Desc] {
        let pages = walk(&store, query(SortKey::CreatedAt, dir, 7)).await;
        assert_unique(&pages);
        let got: HashSet<_> = pages.iter().collect();
        assert!(
            original.iter().all(|id| got.contains(id)),
            "a run went missing"
        );
        // Now walk again while inserting runs between pages.
        let mut q = query(SortKey::CreatedAt, dir, 7);
        let mut ids = Vec::new();
        loop {
            let p = store.search_runs(&q).await.expect("page");
            ids.extend(p.runs.iter().map(|r| r.id.clone()));
            new_run(&store, "late").await;
            match p.next_cursor {
                Some(c) => q.cursor = Some(c),
                None => break,
            }
        }
        assert_unique(&ids);
        let got: HashSet<_> = ids.iter().collect();
        assert!(
            original.iter().all(|id| got.contains(id)),
            "a run went missing"
        );
        // Pages in order: created_at never goes backwards for the walk's direction.
        let all = store
            .search_runs(&query(SortKey::CreatedAt, dir, 1000))
            .await
            .expect("one page");
        let order: Vec<_> = all
            .runs
            .iter()
            .map(|r| (r.created_at, r.id.clone()))
            .collect();
        let mut expected = order.clone();
        expected.sort();
        if dir == SortDir::Desc {
            expected.reverse();
        }
        assert_eq!(order, expected);
    }
}

pub async fn pagination_by_name_breaks_ties_by_id(store: DynStore) {
    let mut all = Vec::new();
    for i in 0..23 {
        // Three distinct names (code-point order puts "Beta" first on both backends); most of the
        // order comes from the id tie-break.
        all.push(new_run(&store, ["alpha", "Beta", "gamma"][i % 3]).await);
    }
    let ids = walk(&store, query(SortKey::Name, SortDir::Desc, 4)).await;
    assert_unique(&ids);
    assert_eq!(ids.len(), 23);
    let full = store
        .search_runs(&query(SortKey::Name, SortDir::Desc, 100))
        .await
        .expect("full");
    let pairs: Vec<_> = full
        .runs
        .iter()
        .map(|r| (r.name.clone(), r.id.clone()))
        .collect();
    let mut expected = pairs.clone();
    expected.sort();
    expected.reverse();
    assert_eq!(pairs, expected);
    assert_eq!(
        full.runs.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        ids
    );
}

pub async fn sorting_by_a_metric_puts_runs_without_it_last(store: DynStore) {
    let mut with = Vec::new();
    for (i, loss) in [2.5, 1.0, 2.5, 3.0, 1.0, 0.5].into_iter().enumerate() {
        let id = new_run(&store, &format!("m{i}")).await;
        store
            .append_points(&id, &[pt("val/loss", 1, 9.0), pt("val/loss", 2, loss)], 0)
            .await
            .expect("points");
        with.push((loss, id));
    }
    let without = [new_run(&store, "n1").await, new_run(&store, "n2").await];
    for dir in [SortDir::Asc, SortDir::Desc] {
        let q = query(SortKey::Metric("val/loss".into()), dir, 3);
        let ids = walk(&store, q).await;
        assert_unique(&ids);
        assert_eq!(ids.len(), 8);
        let mut expected = with.clone();
        expected.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        if dir == SortDir::Desc {
            expected.reverse();
        }
        let mut tail = without.to_vec();
        tail.sort();
        if dir == SortDir::Desc {
            tail.reverse();
        }
        let want: Vec<String> = expected.into_iter().map(|(_, id)| id).chain(tail).collect();
        assert_eq!(ids, want, "{dir:?}");
    }
}

pub async fn sorting_by_a_param_is_numeric_and_puts_runs_without_it_last(store: DynStore) {
    let mut ids = Vec::new();
    for lr in [
        json!(0.01),
        json!(1e-3),
        json!(0.1),
        json!("warmup"),
        json!(2),
    ] {
        let run = store
            .create_run(NewRun {
                experiment_id: "0".into(),
                config: Some(json!({"training": {"lr": lr}})),
                ..Default::default()
            })
            .await
            .expect("run");
        ids.push(run.id);
    }
    let missing = new_run(&store, "no config").await;
    let q = query(SortKey::Param("training.lr".into()), SortDir::Asc, 2);
    let got = walk(&store, q).await;
    // Numbers in numeric order (0.001 < 0.01 < 0.1 < 2), then text, then runs without it.
    let want = vec![
        ids[1].clone(),
        ids[0].clone(),
        ids[2].clone(),
        ids[4].clone(),
        ids[3].clone(),
        missing.clone(),
    ];
    assert_eq!(got, want);
    let q = query(SortKey::Param("training.lr".into()), SortDir::Desc, 4);
    let got = walk(&store, q).await;
    let want = vec![
        ids[4].clone(),
        ids[2].clone(),
        ids[0].clone(),
        ids[1].clone(),
        ids[3].clone(),
        missing,
    ];
    assert_eq!(got, want);
}

pub async fn a_cursor_from_another_sort_or_garbage_is_invalid(store: DynStore) {
    for i in 0..3 {
        new_run(&store, &format!("r{i}")).await;
    }
    let page = store
        .search_runs(&query(SortKey::Name, SortDir::Asc, 1))
        .await
        .expect("page");
    let cursor = page.next_cursor.expect("more pages");
    let mut other = query(SortKey::CreatedAt, SortDir::Asc, 1);
    other.cursor = Some(cursor);
    for q in [other, {
        let mut q = query(SortKey::Name, SortDir::Asc, 1);
        q.cursor = Some("not-a-cursor".into());
        q
    }] {
        match store.search_runs(&q).await {
            Err(StoreError::Invalid { field, .. }) => assert_eq!(field, "cursor"),
            other => panic!("expected an invalid cursor, got {other:?}"),
        }
    }
}

pub async fn a_filter_on_params_and_metrics_selects_matching_runs_across_pages(store: DynStore) {
    let mut matching = Vec::new();
    for i in 0..12 {
        let lr = if i % 2 == 0 { 0.001 } else { 0.01 };
        let run = store
            .create_run(NewRun {
                experiment_id: "0".into(),
                config: Some(json!({"training": {"lr": lr}})),
                ..Default::default()
            })
            .await
            .expect("run");
        let loss = 1.0 + i as f64 / 4.0; // 1.0 ..= 3.75
        store
            .append_points(&run.id, &[pt("val/loss", 10, loss)], 0)
            .await
            .expect("points");
        if lr == 0.001 && loss < 2.5 {
            matching.push(run.id);
        }
    }
    let mut q = query(SortKey::Metric("val/loss".into()), SortDir::Asc, 2);
    q.filter = Some(
        Filter::parse("metrics.val/loss < 2.5 and params.training.lr = 0.001").expect("filter"),
    );
    let ids = walk(&store, q).await;
    assert_eq!(ids, matching);
}
