use serde_json::json;
use std::collections::BTreeMap;
use trainyard::store::{DynStore, ExitInfo, MetricPoint, NewRun, RunStatus, RunUpdate, StoreError};

pub fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub async fn new_run(store: &DynStore, name: &str) -> String {
    store
        .create_run(NewRun {
            experiment_id: "0".into(),
            name: Some(name.into()),
            ..Default::default()
        })
        .await
        .expect("create run")
        .id
}

pub async fn a_created_run_reads_back_with_its_config_params_and_tags(store: DynStore) {
    let config = json!({"training": {"lr": 0.001, "steps": 100}, "data": {"name": "shakespeare"}});
    let run = store
        .create_run(NewRun {
            experiment_id: "0".into(),
            name: None,
            config: Some(config.clone()),
            tags: tags(&[("team", "nlp")]),
            status: None,
            created_by: None,
        })
        .await
        .expect("create");
    assert_eq!(run.id.len(), 32);
    assert!(run
        .id
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert_eq!(run.name, format!("run-{}", &run.id[..8]));
    assert_eq!(run.status, RunStatus::Created);
    assert_eq!(run.config, Some(config));
    assert_eq!(
        run.params.get("training.lr").map(String::as_str),
        Some("0.001")
    );
    assert_eq!(
        run.params.get("data.name").map(String::as_str),
        Some("shakespeare")
    );
    assert_eq!(run.tags, tags(&[("team", "nlp")]));
    assert!(run.started_at.is_none() && run.ended_at.is_none() && run.exit.is_none());
    assert_eq!(store.get_run(&run.id).await.expect("get"), run);
}

pub async fn creating_a_run_in_an_unknown_experiment_is_not_found(store: DynStore) {
    let err = store
        .create_run(NewRun {
            experiment_id: "missing".into(),
            ..Default::default()
        })
        .await;
    match err {
        Err(StoreError::NotFound { entity, .. }) => assert_eq!(entity, "experiment"),
        other => panic!("expected not found, got {other:?}"),
    }
}

pub async fn updating_a_run_merges_tags_and_sets_name_and_notes(store: DynStore) {
    let id = store
        .create_run(NewRun {
            experiment_id: "0".into(),
            tags: tags(&[("a", "1"), ("b", "2")]),
            ..Default::default()
        })
        .await
        .expect("create")
        .id;
    let run = store
        .update_run(
            &id,
            RunUpdate {
                name: Some("renamed".into()),
                tags: Some(tags(&[("b", "20"), ("c", "")])),
                notes: Some("lr too high".into()),
                config: None,
            },
        )
        .await
        .expect("update");
    assert_eq!(run.name, "renamed");
    assert_eq!(run.notes, "lr too high");
    assert_eq!(run.tags, tags(&[("a", "1"), ("b", "20"), ("c", "")]));
    let err = store
        .update_run(
            &id,
            RunUpdate {
                name: Some("".into()),
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(err, Err(StoreError::Invalid { field: "name", .. })),
        "{err:?}"
    );
}

pub async fn a_config_is_write_once(store: DynStore) {
    let id = new_run(&store, "cfg").await;
    let config = json!({"model": {"n_layer": 4}});
    let set = |c: serde_json::Value| RunUpdate {
        config: Some(c),
        ..Default::default()
    };
    let run = store
        .update_run(&id, set(config.clone()))
        .await
        .expect("first write");
    assert_eq!(
        run.params.get("model.n_layer").map(String::as_str),
        Some("4")
    );
    // The same config again is accepted (a client retry), a different one is not.
    store
        .update_run(&id, set(config.clone()))
        .await
        .expect("same config");
    match store
        .update_run(&id, set(json!({"model": {"n_layer": 8}})))
        .await
    {
        Err(StoreError::Conflict { field, .. }) => assert_eq!(field, Some("config")),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let run = store.get_run(&id).await.expect("get");
    assert_eq!(run.config, Some(config));
    assert_eq!(run.params.len(), 1);
}

pub async fn every_operation_on_an_unknown_run_is_not_found(store: DynStore) {
    let id = "0123456789abcdef0123456789abcdef";
    let is_nf = |r: Result<(), StoreError>| {
        assert!(
            matches!(r, Err(StoreError::NotFound { entity: "run", .. })),
            "{r:?}"
        )
    };
    is_nf(store.get_run(id).await.map(|_| ()));
    is_nf(store.update_run(id, RunUpdate::default()).await.map(|_| ()));
    is_nf(
        store
            .set_status(id, RunStatus::Running, None, None)
            .await
            .map(|_| ()),
    );
    let p = vec![MetricPoint {
        key: "loss".into(),
        step: 0,
        value: 1.0,
        time: None,
    }];
    is_nf(store.append_points(id, &p, 0).await.map(|_| ()));
    is_nf(store.append_points(id, &[], 0).await.map(|_| ()));
    is_nf(store.metric_keys(id).await.map(|_| ()));
    is_nf(
        store
            .read_series(id, "loss", None, None, 100)
            .await
            .map(|_| ()),
    );
    is_nf(store.points_since(id, None, None, 100).await.map(|_| ()));
    is_nf(store.run_events(id, None).await.map(|_| ()));
}

pub async fn set_status_stamps_times_and_records_events_in_order(store: DynStore) {
    let id = new_run(&store, "lifecycle").await;
    let running = store
        .set_status(&id, RunStatus::Running, Some("started"), None)
        .await
        .expect("running");
    assert_eq!(running.from_status, Some(RunStatus::Created));
    let run = store.get_run(&id).await.expect("get");
    assert_eq!(run.status, RunStatus::Running);
    let started = run.started_at.expect("started_at set");
    assert!(run.ended_at.is_none());
    let exit = ExitInfo {
        exit_code: Some(1),
        signal: None,
        message: Some("CUDA out of memory".into()),
    };
    let failed = store
        .set_status(&id, RunStatus::Failed, Some("exit 1"), Some(exit.clone()))
        .await
        .expect("failed");
    assert!(failed.seq > running.seq);
    let run = store.get_run(&id).await.expect("get");
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.started_at, Some(started));
    assert!(run.ended_at.expect("ended_at set") >= started);
    assert_eq!(run.exit, Some(exit));

    let events = store.run_events(&id, None).await.expect("events");
    let seen: Vec<_> = events
        .iter()
        .map(|e| (e.from_status, e.to_status, e.reason.clone()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (None, RunStatus::Created, Some("created".to_string())),
            (
                Some(RunStatus::Created),
                RunStatus::Running,
                Some("started".to_string())
            ),
            (
                Some(RunStatus::Running),
                RunStatus::Failed,
                Some("exit 1".to_string())
            ),
        ]
    );
    assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    let later = store
        .run_events(&id, Some(running.seq))
        .await
        .expect("after");
    assert_eq!(later, vec![failed]);
}

pub async fn runs_with_status_lists_only_those_statuses(store: DynStore) {
    let a = new_run(&store, "a").await;
    let b = new_run(&store, "b").await;
    let _c = new_run(&store, "c").await;
    store
        .set_status(&a, RunStatus::Running, None, None)
        .await
        .expect("a");
    store
        .set_status(&b, RunStatus::Queued, None, None)
        .await
        .expect("b");
    let found = store
        .runs_with_status(&[RunStatus::Running, RunStatus::Queued])
        .await
        .expect("query");
    let mut ids: Vec<_> = found.iter().map(|r| r.id.clone()).collect();
    ids.sort();
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(ids, want);
}

pub async fn racing_config_writes_leave_one_winner_and_conflicts_for_the_rest(store: DynStore) {
    let id = new_run(&store, "race").await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            let update = RunUpdate {
                config: Some(json!({"seed": i})),
                ..Default::default()
            };
            store.update_run(&id, update).await
        }));
    }
    let mut wins = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok(_) => wins += 1,
            Err(StoreError::Conflict { field, .. }) => assert_eq!(field, Some("config")),
            Err(other) => panic!("a client mistake must not be a database error: {other:?}"),
        }
    }
    assert_eq!(wins, 1);
    let run = store.get_run(&id).await.expect("get");
    assert_eq!(run.params.len(), 1);
    let seed = &run.params["seed"];
    assert_eq!(
        run.config,
        Some(json!({"seed": seed.parse::<i64>().expect("number")}))
    );
}

