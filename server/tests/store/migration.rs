//! The migration to numeric experiment ids: a database made before it (experiments with 32-hex
//! ids, their runs and grants) comes out with experiments 1, 2, ... in creation order, and
//! everything that pointed at them points at the new ids.

use std::path::PathBuf;

use sqlx::migrate::Migrator;
use sqlx::{Connection, Executor};

use crate::kit::ScratchDb;

/// The migrations of a backend that came before `first_excluded`, copied to a folder of their own.
fn migrations_before(backend: &str, first_excluded: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../migrations/{backend}"));
    for entry in std::fs::read_dir(&source).expect("migrations") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if name.as_str() < first_excluded {
            std::fs::copy(&path, dir.path().join(&name)).expect("copy");
        }
    }
    dir
}

const OLD_ROWS: &str = "\
    INSERT INTO experiments (id, name, created_at, owner_id) VALUES \
      ('ffffffffffffffffffffffffffffffff', 'first', 10, '00000000000000000000000000000001'), \
      ('00000000000000000000000000000abc', 'second', 20, '00000000000000000000000000000001'); \
    INSERT INTO runs (id, experiment_id, name, status, created_at) VALUES \
      ('11111111111111111111111111111111', 'ffffffffffffffffffffffffffffffff', 'a', 'finished', 11), \
      ('22222222222222222222222222222222', '00000000000000000000000000000abc', 'b', 'finished', 21), \
      ('33333333333333333333333333333333', '0', 'c', 'finished', 5); \
    INSERT INTO teams (id, name, created_at) VALUES ('t1', 'nlp', 1); \
    INSERT INTO experiment_grants (experiment_id, subject_kind, subject_id, level) VALUES \
      ('00000000000000000000000000000abc', 'team', 't1', 'read');";

async fn check(url: &str) {
    let store = trainyard::store::connect(url)
        .await
        .expect("migrated store");
    let experiments = store
        .list_experiments(trainyard::store::Lifecycle::All)
        .await
        .expect("experiments");
    let ids: Vec<(&str, &str)> = experiments
        .iter()
        .map(|e| (e.id.as_str(), e.name.as_str()))
        .collect();
    assert_eq!(ids, [("0", "Default"), ("1", "first"), ("2", "second")]);
    for (run, experiment) in [
        ("11111111111111111111111111111111", "1"),
        ("22222222222222222222222222222222", "2"),
        ("33333333333333333333333333333333", "0"),
    ] {
        assert_eq!(
            store.get_run(run).await.expect("run").experiment_id,
            experiment
        );
    }
    let grants = store.list_grants("2").await.expect("grants");
    assert_eq!(grants.len(), 1, "the grant follows its experiment");
    // The next experiment continues the numbering.
    let next = store.create_experiment("third").await.expect("create");
    assert_eq!(next.id, "3");
}

/// A SQLite database (a file in `dir`) at the schema before `first_excluded`, holding `rows`;
/// its URL.
async fn old_sqlite(dir: &tempfile::TempDir, first_excluded: &str, rows: &str) -> String {
    let url = format!("sqlite:{}?mode=rwc", dir.path().join("old.db").display());
    let old = migrations_before("sqlite", first_excluded);
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect");
    let migrator = Migrator::new(old.path()).await.expect("old migrations");
    migrator.run(&mut conn).await.expect("old schema");
    conn.execute(rows).await.expect("old rows");
    conn.close().await.expect("close");
    url
}

/// Brings an empty Postgres database to the schema before `first_excluded` and adds `rows`.
async fn old_postgres(url: &str, first_excluded: &str, rows: &str) {
    let old = migrations_before("postgres", first_excluded);
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    let migrator = Migrator::new(old.path()).await.expect("old migrations");
    migrator.run(&mut conn).await.expect("old schema");
    conn.execute(rows).await.expect("old rows");
    conn.close().await.expect("close");
}

#[tokio::test]
async fn hex_experiment_ids_become_numbers_on_sqlite() {
    let dir = tempfile::tempdir().expect("dir");
    check(&old_sqlite(&dir, "20261220000000", OLD_ROWS).await).await;
}

