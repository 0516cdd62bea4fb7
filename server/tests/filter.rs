//! The run-search language executed against real SQLite and Postgres databases: every filter
//! must select exactly the same runs on both.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{PgPool, SqlitePool};
use std::str::FromStr;
use trainyard::store::filter::Filter;
use trainyard::store::sql::{Conn, Dialect, Sql};

const SCHEMA: &str = "
CREATE TABLE experiments (id TEXT PRIMARY KEY, name TEXT UNIQUE NOT NULL, created_at BIGINT NOT NULL);
CREATE TABLE runs (
    id TEXT PRIMARY KEY, experiment_id TEXT NOT NULL REFERENCES experiments(id), name TEXT NOT NULL,
    status TEXT NOT NULL, created_at BIGINT NOT NULL, started_at BIGINT NULL, ended_at BIGINT NULL,
    config TEXT NULL, notes TEXT NOT NULL DEFAULT '', exit_code INTEGER NULL,
    exit_signal INTEGER NULL, exit_message TEXT NULL);
CREATE TABLE run_tags (run_id TEXT, key TEXT, value TEXT NOT NULL, PRIMARY KEY (run_id, key));
CREATE TABLE run_params (run_id TEXT, key TEXT, value TEXT NOT NULL, num {REAL} NULL,
    PRIMARY KEY (run_id, key));
CREATE TABLE metric_series (run_id TEXT, key TEXT, count BIGINT, last_step BIGINT,
    last_value {REAL}, last_time BIGINT, UNIQUE (run_id, key));
";

// Test fixtures only: no user input reaches these statements.
const FIXTURES: &str = "
INSERT INTO experiments VALUES ('0', 'Default', 0), ('1', 'scaling', 0);
INSERT INTO runs (id, experiment_id, name, status, created_at, started_at, ended_at) VALUES
    ('r1', '0', 'gpt-small', 'finished', 1000, 1100, 2000),
    ('r2', '0', 'gpt-large', 'failed',   2000, 2100, 2500),
    ('r3', '1', 'GPT-tiny',  'running',  3000, 3100, NULL),
    ('r4', '1', 'baseline',  'created',  4000, NULL, NULL);
INSERT INTO run_params VALUES
    ('r1', 'training.lr', '0.001', 0.001), ('r1', 'model.activation', 'gelu', NULL),
    ('r1', 'model.n_layer', '6', 6),
    ('r2', 'training.lr', '0.0003', 0.0003), ('r2', 'model.activation', 'swiglu', NULL),
    ('r2', 'model.n_layer', '24', 24),
    ('r3', 'training.lr', '1e-3', 0.001), ('r3', 'model.activation', 'relu', NULL),
    ('r3', 'note', '50% off', NULL);
INSERT INTO run_tags VALUES
    ('r1', 'team', 'nlp'), ('r1', 'owner', 'Ann'),
    ('r2', 'team', 'vision'),
    ('r3', 'team', 'NLP'), ('r3', 'owner', 'bob'),
    ('r4', 'owner', '[x]*?');
INSERT INTO metric_series VALUES
    ('r1', 'val/loss', 10, 9, 2.1, 0), ('r1', 'train/loss', 10, 9, 2.0, 0),
    ('r1', 'my key', 1, 0, 5, 0),
    ('r2', 'val/loss', 10, 9, 3.2, 0), ('r2', 'train/loss', 10, 9, 3.5, 0),
    ('r3', 'train/loss', 10, 9, 4.0, 0);
";