pub async fn text_the_database_cannot_hold_is_invalid_not_a_database_error(store: DynStore) {
    let id = new_run(&store, "nul").await;
    let nul = "a\0b".to_string();
    let cases: Vec<(&str, Result<(), StoreError>)> = vec![
        (
            "experiment",
            store.create_experiment(&nul).await.map(|_| ()),
        ),
        (
            "tags",
            store
                .update_run(
                    &id,
                    RunUpdate {
                        tags: Some(tags(&[("k", "a\0b")])),
                        ..Default::default()
                    },
                )
                .await
                .map(|_| ()),
        ),
        (
            "notes",
            store
                .update_run(
                    &id,
                    RunUpdate {
                        notes: Some(nul.clone()),
                        ..Default::default()
                    },
                )
                .await
                .map(|_| ()),
        ),
        (
            "config",
            store
                .create_run(NewRun {
                    experiment_id: "0".into(),
                    config: Some(json!({"data": {"name": nul.clone()}})),
                    ..Default::default()
                })
                .await
                .map(|_| ()),
        ),
        (
            "metric key",
            store
                .append_points(
                    &id,
                    &[MetricPoint {
                        key: nul.clone(),
                        step: 0,
                        value: 1.0,
                        time: None,
                    }],
                    0,
                )
                .await
                .map(|_| ()),
        ),
    ];
    for (what, result) in cases {
        assert!(
            matches!(
                result,
                Err(StoreError::Invalid { .. } | StoreError::Rejected(_))
            ),
            "{what}: {result:?}"
        );
    }
}
