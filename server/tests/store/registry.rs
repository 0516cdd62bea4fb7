//! The model registry: models, versions numbered per model and never reused, tags, aliases.

use std::collections::BTreeMap;

use trainyard::store::models::{ModelQuery, NewModel, NewVersion, VersionQuery};
use trainyard::store::{DynStore, NewRun, StoreError};

fn new_model(name: &str, experiment_id: &str) -> NewModel {
    NewModel {
        name: name.into(),
        experiment_id: experiment_id.into(),
        description: "a model".into(),
        tags: BTreeMap::from([("task".to_string(), "lm".to_string())]),
        created_by: None,
    }
}

fn from_run(run_id: &str, source: &str) -> NewVersion {
    NewVersion {
        run_id: Some(run_id.into()),
        source: source.into(),
        ..NewVersion::default()
    }
}

async fn a_run(store: &DynStore) -> String {
    store
        .create_run(NewRun {
            experiment_id: "0".into(),
            ..NewRun::default()
        })
        .await
        .expect("run")
        .id
}

pub async fn registry_models_have_unique_names_tags_and_a_description(store: DynStore) {
    let created = store
        .create_model(new_model("gpt-small", "0"))
        .await
        .expect("create");
    assert_eq!(created.name, "gpt-small");
    assert_eq!(created.experiment_id, "0");
    assert_eq!(created.tags["task"], "lm");
    assert_eq!(created.last_version, 0);
    match store.create_model(new_model("gpt-small", "0")).await {
        Err(StoreError::Conflict { field, .. }) => assert_eq!(field, Some("name")),
        other => panic!("expected a conflict, got {other:?}"),
    }
    match store.create_model(new_model("elsewhere", "404")).await {
        Err(StoreError::NotFound { entity, .. }) => assert_eq!(entity, "experiment"),
        other => panic!("expected the experiment not found, got {other:?}"),
    }
    store
        .set_model_description("gpt-small", "the small one")
        .await
        .expect("describe");
    store
        .set_model_tag("gpt-small", "owner", "ml")
        .await
        .expect("tag");
    store
        .set_model_tag("gpt-small", "task", "chat")
        .await
        .expect("tag again");
    store
        .delete_model_tag("gpt-small", "owner")
        .await
        .expect("untag");
    assert!(matches!(
        store.delete_model_tag("gpt-small", "owner").await,
        Err(StoreError::NotFound { .. })
    ));
    let read = store.get_model("gpt-small").await.expect("get");
    assert_eq!(read.description, "the small one");
    assert_eq!(
        read.tags,
        BTreeMap::from([("task".to_string(), "chat".to_string())])
    );
    assert!(read.updated_at >= read.created_at);

    let renamed = store
        .rename_model("gpt-small", "gpt-tiny")
        .await
        .expect("rename");
    assert_eq!(renamed.tags["task"], "chat");
    assert!(matches!(
        store.get_model("gpt-small").await,
        Err(StoreError::NotFound { .. })
    ));
    store
        .create_model(new_model("other", "0"))
        .await
        .expect("other");
    match store.rename_model("other", "gpt-tiny").await {
        Err(StoreError::Conflict { field, .. }) => assert_eq!(field, Some("name")),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let listed: Vec<String> = store
        .list_models(&ModelQuery::default())
        .await
        .expect("list")
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(listed, ["gpt-tiny", "other"]);
    let hidden = store
        .list_models(&ModelQuery {
            experiments: Some(vec!["7".into()]),
            name: None,
        })
        .await
        .expect("list in another experiment");
    assert!(hidden.is_empty());
}

pub async fn registry_version_numbers_grow_per_model_and_are_never_reused(store: DynStore) {
    let run = a_run(&store).await;
    store.create_model(new_model("a", "0")).await.expect("a");
    store.create_model(new_model("b", "0")).await.expect("b");
    let v1 = store
        .create_version("a", from_run(&run, "checkpoint:step-100"))
        .await
        .expect("v1");
    let v2 = store
        .create_version("a", from_run(&run, "checkpoint:step-200"))
        .await
        .expect("v2");
    let b1 = store
        .create_version("b", from_run(&run, "mlflow-artifacts:/0/x/artifacts/model"))
        .await
        .expect("b1");
    assert_eq!((v1.version, v2.version, b1.version), (1, 2, 1));
    assert_eq!(v2.status, "READY");
    assert_eq!(v2.run_id.as_deref(), Some(run.as_str()));
    assert_eq!(v2.source, "checkpoint:step-200");
    store.delete_version("a", 2).await.expect("delete v2");
    assert!(matches!(
        store.get_version("a", 2).await,
        Err(StoreError::NotFound {
            entity: "model version",
            ..
        })
    ));
    assert!(matches!(
        store.delete_version("a", 2).await,
        Err(StoreError::NotFound { .. })
    ));
    let v3 = store
        .create_version("a", from_run(&run, "checkpoint:step-300"))
        .await
        .expect("v3");
    assert_eq!(v3.version, 3, "a deleted number is not handed out again");
    assert!(matches!(
        store.create_version("nope", from_run(&run, "x")).await,
        Err(StoreError::NotFound {
            entity: "registered model",
            ..
        })
    ));

    let of_a: Vec<i64> = store
        .list_versions(&VersionQuery {
            model: Some("a".into()),
            ..VersionQuery::default()
        })
        .await
        .expect("versions")
        .iter()
        .map(|v| v.version)
        .collect();
    assert_eq!(of_a, [3, 1], "newest first");
    let of_run = store
        .list_versions(&VersionQuery {
            run_id: Some(run.clone()),
            ..VersionQuery::default()
        })
        .await
        .expect("versions of the run");
    assert_eq!(of_run.len(), 3);
    assert_eq!(of_run[0].model, "a");

    // Racing creations get distinct, consecutive numbers.
    let mut tasks = Vec::new();
    for i in 0..6 {
        let store = store.clone();
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            store
                .create_version("b", from_run(&run, &format!("checkpoint:step-{i}")))
                .await
        }));
    }
    let mut numbers = Vec::new();
    for t in tasks {
        numbers.push(t.await.expect("task").expect("version").version);
    }
    numbers.sort_unstable();
    assert_eq!(numbers, [2, 3, 4, 5, 6, 7]);
}

