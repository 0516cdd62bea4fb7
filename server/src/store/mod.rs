//! The tracking store: one interface, two databases (SQLite embedded default, Postgres for
//! teams), one implementation (`SqlStore`). Both pass one shared test suite; a behaviour
//! difference between them is a bug.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
pub use trainer::wire::{MetricPoint, RunStatus};

/// Name of the experiment runs land in when none is given (MLflow has one too).
pub const DEFAULT_EXPERIMENT: &str = "Default";

/// Most points one `append_points` call (one HTTP request) may carry (the trainer's reporter
/// splits its batches at the same constant).
pub use trainer::wire::MAX_POINTS_PER_BATCH;

pub use crate::validate::flatten_params;
pub use crate::validate::inputs::RunInput;
pub use crate::validate::limits::MAX_STEP;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Experiment {
    /// A number as a string: `"0"` is the Default experiment, then 1, 2, ... (as MLflow's).
    pub id: String,
    pub name: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// The last time its name, tags or deletion changed (its creation until then).
    pub updated_at: i64,
    /// Set while the experiment is deleted (MLflow's soft deletion; it can be restored).
    pub deleted_at: Option<i64>,
    /// Free-form key/value pairs (MLflow's experiment tags).
    pub tags: BTreeMap<String, String>,
}

/// How a run's process ended (filled by the launcher or a reporting client).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExitInfo {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Last lines of the log, or a human-readable reason ("lost", "stopped by user").
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LatestMetric {
    pub step: i64,
    pub value: f64,
    /// Unix milliseconds of that point.
    pub time: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Run {
    /// 32 lowercase hex characters (MLflow-compatible string id).
    pub id: String,
    pub name: String,
    pub experiment_id: String,
    #[schema(value_type = String)]
    pub status: RunStatus,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    /// Resolved config (JSON object) or null until a client sends it.
    pub config: Option<serde_json::Value>,
    /// Config flattened to dotted keys (`training.lr` → "0.001"); write-once.
    pub params: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    pub notes: String,
    pub exit: Option<ExitInfo>,
    /// Latest point (highest step) of every metric key.
    pub latest_metrics: BTreeMap<String, LatestMetric>,
    /// The name of the user who created the run (none on a server without accounts, and for
    /// runs created with the admin token).
    pub created_by: Option<String>,
    /// Set while the run is deleted (soft deletion through the MLflow API; it can be restored).
    /// Searches leave deleted runs out unless asked for them.
    pub deleted_at: Option<i64>,
}

#[derive(Debug, Clone, Default)]
pub struct NewRun {
    /// Experiment id (already resolved by the caller).
    pub experiment_id: String,
    /// Generated (`run-<short id>`) when absent.
    pub name: Option<String>,
    pub config: Option<serde_json::Value>,
    pub tags: BTreeMap<String, String>,
    /// `created` for a tracked run, `queued` for one the launcher will start.
    pub status: Option<RunStatus>,
    /// The id of the user creating it.
    pub created_by: Option<String>,
}

/// A partial update; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct RunUpdate {
    pub name: Option<String>,
    /// Merged into the existing tags (a key with an empty value is kept as empty).
    pub tags: Option<BTreeMap<String, String>>,
    pub notes: Option<String>,
    /// Write-once: setting a config that differs from a stored one is `StoreError::Conflict`.
    pub config: Option<serde_json::Value>,
}

/// A status change or other lifecycle event; `seq` orders all events of the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunEvent {
    pub seq: i64,
    pub run_id: String,
    pub time: i64,
    #[schema(value_type = Option<String>)]
    pub from_status: Option<RunStatus>,
    #[schema(value_type = String)]
    pub to_status: RunStatus,
    pub reason: Option<String>,
}

/// A stored point as read back, with its insertion sequence (for SSE resume).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StoredPoint {
    pub key: String,
    pub step: i64,
    /// NaN is written as `null` in JSON.
    #[serde(deserialize_with = "trainer::wire::nan_as_null::deserialize")]
    #[schema(nullable)]
    pub value: f64,
    pub time: i64,
    /// Monotonic per run (numbered by the run, in commit order); a client that saw `seq = n`
    /// has seen every point of that run with a smaller seq.
    pub seq: i64,
}

/// A point of a request that was not stored because its (key, step) holds another value, which
/// is kept (the first value wins; re-sending a point never changes it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Conflict {
    pub key: String,
    pub step: i64,
    /// The value the store keeps (`null`: NaN).
    #[serde(deserialize_with = "trainer::wire::nan_as_null::deserialize")]
    pub stored_value: f64,
    /// The value the request sent (ignored; `null`: NaN).
    #[serde(deserialize_with = "trainer::wire::nan_as_null::deserialize")]
    pub sent_value: f64,
}