#[tokio::test]
async fn hex_experiment_ids_become_numbers_on_postgres() {
    let db = ScratchDb::create("trainyard_migration_test").await;
    old_postgres(&db.url, "20261220000000", OLD_ROWS).await;
    check(&db.url).await;
}

/// Two runs whose points were numbered by one sequence, interleaved, across the migration's
/// blocks of 1,024 seqs.
const OLD_POINTS: &str = "\
    INSERT INTO runs (id, experiment_id, name, status, created_at) VALUES \
      ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', '0', 'a', 'running', 1), \
      ('bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', '0', 'b', 'running', 2); \
    INSERT INTO metric_series (id, run_id, key, count, last_step, last_value, last_time) VALUES \
      (1, 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'loss', 3, 2, 0.5, 102), \
      (2, 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', 'loss', 2, 1, 9.0, 201), \
      (3, 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'acc', 1, 0, 0.1, 100); \
    INSERT INTO metric_points (seq, series_id, step, value, time) VALUES \
      (1020, 1, 0, 1.0, 100), (1021, 3, 0, 0.1, 100), (1022, 2, 0, 8.0, 200), \
      (1023, 1, 1, 0.7, 101), (1024, 2, 1, 9.0, 201), (1025, 1, 2, 0.5, 102);";

/// After the migration to per-run seqs, the points stored before keep their seqs (a live
/// client's position stays valid), and the run's next points are numbered above them.
async fn check_points(url: &str) {
    let store = trainyard::store::connect(url)
        .await
        .expect("migrated store");
    let a = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let seqs = |points: &[trainyard::store::StoredPoint]| -> Vec<(String, i64, i64)> {
        points
            .iter()
            .map(|p| (p.key.clone(), p.step, p.seq))
            .collect()
    };
    let all = store.points_since(a, None, None, 100).await.expect("all");
    let old = [
        ("loss", 0, 1020),
        ("acc", 0, 1021),
        ("loss", 1, 1023),
        ("loss", 2, 1025),
    ];
    let old: Vec<_> = old
        .iter()
        .map(|(k, s, q)| (k.to_string(), *s, *q))
        .collect();
    assert_eq!(seqs(&all), old);
    let rest = store
        .points_since(a, Some(1021), None, 100)
        .await
        .expect("rest");
    assert_eq!(seqs(&rest), old[2..]);
    let stored = store
        .append_points(
            a,
            &[
                trainyard::store::MetricPoint {
                    key: "loss".into(),
                    step: 3,
                    value: 0.4,
                    time: Some(103),
                },
                trainyard::store::MetricPoint {
                    key: "acc".into(),
                    step: 3,
                    value: 0.2,
                    time: Some(103),
                },
            ],
            0,
        )
        .await
        .expect("append")
        .stored;
    assert!(
        stored.iter().all(|p| p.seq > 1025),
        "new seqs follow the old ones"
    );
    let new = store
        .points_since(a, Some(1025), None, 100)
        .await
        .expect("new");
    assert_eq!(new, stored);
    let history = store
        .metric_history(a, "loss", None, 100)
        .await
        .expect("history");
    let steps: Vec<i64> = history.iter().map(|p| p.step).collect();
    assert_eq!(steps, [0, 1, 2, 3]);
    let b = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    let b_points = store
        .points_since(b, Some(1022), None, 100)
        .await
        .expect("b");
    assert_eq!(seqs(&b_points), [("loss".to_string(), 1, 1024)]);
}

#[tokio::test]
async fn points_keep_their_seqs_through_the_per_run_numbering_on_sqlite() {
    let dir = tempfile::tempdir().expect("dir");
    check_points(&old_sqlite(&dir, "20270101000000", OLD_POINTS).await).await;
}

#[tokio::test]
async fn points_keep_their_seqs_through_the_per_run_numbering_on_postgres() {
    let db = ScratchDb::create("trainyard_migration_test").await;
    old_postgres(&db.url, "20270101000000", OLD_POINTS).await;
    check_points(&db.url).await;
}
