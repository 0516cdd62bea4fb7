use trainyard::store::{DynStore, StoreError, DEFAULT_EXPERIMENT};

pub async fn the_default_experiment_exists_with_id_zero(store: DynStore) {
    let e = store.get_experiment("0").await.expect("default experiment");
    assert_eq!(e.name, DEFAULT_EXPERIMENT);
    let by_name = store
        .get_experiment(DEFAULT_EXPERIMENT)
        .await
        .expect("by name");
    assert_eq!(by_name.id, "0");
    let all = store
        .list_experiments(trainyard::store::Lifecycle::Active)
        .await
        .expect("list");
    assert_eq!(all.len(), 1);
}

pub async fn creating_an_experiment_with_a_taken_name_is_a_conflict(store: DynStore) {
    let e = store.create_experiment("gpt-small").await.expect("create");
    assert_eq!(e.name, "gpt-small");
    match store.create_experiment("gpt-small").await {
        Err(StoreError::Conflict { field, .. }) => assert_eq!(field, Some("name")),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        store
            .list_experiments(trainyard::store::Lifecycle::Active)
            .await
            .expect("list")
            .len(),
        2
    );
}

pub async fn an_experiment_is_found_by_id_or_by_name(store: DynStore) {
    let e = store.create_experiment("moe").await.expect("create");
    assert_eq!(store.get_experiment(&e.id).await.expect("by id"), e);
    assert_eq!(store.get_experiment("moe").await.expect("by name"), e);
    match store.get_experiment("nope").await {
        Err(StoreError::NotFound { entity, .. }) => assert_eq!(entity, "experiment"),
        other => panic!("expected not found, got {other:?}"),
    }
}

pub async fn resolving_an_unknown_name_creates_one_experiment_even_when_racing(store: DynStore) {
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            store.resolve_experiment("sweep-1").await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.expect("task").expect("resolve").id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every racer got the same experiment");
    assert_eq!(
        store
            .list_experiments(trainyard::store::Lifecycle::Active)
            .await
            .expect("list")
            .len(),
        2
    );
    let again = store.resolve_experiment(&ids[0]).await.expect("by id");
    assert_eq!(again.name, "sweep-1");
    assert_eq!(
        store.resolve_experiment("0").await.expect("default").name,
        "Default"
    );
}

pub async fn an_empty_experiment_name_is_invalid(store: DynStore) {
    match store.create_experiment("  ").await {
        Err(StoreError::Invalid { field, .. }) => assert_eq!(field, "name"),
        other => panic!("expected invalid, got {other:?}"),
    }
}