/// The extremes of one run's metric.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricExtremes {
    pub run_id: String,
    pub key: String,
    pub min: f64,
    pub max: f64,
}

/// What `append_points` did with a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Appended {
    /// The points newly stored, with their seq, in input order.
    pub stored: Vec<StoredPoint>,
    /// Points whose (key, step) already had another value, in input order (a point repeated
    /// within the batch with another value counts too).
    pub conflicts: Vec<Conflict>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SeriesPoint {
    pub step: i64,
    /// NaN is written as `null` in JSON (the chart draws a gap there).
    #[serde(deserialize_with = "trainer::wire::nan_as_null::deserialize")]
    #[schema(nullable)]
    pub value: f64,
    pub time: i64,
}

/// Result of a series read: all points when `total <= max_points`, else at most `max_points`
/// points that keep each bucket's min and max.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Series {
    pub key: String,
    /// Points of the key in the requested step range (before downsampling).
    pub total: i64,
    pub downsampled: bool,
    pub points: Vec<SeriesPoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct MetricKey {
    pub key: String,
    /// Points stored, NaN ones included.
    pub count: i64,
    /// Step of the latest finite point; -1 when every point is NaN.
    pub last_step: i64,
    /// The latest finite value; NaN (`null` in JSON) when every point is NaN.
    #[serde(deserialize_with = "trainer::wire::nan_as_null::deserialize")]
    #[schema(nullable)]
    pub last_value: f64,
}

/// The two kinds of run keys a search can name (`params.<key>`, `metrics.<key>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Param,
    Metric,
}

impl KeyKind {
    /// The prefix a search writes before the key.
    pub fn prefix(self) -> &'static str {
        match self {
            KeyKind::Param => "params",
            KeyKind::Metric => "metrics",
        }
    }
}

/// Most keys of one kind `Store::known_keys` returns.
pub const MAX_KNOWN_KEYS: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortDir {
    Asc,
    Desc,
}

/// What a run search sorts by.
#[derive(Debug, Clone, PartialEq)]
pub enum SortKey {
    CreatedAt,
    Name,
    Status,
    /// `params.<key>` (numeric when both sides are numbers).
    Param(String),
    /// `metrics.<key>`: the latest value.
    Metric(String),
}

#[derive(Debug, Clone)]
pub struct RunQuery {
    pub experiment_id: Option<String>,
    pub status: Option<RunStatus>,
    /// `key` or `key=value`.
    pub tag: Option<String>,
    /// Parsed `q` filter.
    pub filter: Option<filter::Filter>,
    pub sort: SortKey,
    pub dir: SortDir,
    /// 1..=1000.
    pub limit: usize,
    /// Opaque cursor from the previous page.
    pub cursor: Option<String>,
    /// Only runs of these experiments (the ones the caller may read); `None`: every run.
    pub visible_experiments: Option<Vec<String>>,
    /// Active runs (the default), deleted ones, or both.
    pub lifecycle: Lifecycle,
}

/// Which runs or experiments a listing covers, by their soft deletion (MLflow's view type).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Lifecycle {
    #[default]
    Active,
    Deleted,
    All,
}

impl Lifecycle {
    /// The SQL condition on a table's `deleted_at` column (`alias.deleted_at`).
    pub fn condition(self, alias: &str) -> String {
        match self {
            Lifecycle::Active => format!("{alias}.deleted_at IS NULL"),
            Lifecycle::Deleted => format!("{alias}.deleted_at IS NOT NULL"),
            Lifecycle::All => "1 = 1".to_string(),
        }
    }
}