/// (filter, ids of the runs it must select)
const CASES: &[(&str, &[&str])] = &[
    (
        "metrics.val/loss < 2.5 and params.training.lr = 0.001",
        &["r1"],
    ),
    // Numeric comparison uses the parsed number: '1e-3' equals 0.001.
    ("params.training.lr = 0.001", &["r1", "r3"]),
    ("params.training.lr = '0.001'", &["r1"]),
    ("params.training.lr != 0.001", &["r2"]),
    ("params.training.lr < 1e-3", &["r2"]),
    ("params.model.n_layer > 10", &["r2"]),
    // Text order: '6' > '10'.
    ("params.model.n_layer > '10'", &["r1", "r2"]),
    (
        "tags.team = 'nlp' or status != 'failed'",
        &["r1", "r3", "r4"],
    ),
    ("status = 'FINISHED'", &["r1"]),
    ("status in ('running', 'created')", &["r3", "r4"]),
    ("status not in ('running', 'created')", &["r1", "r2"]),
    ("name = 'gpt-small'", &["r1"]),
    ("name LIKE 'gpt%'", &["r1", "r2"]),
    ("name ILIKE 'gpt%'", &["r1", "r2", "r3"]),
    ("name NOT LIKE 'gpt%'", &["r3", "r4"]),
    ("name not ilike 'GPT%'", &["r4"]),
    ("name like 'gpt-_____'", &["r1", "r2"]),
    ("name like 'GPT-____'", &["r3"]),
    (
        "params.model.activation IN ('gelu', 'swiglu')",
        &["r1", "r2"],
    ),
    // A missing key is false for every operator, NOT IN and != included.
    ("params.model.activation NOT IN ('gelu')", &["r2", "r3"]),
    ("tags.team != 'nlp'", &["r2", "r3"]),
    ("metrics.val/loss != 2.1", &["r2"]),
    ("metrics.train/loss >= 3", &["r2", "r3"]),
    ("not (metrics.train/loss >= 3)", &["r1", "r4"]),
    ("metrics.val/loss in (2.1, 3.2)", &["r1", "r2"]),
    ("metrics.val/loss not in (2.1)", &["r2"]),
    ("metrics.`my key` > 1", &["r1"]),
    ("metrics.`my key` > 5", &[]),
    ("metrics.val/loss > -1e3", &["r1", "r2"]),
    ("metrics.val/loss is null", &["r3", "r4"]),
    ("tags.owner IS NULL", &["r2"]),
    ("tags.owner IS NOT NULL", &["r1", "r3", "r4"]),
    // Code-point order on both backends: 'A' < '[' < 'a' < 'b'.
    ("tags.owner < 'a'", &["r1", "r4"]),
    ("tags.owner >= 'B'", &["r3", "r4"]),
    // GLOB's special characters are plain characters in a LIKE pattern.
    ("tags.owner like '[x]*?'", &["r4"]),
    ("tags.owner like '[x]%'", &["r4"]),
    ("tags.owner like '_x_*_'", &["r4"]),
    ("tags.owner like 'ann'", &[]),
    ("tags.owner ilike 'ANN'", &["r1"]),
    ("tags.team ilike 'nlp'", &["r1", "r3"]),
    (r"params.note like '50\%%'", &["r3"]),
    (r"params.note like '50\%'", &[]),
    ("params.note like '50%'", &["r3"]),
    ("ended_at IS NULL", &["r3", "r4"]),
    ("ended_at > 1000", &["r1", "r2"]),
    // A null column fails the comparison, and NOT of it holds.
    ("not ended_at > 2200", &["r1", "r3", "r4"]),
    ("started_at >= 2100", &["r2", "r3"]),
    ("created_at <= 2000", &["r1", "r2"]),
    ("created_at > 1500.5", &["r2", "r3", "r4"]),
    ("created_at in (1000, 4000)", &["r1", "r4"]),
    ("experiment_id = '1'", &["r3", "r4"]),
    ("run_id = 'r2' or attributes.run_id = 'r4'", &["r2", "r4"]),
    // AND binds tighter than OR.
    (
        "status = 'running' or status = 'failed' and metrics.val/loss < 3",
        &["r3"],
    ),
    (
        "(status = 'running' or status = 'failed') and metrics.val/loss < 3",
        &[],
    ),
    (
        "(tags.team = 'nlp' or tags.team = 'vision') and metrics.val/loss > 3",
        &["r2"],
    ),
    ("tags.team = 'x'' OR 1=1 --'", &[]),
];

async fn sqlite() -> SqlitePool {
    // One connection: every connection to `:memory:` is a separate database.
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .expect("open SQLite in memory");
    sqlx::raw_sql(&SCHEMA.replace("{REAL}", "REAL"))
        .execute(&pool)
        .await
        .expect("create SQLite schema");
    sqlx::raw_sql(FIXTURES)
        .execute(&pool)
        .await
        .expect("insert SQLite fixtures");
    pool
}

