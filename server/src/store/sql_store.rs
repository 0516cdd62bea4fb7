//! The store, written once for both databases: every query goes through the shared SQL layer
//! (`sql.rs`). Per backend remain only the connections (`sqlite.rs`, `postgres.rs`) and the
//! metric write fast paths, which use what only one database has (see `sqlite::write_batch`
//! and `postgres::write_batch`). A new table needs one implementation, here.

use async_trait::async_trait;

use super::sql::{self, Conn, Dialect, Sql, Tx, WriteHealth};
use super::{
    postgres, sqlite, Appended, ExitInfo, Experiment, KeyKind, Lifecycle, MetricExtremes,
    MetricKey, MetricPoint, NewRun, QueryPlan, Run, RunEvent, RunInput, RunPage, RunQuery,
    RunStatus, RunUpdate, Series, SeriesPoint, Store, StoreError, StoreResult, StoredPoint,
};
use crate::store::accounts::Level;

mod accounts;
mod experiments;
mod grants;
mod keys;
mod metrics;
mod models;
mod run_data;
mod runs;
mod stats;
mod sweeps;

pub(super) use metrics::{record_write, reserve_seqs, series_for, stored_values};

/// The connections of one database.
enum Backend {
    Sqlite(sqlite::Pools),
    Postgres(postgres::Pools),
}

pub struct SqlStore {
    backend: Backend,
    health: WriteHealth,
    statistics: stats::Statistics,
}

impl SqlStore {
    /// Opens the database the URL names (`sqlite:` or `postgres://`) and runs its migrations.
    pub async fn open(database_url: &str) -> StoreResult<SqlStore> {
        let backend = if database_url.starts_with("postgres://")
            || database_url.starts_with("postgresql://")
        {
            Backend::Postgres(postgres::Pools::open(database_url).await?)
        } else if database_url.starts_with("sqlite:") {
            Backend::Sqlite(sqlite::Pools::open(database_url).await?)
        } else {
            return Err(StoreError::Invalid {
                field: "database_url",
                message: format!(
                    "unsupported database URL `{database_url}`: expected sqlite:PATH or \
                     postgres://..."
                ),
            });
        };
        let statistics = stats::Statistics::new(match &backend {
            Backend::Sqlite(p) => stats::Target::Sqlite(p.write.clone()),
            Backend::Postgres(p) => stats::Target::Postgres(p.pool.clone()),
        });
        Ok(SqlStore {
            backend,
            health: WriteHealth::default(),
            statistics,
        })
    }

    pub fn dialect(&self) -> Dialect {
        match self.backend {
            Backend::Sqlite(_) => Dialect::Sqlite,
            Backend::Postgres(_) => Dialect::Postgres,
        }
    }

    /// A connection for reads (on SQLite one of the read-only connections beside the writer).
    pub(super) async fn reader(&self) -> StoreResult<Conn> {
        Ok(match &self.backend {
            Backend::Sqlite(p) => Conn::Sqlite(p.read.acquire().await.map_err(sql::unavailable)?),
            Backend::Postgres(p) => {
                Conn::Postgres(p.pool.acquire().await.map_err(sql::unavailable)?)
            }
        })
    }

    /// A connection for writes (on SQLite the one write connection).
    pub(super) async fn writer(&self) -> StoreResult<Conn> {
        Ok(match &self.backend {
            Backend::Sqlite(p) => Conn::Sqlite(p.write.acquire().await.map_err(sql::unavailable)?),
            Backend::Postgres(p) => {
                Conn::Postgres(p.pool.acquire().await.map_err(sql::unavailable)?)
            }
        })
    }

    /// A write transaction; end it with `Tx::finish`.
    pub(super) async fn begin_write(&self) -> StoreResult<Tx<'_>> {
        let conn = self.health.note(self.writer().await)?;
        Tx::begin(conn, &self.health).await
    }

    /// Records the outcome of a write made outside `begin_write` (one auto-committed
    /// statement) for the health check.
    pub(super) fn note_write<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        self.health.note(result)
    }

    /// Closes every connection (a later `open` of the same database sees what was committed).
    pub async fn close(&self) {
        match &self.backend {
            Backend::Sqlite(p) => {
                p.write.close().await;
                p.read.close().await;
            }
            Backend::Postgres(p) => p.pool.close().await,
        }
    }

    /// Caps a SQLite database at `pages` pages (`None`: SQLite's own maximum) on the write
    /// connection and every one opened after it. A write that needs more fails exactly as on a
    /// full disk (SQLITE_FULL), which lets the tests fill a database without filling a disk.
    #[doc(hidden)]
    pub async fn set_page_limit(&self, pages: Option<u64>) -> StoreResult<()> {
        match &self.backend {
            Backend::Sqlite(p) => p.set_page_limit(pages).await,
            Backend::Postgres(_) => Err(StoreError::Invalid {
                field: "pages",
                message: "a page limit exists on SQLite only".into(),
            }),
        }
    }
}

#[async_trait]
impl Store for SqlStore {
    fn backend(&self) -> &'static str {
        match self.dialect() {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }

    async fn create_experiment(&self, name: &str) -> StoreResult<Experiment> {
        self.insert_experiment_row("name", name, None, Level::None, false)
            .await
    }

    async fn get_experiment(&self, id_or_name: &str) -> StoreResult<Experiment> {
        self.find_experiment(id_or_name).await
    }

    async fn resolve_experiment(&self, id_or_name: &str) -> StoreResult<Experiment> {
        self.find_or_create_experiment(id_or_name).await
    }