/// A statement a search ran and the database's plan of it.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct QueryPlan {
    pub statement: String,
    /// Postgres: the `EXPLAIN (ANALYZE, FORMAT JSON)` document; SQLite: the `detail` column of
    /// `EXPLAIN QUERY PLAN`, one step per line.
    pub plan: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunPage {
    pub runs: Vec<Run>,
    /// Pass back as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{entity} `{id}` not found")]
    NotFound { entity: &'static str, id: String },
    #[error("{message}")]
    Conflict {
        field: Option<&'static str>,
        message: String,
    },
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// A value that breaks one of the rules in `crate::validate` (a metric batch's points).
    #[error("{}: {}", .0.field, .0.message)]
    Rejected(crate::validate::Invalid),
    /// The database has no room for the write (its disk is full); nothing of it was stored.
    #[error("the database is out of disk space")]
    StorageFull(#[source] sqlx::Error),
    /// The database cannot be reached or cannot answer now (connection refused or lost, no
    /// free connection in time, the server shutting down); retrying later may succeed.
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    #[error(transparent)]
    Database(sqlx::Error),
    #[error(transparent)]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::Error as E;
        let unreachable = match &e {
            E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => true,
            E::Database(d) => {
                let code = d.code().unwrap_or_default();
                if d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                    // Primary result codes: SQLITE_FULL (13), SQLITE_BUSY (5: the busy timeout
                    // ran out), SQLITE_IOERR (10), SQLITE_CANTOPEN (14).
                    match code.parse::<i32>().map(|c| c & 0xff) {
                        Ok(13) => return StoreError::StorageFull(e),
                        Ok(5 | 10 | 14) => true,
                        _ => false,
                    }
                } else {
                    // SQLSTATE: disk_full; connection exceptions (class 08), admin or crash
                    // shutdown, cannot connect now, database dropped, too many connections.
                    match code.as_ref() {
                        "53100" => return StoreError::StorageFull(e),
                        "57P01" | "57P02" | "57P03" | "57P04" | "53300" => true,
                        c => c.starts_with("08"),
                    }
                }
            }
            _ => false,
        };
        if unreachable {
            StoreError::Unavailable(e)
        } else {
            StoreError::Database(e)
        }
    }
}

impl StoreError {
    /// Whether the error is the database's fault rather than the request's.
    pub fn is_database_fault(&self) -> bool {
        matches!(
            self,
            StoreError::Database(_)
                | StoreError::StorageFull(_)
                | StoreError::Unavailable(_)
                | StoreError::Migrate(_)
        )
    }
}