pub async fn registry_aliases_name_one_version_and_move(store: DynStore) {
    let run = a_run(&store).await;
    store.create_model(new_model("m", "0")).await.expect("m");
    for step in [1, 2] {
        store
            .create_version("m", from_run(&run, &format!("checkpoint:step-{step}")))
            .await
            .expect("version");
    }
    store.set_alias("m", "champion", 1).await.expect("alias");
    assert_eq!(
        store
            .version_by_alias("m", "champion")
            .await
            .expect("by alias")
            .version,
        1
    );
    store.set_alias("m", "champion", 2).await.expect("move");
    store.set_alias("m", "previous", 1).await.expect("second");
    let champion = store
        .version_by_alias("m", "champion")
        .await
        .expect("moved");
    assert_eq!(champion.version, 2);
    assert_eq!(champion.aliases, ["champion"]);
    let model = store.get_model("m").await.expect("model");
    assert_eq!(
        model.aliases,
        BTreeMap::from([("champion".to_string(), 2), ("previous".to_string(), 1)])
    );
    assert!(matches!(
        store.set_alias("m", "ghost", 9).await,
        Err(StoreError::NotFound {
            entity: "model version",
            ..
        })
    ));
    // Deleting a version takes its aliases with it.
    store.delete_version("m", 1).await.expect("delete v1");
    assert!(matches!(
        store.version_by_alias("m", "previous").await,
        Err(StoreError::NotFound {
            entity: "model alias",
            ..
        })
    ));
    store.delete_alias("m", "champion").await.expect("unalias");
    assert!(matches!(
        store.delete_alias("m", "champion").await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(store
        .get_model("m")
        .await
        .expect("model")
        .aliases
        .is_empty());
}

pub async fn registry_version_tags_and_descriptions_and_model_deletion(store: DynStore) {
    let run = a_run(&store).await;
    store.create_model(new_model("m", "0")).await.expect("m");
    let v = store
        .create_version(
            "m",
            NewVersion {
                run_id: Some(run.clone()),
                source: "checkpoint:step-5".into(),
                description: "first".into(),
                tags: BTreeMap::from([("stage".to_string(), "dev".to_string())]),
                created_by: None,
            },
        )
        .await
        .expect("version");
    assert_eq!(v.tags["stage"], "dev");
    assert_eq!(v.description, "first");
    store
        .set_version_tag("m", 1, "stage", "prod")
        .await
        .expect("retag");
    store
        .set_version_tag("m", 1, "eval", "0.91")
        .await
        .expect("tag");
    store
        .delete_version_tag("m", 1, "eval")
        .await
        .expect("untag");
    store
        .set_version_description("m", 1, "promoted")
        .await
        .expect("describe");
    assert!(matches!(
        store.set_version_tag("m", 7, "k", "v").await,
        Err(StoreError::NotFound {
            entity: "model version",
            ..
        })
    ));
    let read = store.get_version("m", 1).await.expect("read");
    assert_eq!(
        read.tags,
        BTreeMap::from([("stage".to_string(), "prod".to_string())])
    );
    assert_eq!(read.description, "promoted");
    store.set_alias("m", "champion", 1).await.expect("alias");

    store.delete_model("m").await.expect("delete");
    assert!(matches!(
        store.get_model("m").await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(store
        .list_versions(&VersionQuery::default())
        .await
        .expect("versions")
        .is_empty());
    // The name is free again, and numbering starts over for the new model.
    store
        .create_model(new_model("m", "0"))
        .await
        .expect("again");
    let again = store
        .create_version("m", from_run(&run, "checkpoint:step-9"))
        .await
        .expect("version");
    assert_eq!(again.version, 1);
    assert!(again.tags.is_empty() && again.aliases.is_empty());
    // The run the versions came from is untouched.
    store.get_run(&run).await.expect("the run is still there");
}