    async fn list_experiments(&self, lifecycle: Lifecycle) -> StoreResult<Vec<Experiment>> {
        self.experiments_in(lifecycle).await
    }

    async fn set_experiment_deleted(&self, id: &str, deleted: bool) -> StoreResult<()> {
        self.mark_experiment_deleted(id, deleted).await
    }

    async fn set_experiment_tag(&self, id: &str, key: &str, value: &str) -> StoreResult<()> {
        self.upsert_experiment_tag(id, key, value).await
    }

    async fn delete_experiment_tag(&self, id: &str, key: &str) -> StoreResult<()> {
        self.remove_experiment_tag(id, key).await
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<Run> {
        self.insert_run(new).await
    }

    async fn get_run(&self, id: &str) -> StoreResult<Run> {
        self.find_run(id).await
    }

    async fn update_run(&self, id: &str, update: RunUpdate) -> StoreResult<Run> {
        self.change_run(id, update).await
    }

    async fn set_status(
        &self,
        id: &str,
        status: RunStatus,
        reason: Option<&str>,
        exit: Option<ExitInfo>,
    ) -> StoreResult<RunEvent> {
        self.change_status(id, status, reason, exit).await
    }

    async fn set_exit(&self, id: &str, exit: Option<ExitInfo>) -> StoreResult<()> {
        self.replace_exit(id, exit).await
    }

    async fn search_runs(&self, query: &RunQuery) -> StoreResult<RunPage> {
        self.search(query).await
    }

    async fn explain_search(&self, query: &RunQuery) -> StoreResult<(RunPage, Vec<QueryPlan>)> {
        let mut plans = Vec::new();
        let page = self.search_explained(query, Some(&mut plans)).await?;
        Ok((page, plans))
    }

    async fn refresh_statistics(&self) -> StoreResult<()> {
        Ok(self.statistics.refresh_now().await?)
    }

    async fn set_run_deleted(&self, id: &str, deleted: bool) -> StoreResult<()> {
        self.mark_run_deleted(id, deleted).await
    }

    async fn set_run_times(
        &self,
        id: &str,
        started_at: Option<i64>,
        ended_at: Option<i64>,
    ) -> StoreResult<()> {
        self.put_run_times(id, started_at, ended_at).await
    }

    async fn log_params(&self, id: &str, params: &[(String, String)]) -> StoreResult<()> {
        self.add_params(id, params).await
    }

    async fn delete_tag(&self, id: &str, key: &str) -> StoreResult<()> {
        self.remove_tag(id, key).await
    }

    async fn log_inputs(&self, id: &str, inputs: &[RunInput]) -> StoreResult<()> {
        self.add_inputs(id, inputs).await
    }

    async fn run_inputs(&self, id: &str) -> StoreResult<Vec<RunInput>> {
        self.inputs_of(id).await
    }

    async fn has_key(
        &self,
        kind: KeyKind,
        key: &str,
        experiments: Option<&[String]>,
    ) -> StoreResult<bool> {
        self.key_exists(kind, key, experiments).await
    }

    async fn known_keys(
        &self,
        kind: KeyKind,
        experiments: Option<&[String]>,
    ) -> StoreResult<Vec<String>> {
        self.keys_known(kind, experiments).await
    }

    async fn append_points(
        &self,
        run_id: &str,
        points: &[MetricPoint],
        now_ms: i64,
    ) -> StoreResult<Appended> {
        let batch = super::ingest::prepare_batch(points, now_ms)?;
        match &self.backend {
            Backend::Sqlite(_) => sqlite::write_batch(self, run_id, &batch).await,
            Backend::Postgres(p) => postgres::write_batch(self, p, run_id, &batch).await,
        }
    }

    async fn metric_keys(&self, run_id: &str) -> StoreResult<Vec<MetricKey>> {
        self.keys_of(run_id).await
    }

    async fn metric_extremes(
        &self,
        run_ids: &[String],
        keys: &[String],
    ) -> StoreResult<Vec<MetricExtremes>> {
        self.extremes_of(run_ids, keys).await
    }

    async fn read_series(
        &self,
        run_id: &str,
        key: &str,
        start_step: Option<i64>,
        end_step: Option<i64>,
        max_points: usize,
    ) -> StoreResult<Series> {
        self.series_of(run_id, key, start_step, end_step, max_points)
            .await
    }

    async fn metric_history(
        &self,
        run_id: &str,
        key: &str,
        after_step: Option<i64>,
        limit: usize,
    ) -> StoreResult<Vec<SeriesPoint>> {
        self.history_of(run_id, key, after_step, limit).await
    }

    async fn points_since(
        &self,
        run_id: &str,
        after_seq: Option<i64>,
        after_step: Option<i64>,
        limit: usize,
    ) -> StoreResult<Vec<StoredPoint>> {
        self.points_after(run_id, after_seq, after_step, limit)
            .await
    }

    async fn run_events(&self, run_id: &str, after_seq: Option<i64>) -> StoreResult<Vec<RunEvent>> {
        self.events_of(run_id, after_seq).await
    }

    async fn runs_with_status(&self, statuses: &[RunStatus]) -> StoreResult<Vec<Run>> {
        self.runs_in(statuses).await
    }

    async fn health(&self) -> StoreResult<()> {
        if self.health.failing() {
            sql::probe(self.writer().await?, &self.health).await?;
        }
        self.reader().await?.execute(Sql::new("SELECT 1")).await?;
        Ok(())
    }
}