#[async_trait]
pub trait Store:
    accounts::Accounts + sweeps::Sweeps + models::Models + Send + Sync + 'static
{
    /// "sqlite" or "postgres".
    fn backend(&self) -> &'static str;

    async fn create_experiment(&self, name: &str) -> StoreResult<Experiment>;
    /// By id, then by name.
    async fn get_experiment(&self, id_or_name: &str) -> StoreResult<Experiment>;
    /// Id or name; a name that does not exist is created (concurrency-safe).
    async fn resolve_experiment(&self, id_or_name: &str) -> StoreResult<Experiment>;
    /// Oldest first.
    async fn list_experiments(&self, lifecycle: Lifecycle) -> StoreResult<Vec<Experiment>>;
    /// Soft-deletes (`deleted: true`) or restores an experiment; the Default experiment cannot
    /// be deleted.
    async fn set_experiment_deleted(&self, id: &str, deleted: bool) -> StoreResult<()>;
    async fn set_experiment_tag(&self, id: &str, key: &str, value: &str) -> StoreResult<()>;
    /// `NotFound` when the experiment has no such tag.
    async fn delete_experiment_tag(&self, id: &str, key: &str) -> StoreResult<()>;

    async fn create_run(&self, new: NewRun) -> StoreResult<Run>;
    async fn get_run(&self, id: &str) -> StoreResult<Run>;
    async fn update_run(&self, id: &str, update: RunUpdate) -> StoreResult<Run>;
    /// The one place a status changes: updates the run (started_at/ended_at, exit info) and
    /// records the event, atomically. Returns the event (the caller notifies the live hub).
    async fn set_status(
        &self,
        id: &str,
        status: RunStatus,
        reason: Option<&str>,
        exit: Option<ExitInfo>,
    ) -> StoreResult<RunEvent>;
    /// Replaces the run's exit information (None clears it) without a status change: the
    /// launcher records how a process ended after the trainer reported its own status.
    async fn set_exit(&self, id: &str, exit: Option<ExitInfo>) -> StoreResult<()>;
    async fn search_runs(&self, query: &RunQuery) -> StoreResult<RunPage>;
    /// `search_runs`, returning beside the page every statement it ran with the database's
    /// plan of it (the store suite checks that no search reads a whole table; `docs/search.md`
    /// shows them).
    #[doc(hidden)]
    async fn explain_search(&self, query: &RunQuery) -> StoreResult<(RunPage, Vec<QueryPlan>)>;
    /// Refreshes the planner's statistics of the run tables now, as the store does by itself
    /// after large writes.
    #[doc(hidden)]
    async fn refresh_statistics(&self) -> StoreResult<()>;
    /// Soft-deletes (`deleted: true`) or restores a run.
    async fn set_run_deleted(&self, id: &str, deleted: bool) -> StoreResult<()>;
    /// Puts a client's own start or end time (unix ms; `None` leaves it) in place of the one
    /// its status change stamped (MLflow's `create_run(start_time=)`,
    /// `set_terminated(end_time=)`). The caller checks the times are within bounds.
    async fn set_run_times(
        &self,
        id: &str,
        started_at: Option<i64>,
        ended_at: Option<i64>,
    ) -> StoreResult<()>;
    /// Adds params one by one (besides those a config brings). Write-once: a key the run has
    /// with the same value is fine, with another value a `Conflict` naming it (nothing of the
    /// call is stored then).
    async fn log_params(&self, id: &str, params: &[(String, String)]) -> StoreResult<()>;
    /// `NotFound` when the run has no such tag.
    async fn delete_tag(&self, id: &str, key: &str) -> StoreResult<()>;
    /// Records datasets a run used; one already recorded (same name and digest) is kept.
    async fn log_inputs(&self, id: &str, inputs: &[RunInput]) -> StoreResult<()>;
    async fn run_inputs(&self, id: &str) -> StoreResult<Vec<RunInput>>;
    /// Whether some run (of these experiments, when given: `None` is every run) has this
    /// param, or a point of this metric.
    async fn has_key(
        &self,
        kind: KeyKind,
        key: &str,
        experiments: Option<&[String]>,
    ) -> StoreResult<bool>;
    /// Every key of the kind some run (of these experiments, when given: `None` is every run)
    /// has, in order; at most `MAX_KNOWN_KEYS`.
    async fn known_keys(
        &self,
        kind: KeyKind,
        experiments: Option<&[String]>,
    ) -> StoreResult<Vec<String>>;

    /// One transaction; idempotent on (run, key, step) (first value wins). Points must already
    /// be validated (finite values, step in 0..=MAX_STEP, non-empty keys). Returns the points
    /// newly stored, with their seq, and those that conflict with a kept value.
    async fn append_points(
        &self,
        run_id: &str,
        points: &[MetricPoint],
        now_ms: i64,
    ) -> StoreResult<Appended>;
    async fn metric_keys(&self, run_id: &str) -> StoreResult<Vec<MetricKey>>;
    /// The lowest and highest stored value of each of `keys` in each of `run_ids` (absent
    /// pairs are left out). Meant for evaluation metrics, which have few points.
    async fn metric_extremes(
        &self,
        run_ids: &[String],
        keys: &[String],
    ) -> StoreResult<Vec<MetricExtremes>>;
    /// `max_points >= 2`; inclusive step bounds.
    async fn read_series(
        &self,
        run_id: &str,
        key: &str,
        start_step: Option<i64>,
        end_step: Option<i64>,
        max_points: usize,
    ) -> StoreResult<Series>;
    /// Every point of one key with `step > after_step`, in step order, at most `limit` (a
    /// metric's full history, page by page).
    async fn metric_history(
        &self,
        run_id: &str,
        key: &str,
        after_step: Option<i64>,
        limit: usize,
    ) -> StoreResult<Vec<SeriesPoint>>;
    /// Points of the run with `seq > after_seq` (or `step > after_step`), in seq order, at
    /// most `limit`; for SSE catch-up.
    async fn points_since(
        &self,
        run_id: &str,
        after_seq: Option<i64>,
        after_step: Option<i64>,
        limit: usize,
    ) -> StoreResult<Vec<StoredPoint>>;
    /// Events of the run with `seq > after_seq`, in order.
    async fn run_events(&self, run_id: &str, after_seq: Option<i64>) -> StoreResult<Vec<RunEvent>>;
    /// Runs in any of these statuses (the launcher's restart recovery).
    async fn runs_with_status(&self, statuses: &[RunStatus]) -> StoreResult<Vec<Run>>;
    /// Ok when the store answers reads and, after a failed write, takes writes again (checked
    /// with a small write of its own).
    async fn health(&self) -> StoreResult<()>;
}

pub type DynStore = Arc<dyn Store>;

pub mod accounts;
mod common;
pub mod downsample;
pub mod filter;
pub(crate) mod ingest;
pub mod models;
mod postgres;
mod search;
pub mod sql;
mod sql_store;
mod sqlite;
pub mod sweeps;

pub use sql_store::SqlStore;

/// Opens the store the URL names (`sqlite:` or `postgres://`) and runs its migrations.
pub async fn connect(database_url: &str) -> StoreResult<DynStore> {
    Ok(Arc::new(SqlStore::open(database_url).await?) as DynStore)
}

/// Unix time in milliseconds: the trainer's clock ([`trainer::wire::unix_ms`]), one function
/// for both ends.
pub use trainer::wire::unix_ms as now_ms;