/// A fresh database on the test server; returns its pool and name. Fails when Postgres is
/// unreachable: these tests never skip silently.
async fn postgres() -> (PgPool, PgPool, String) {
    let url = std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
    let admin_opts = PgConnectOptions::from_str(&url).expect("parse TEST_DATABASE_URL");
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(admin_opts.clone())
        .await
        .unwrap_or_else(|e| panic!("Postgres at {url} is unreachable: {e}"));
    let name = format!("trainyard_filter_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .expect("create test database");
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(admin_opts.database(&name))
        .await
        .expect("connect to the test database");
    sqlx::raw_sql(&SCHEMA.replace("{REAL}", "DOUBLE PRECISION"))
        .execute(&pool)
        .await
        .expect("create Postgres schema");
    sqlx::raw_sql(FIXTURES)
        .execute(&pool)
        .await
        .expect("insert Postgres fixtures");
    (admin, pool, name)
}

async fn drop_postgres(admin: PgPool, pool: PgPool, name: String) {
    pool.close().await;
    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&admin)
        .await
        .expect("drop test database");
}

const SELECT: &str = "SELECT r.id FROM runs r WHERE ";

/// The runs a filter selects, through the store's own SQL layer.
async fn select(mut conn: Conn, dialect: Dialect, filter: &Filter) -> Vec<String> {
    let mut sql = Sql::new(SELECT);
    filter.push(&mut sql, dialect);
    sql.push(" ORDER BY r.id");
    let text = sql.text().to_string();
    let rows = conn
        .fetch_all(sql)
        .await
        .unwrap_or_else(|e| panic!("{dialect:?} rejected `{text}`: {e}"));
    rows.iter()
        .map(|r| r.get::<String>(0).expect("run id"))
        .collect()
}

async fn select_sqlite(pool: &SqlitePool, filter: &Filter) -> Vec<String> {
    let conn = Conn::Sqlite(pool.acquire().await.expect("SQLite connection"));
    select(conn, Dialect::Sqlite, filter).await
}

async fn select_postgres(pool: &PgPool, filter: &Filter) -> Vec<String> {
    let conn = Conn::Postgres(pool.acquire().await.expect("Postgres connection"));
    select(conn, Dialect::Postgres, filter).await
}

fn parsed(input: &str) -> Filter {
    Filter::parse(input).unwrap_or_else(|e| panic!("`{input}` should parse: {e}"))
}

#[tokio::test]
async fn every_filter_selects_exactly_the_expected_runs_on_sqlite() {
    let pool = sqlite().await;
    let mut failures = Vec::new();
    for (input, expected) in CASES {
        let got = select_sqlite(&pool, &parsed(input)).await;
        if got != *expected {
            failures.push(format!("`{input}`: expected {expected:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn every_filter_selects_exactly_the_expected_runs_on_postgres() {
    let (admin, pool, name) = postgres().await;
    let mut failures = Vec::new();
    for (input, expected) in CASES {
        let got = select_postgres(&pool, &parsed(input)).await;
        if got != *expected {
            failures.push(format!("`{input}`: expected {expected:?}, got {got:?}"));
        }
    }
    drop_postgres(admin, pool, name).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn hostile_keys_and_values_are_data_not_sql_on_both_backends() {
    let hostile = [
        "tags.`x'); DROP TABLE runs; --` = 'y'",
        "tags.team = 'nlp''); DELETE FROM runs; --'",
        "name like '%'' OR ''1''=''1'",
        "params.`a\" OR 1=1 --` in ('x', 'y''; DROP TABLE run_params; --')",
    ];
    let lite = sqlite().await;
    let (admin, pg, name) = postgres().await;
    for input in hostile {
        let f = parsed(input);
        assert!(select_sqlite(&lite, &f).await.is_empty(), "{input}");
        assert!(select_postgres(&pg, &f).await.is_empty(), "{input}");
    }
    let all = parsed("run_id like '%'");
    assert_eq!(select_sqlite(&lite, &all).await, ["r1", "r2", "r3", "r4"]);
    assert_eq!(select_postgres(&pg, &all).await, ["r1", "r2", "r3", "r4"]);
    let params = parsed("params.training.lr is not null");
    assert_eq!(select_sqlite(&lite, &params).await, ["r1", "r2", "r3"]);
    assert_eq!(select_postgres(&pg, &params).await, ["r1", "r2", "r3"]);
    drop_postgres(admin, pg, name).await;
}
