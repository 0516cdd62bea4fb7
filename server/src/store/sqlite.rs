//! SQLite backend: the embedded default. Writes go through a one-connection pool so writers
//! queue in-process instead of failing with "database is locked"; reads use a separate pool
//! (WAL lets them run beside the writer).

use super::common::{self, Arg, Details, RunRow, SortValues, SqlSink, RUN_COLUMNS};
use super::filter::Filter;
use super::{
    now_ms, Appended, ExitInfo, Experiment, MetricKey, MetricPoint, NewRun, Run, RunEvent, RunPage,
    RunQuery, RunStatus, RunUpdate, Series, Store, StoreError, StoreResult, StoredPoint,
};
use async_trait::async_trait;

mod metrics;
mod write;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct SqliteStore {
    write: SqlitePool,
    read: SqlitePool,
    /// `PRAGMA max_page_count` of every write connection (0: SQLite's default).
    page_limit: Arc<AtomicU64>,
    health: write::WriteHealth,
}

/// Rows per multi-row INSERT (4 to 10 binds each, well under SQLite's variable limit).
const CHUNK: usize = 500;

impl<'a> SqlSink for QueryBuilder<'a, Sqlite> {
    fn sql(&mut self, s: &str) {
        self.push(s);
    }
    fn arg(&mut self, a: Arg) {
        match a {
            Arg::Text(s) => self.push_bind(s),
            Arg::Int(i) => self.push_bind(i),
            Arg::Real(f) => self.push_bind(f),
        };
    }
    fn filter(&mut self, f: &Filter) -> StoreResult<()> {
        super::search_filter::push_sqlite(f, self)
    }
}

fn run_row(row: &SqliteRow) -> Result<RunRow, sqlx::Error> {
    Ok(RunRow {
        id: row.try_get(0)?,
        experiment_id: row.try_get(1)?,
        name: row.try_get(2)?,
        status: row.try_get(3)?,
        created_at: row.try_get(4)?,
        started_at: row.try_get(5)?,
        ended_at: row.try_get(6)?,
        config: row.try_get(7)?,
        notes: row.try_get(8)?,
        exit_code: row.try_get(9)?,
        exit_signal: row.try_get(10)?,
        exit_message: row.try_get(11)?,
    })
}

fn experiment(row: &SqliteRow) -> Result<Experiment, sqlx::Error> {
    Ok(Experiment {
        id: row.try_get(0)?,
        name: row.try_get(1)?,
        created_at: row.try_get(2)?,
    })
}

fn event(row: &SqliteRow) -> StoreResult<RunEvent> {
    let from: Option<String> = row.try_get(3)?;
    let to: String = row.try_get(4)?;
    Ok(RunEvent {
        seq: row.try_get(0)?,
        run_id: row.try_get(1)?,
        time: row.try_get(2)?,
        from_status: from.as_deref().map(common::parse_status).transpose()?,
        to_status: common::parse_status(&to)?,
        reason: row.try_get(5)?,
    })
}

impl SqliteStore {
    /// Opens (creating the file and its directory if missing) and migrates the database.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let invalid = |message: String| StoreError::Invalid {
            field: "database_url",
            message,
        };
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| invalid(format!("bad SQLite URL `{url}`: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        let path = options.get_filename().to_path_buf();
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        if !in_memory {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    invalid(format!("cannot create directory `{}`: {e}", dir.display()))
                })?;
            }
        }
        let page_limit = Arc::new(AtomicU64::new(0));
        let limit = page_limit.clone();
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .after_connect(move |conn, _| {
                let pages = limit.load(Ordering::Acquire);
                Box::pin(async move {
                    if pages > 0 {
                        sqlx::query(&format!("PRAGMA max_page_count = {pages}"))
                            .execute(conn)
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("../migrations/sqlite").run(&write).await?;
        // An in-memory database exists only on its one connection.
        let read = if in_memory {
            write.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(options.read_only(true))
                .await?
        };
        Ok(SqliteStore {
            write,
            read,
            page_limit,
            health: write::WriteHealth::default(),
        })
    }

    async fn begin_write(&self) -> StoreResult<write::WriteTx> {
        write::WriteTx::begin(&self.write).await
    }

    /// Closes every connection (a later `connect` to the same file sees what was committed).
    pub async fn close(&self) {
        self.write.close().await;
        self.read.close().await;
    }

    /// Caps the database at `pages` pages (`None`: SQLite's own maximum) on the write connection
    /// and every one opened after it. A write that needs more fails exactly as on a full disk
    /// (SQLITE_FULL), which lets the tests fill a database without filling a disk.
    #[doc(hidden)]
    pub async fn set_page_limit(&self, pages: Option<u64>) -> StoreResult<()> {
        self.page_limit.store(pages.unwrap_or(0), Ordering::Release);
        // SQLite clamps the value to its compile-time maximum.
        let pages = pages.unwrap_or(u64::from(u32::MAX));
        sqlx::query(&format!("PRAGMA max_page_count = {pages}"))
            .execute(&self.write)
            .await?;
        Ok(())
    }

    async fn run_exists(&self, id: &str) -> StoreResult<()> {
        sqlx::query("SELECT 1 FROM runs WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.read)
            .await?
            .map(|_| ())
            .ok_or_else(|| common::not_found_run(id))
    }

    async fn details(&self, ids: &[String]) -> StoreResult<Details> {
        let mut d = Details::default();
        if ids.is_empty() {
            return Ok(d);
        }
        for (table, out) in [("run_tags", &mut d.tags), ("run_params", &mut d.params)] {
            let mut qb = QueryBuilder::<Sqlite>::new(format!(
                "SELECT run_id, key, value FROM {table} WHERE run_id IN "
            ));
            common::push_in_list(ids, &mut qb);
            for row in qb.build().fetch_all(&self.read).await? {
                out.push((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
            }
        }
        let mut qb = QueryBuilder::<Sqlite>::new(
            "SELECT run_id, key, last_step, last_value, last_time FROM metric_series \
             WHERE count > 0 AND run_id IN ",
        );
        common::push_in_list(ids, &mut qb);
        for row in qb.build().fetch_all(&self.read).await? {
            d.metrics.push((
                row.try_get(0)?,
                row.try_get(1)?,
                row.try_get(2)?,
                row.try_get(3)?,
                row.try_get(4)?,
            ));
        }
        Ok(d)
    }

    async fn load_runs(&self, rows: Vec<RunRow>) -> StoreResult<Vec<Run>> {
        let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
        let details = self.details(&ids).await?;
        common::assemble_runs(rows, details)
    }

    async fn experiment_by(&self, column: &str, value: &str) -> StoreResult<Option<Experiment>> {
        let sql = format!("SELECT id, name, created_at FROM experiments WHERE {column} = ?");
        let row = sqlx::query(&sql)
            .bind(value)
            .fetch_optional(&self.write)
            .await?;
        Ok(row.as_ref().map(experiment).transpose()?)
    }
}

async fn insert_params(
    tx: &mut sqlx::SqliteConnection,
    run_id: &str,
    config: &serde_json::Value,
) -> StoreResult<()> {
    let params = super::flatten_params(config);
    let params: Vec<_> = params.into_iter().collect();
    for chunk in params.chunks(CHUNK) {
        let mut qb =
            QueryBuilder::<Sqlite>::new("INSERT INTO run_params (run_id, key, value, num) ");
        qb.push_values(chunk, |mut b, (k, v)| {
            b.push_bind(run_id)
                .push_bind(k.clone())
                .push_bind(v.clone())
                .push_bind(common::param_num(v));
        });
        qb.build().execute(&mut *tx).await?;
    }
    Ok(())
}

async fn upsert_tags(
    tx: &mut sqlx::SqliteConnection,
    run_id: &str,
    tags: &std::collections::BTreeMap<String, String>,
) -> StoreResult<()> {
    let tags: Vec<_> = tags.iter().collect();
    for chunk in tags.chunks(CHUNK) {
        let mut qb = QueryBuilder::<Sqlite>::new("INSERT INTO run_tags (run_id, key, value) ");
        qb.push_values(chunk, |mut b, (k, v)| {
            b.push_bind(run_id)
                .push_bind((*k).clone())
                .push_bind((*v).clone());
        });
        qb.push(" ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value");
        qb.build().execute(&mut *tx).await?;
    }
    Ok(())
}

async fn insert_event(
    tx: &mut sqlx::SqliteConnection,
    run_id: &str,
    time: i64,
    from: Option<RunStatus>,
    to: RunStatus,
    reason: Option<&str>,
) -> StoreResult<RunEvent> {
    let row = sqlx::query(
        "INSERT INTO run_events (run_id, time, from_status, to_status, reason) \
         VALUES (?, ?, ?, ?, ?) RETURNING seq, run_id, time, from_status, to_status, reason",
    )
    .bind(run_id)
    .bind(time)
    .bind(from.map(|s| s.as_str()))
    .bind(to.as_str())
    .bind(reason)
    .fetch_one(&mut *tx)
    .await?;
    event(&row)
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn create_experiment(&self, name: &str) -> StoreResult<Experiment> {
        let name = common::valid_name("name", name)?;
        let created = async {
            let mut tx = self.begin_write().await?;
            let row = sqlx::query(
                "INSERT INTO experiments (id, name, created_at) VALUES (?, ?, ?) \
                 RETURNING id, name, created_at",
            )
            .bind(common::new_id())
            .bind(name)
            .bind(now_ms())
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| common::map_constraint(e, "name", &format!("experiment `{name}`")))?;
            tx.commit().await?;
            Ok(experiment(&row)?)
        };
        self.health.note(created.await)
    }

    async fn get_experiment(&self, id_or_name: &str) -> StoreResult<Experiment> {
        if let Some(e) = self.experiment_by("id", id_or_name).await? {
            return Ok(e);
        }
        self.experiment_by("name", id_or_name)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                entity: "experiment",
                id: id_or_name.to_string(),
            })
    }

    async fn resolve_experiment(&self, id_or_name: &str) -> StoreResult<Experiment> {
        match self.get_experiment(id_or_name).await {
            Err(StoreError::NotFound { .. }) => {}
            other => return other,
        }
        let name = common::valid_name("experiment", id_or_name)?;
        let created = async {
            let mut tx = self.begin_write().await?;
            sqlx::query(
                "INSERT INTO experiments (id, name, created_at) VALUES (?, ?, ?) \
                 ON CONFLICT (name) DO NOTHING",
            )
            .bind(common::new_id())
            .bind(name)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
            tx.commit().await
        };
        self.health.note(created.await)?;
        self.get_experiment(name).await
    }

    async fn list_experiments(&self) -> StoreResult<Vec<Experiment>> {
        let rows =
            sqlx::query("SELECT id, name, created_at FROM experiments ORDER BY created_at, id")
                .fetch_all(&self.read)
                .await?;
        Ok(rows.iter().map(experiment).collect::<Result<_, _>>()?)
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<Run> {
        let id = common::new_id();
        let name = match &new.name {
            Some(n) => common::valid_name("name", n)?.to_string(),
            None => format!("run-{}", &id[..8]),
        };
        common::check_run_text(Some(&new.tags), None, new.config.as_ref())?;
        let status = new.status.unwrap_or(RunStatus::Created);
        let config = new.config.as_ref().map(|c| c.to_string());
        let now = now_ms();
        let created = async {
            let mut tx = self.begin_write().await?;
            let exists = sqlx::query("SELECT 1 FROM experiments WHERE id = ?")
                .bind(&new.experiment_id)
                .fetch_optional(&mut *tx)
                .await?;
            if exists.is_none() {
                return Err(StoreError::NotFound {
                    entity: "experiment",
                    id: new.experiment_id.clone(),
                });
            }
            sqlx::query(
                "INSERT INTO runs (id, experiment_id, name, status, created_at, config) \
             VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(&id)
            .bind(&new.experiment_id)
            .bind(&name)
            .bind(status.as_str())
            .bind(now)
            .bind(&config)
            .execute(&mut *tx)
            .await
            .map_err(|e| common::map_constraint(e, "run", "run"))?;
            if let Some(c) = &new.config {
                insert_params(&mut tx, &id, c).await?;
            }
            upsert_tags(&mut tx, &id, &new.tags).await?;
            insert_event(&mut tx, &id, now, None, status, Some("created")).await?;
            tx.commit().await
        };
        self.health.note(created.await)?;
        self.get_run(&id).await
    }

    async fn get_run(&self, id: &str) -> StoreResult<Run> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs r WHERE r.id = ?");
        let row = sqlx::query(&sql)
            .bind(id)
            .fetch_optional(&self.read)
            .await?
            .ok_or_else(|| common::not_found_run(id))?;
        let rows = vec![run_row(&row)?];
        let ids = vec![id.to_string()];
        let details = self.details(&ids).await?;
        common::assemble_runs(rows, details)?
            .pop()
            .ok_or_else(|| common::not_found_run(id))
    }

    async fn update_run(&self, id: &str, update: RunUpdate) -> StoreResult<Run> {
        common::check_run_text(
            update.tags.as_ref(),
            update.notes.as_deref(),
            update.config.as_ref(),
        )?;
        let updated = async {
            let mut tx = self.begin_write().await?;
            let stored: Option<String> =
                sqlx::query_scalar::<_, Option<String>>("SELECT config FROM runs WHERE id = ?")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?
                    .ok_or_else(|| common::not_found_run(id))?;
            if let Some(name) = &update.name {
                let name = common::valid_name("name", name)?;
                sqlx::query("UPDATE runs SET name = ? WHERE id = ?")
                    .bind(name)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(notes) = &update.notes {
                sqlx::query("UPDATE runs SET notes = ? WHERE id = ?")
                    .bind(notes)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(tags) = &update.tags {
                upsert_tags(&mut tx, id, tags).await?;
            }
            if let Some(config) = &update.config {
                if common::config_is_new(stored.as_deref(), config)? {
                    sqlx::query("UPDATE runs SET config = ? WHERE id = ?")
                        .bind(config.to_string())
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    insert_params(&mut tx, id, config).await?;
                }
            }
            tx.commit().await
        };
        self.health.note(updated.await)?;
        self.get_run(id).await
    }

    async fn set_status(
        &self,
        id: &str,
        status: RunStatus,
        reason: Option<&str>,
        exit: Option<ExitInfo>,
    ) -> StoreResult<RunEvent> {
        let now = now_ms();
        let changed = async {
            let mut tx = self.begin_write().await?;
            let from: String = sqlx::query_scalar("SELECT status FROM runs WHERE id = ?")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(|| common::not_found_run(id))?;
            let from = common::parse_status(&from)?;
            sqlx::query(
                "UPDATE runs SET status = ?, \
             started_at = CASE WHEN ? AND started_at IS NULL THEN ? ELSE started_at END, \
             ended_at = CASE WHEN ? THEN ? ELSE ended_at END WHERE id = ?",
            )
            .bind(status.as_str())
            .bind(status == RunStatus::Running)
            .bind(now)
            .bind(status.is_terminal())
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
            if let Some(exit) = &exit {
                sqlx::query(
                    "UPDATE runs SET exit_code = ?, exit_signal = ?, exit_message = ? WHERE id = ?",
                )
                .bind(exit.exit_code)
                .bind(exit.signal)
                .bind(&exit.message)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            }
            let event = insert_event(&mut tx, id, now, Some(from), status, reason).await?;
            tx.commit().await?;
            Ok(event)
        };
        self.health.note(changed.await)
    }

    async fn search_runs(&self, query: &RunQuery) -> StoreResult<RunPage> {
        let mut qb = QueryBuilder::<Sqlite>::new("");
        common::build_search(query, &mut qb)?;
        let rows = qb.build().fetch_all(&self.read).await?;
        let (n, i, t) = common::sort_columns(&query.sort);
        let mut runs = Vec::with_capacity(rows.len());
        let mut sorts = Vec::with_capacity(rows.len());
        for row in &rows {
            runs.push(run_row(row)?);
            let mut col = 13;
            let mut next = || {
                col += 1;
                col - 1
            };
            sorts.push(SortValues {
                g: row.try_get(12)?,
                n: if n { row.try_get(next())? } else { None },
                i: if i { row.try_get(next())? } else { None },
                t: if t { row.try_get(next())? } else { None },
            });
        }
        let next_cursor = common::finish_page(query, &mut runs, &sorts);
        Ok(RunPage {
            runs: self.load_runs(runs).await?,
            next_cursor,
        })
    }

    async fn append_points(
        &self,
        run_id: &str,
        points: &[MetricPoint],
        now_ms: i64,
    ) -> StoreResult<Appended> {
        self.health
            .note(self.write_points(run_id, points, now_ms).await)
    }

    async fn metric_keys(&self, run_id: &str) -> StoreResult<Vec<MetricKey>> {
        self.keys_of(run_id).await
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
        self.run_exists(run_id).await?;
        let rows = sqlx::query(
            "SELECT seq, run_id, time, from_status, to_status, reason FROM run_events \
             WHERE run_id = ? AND seq > ? ORDER BY seq",
        )
        .bind(run_id)
        .bind(after_seq.unwrap_or(0))
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(event).collect()
    }

    async fn health(&self) -> StoreResult<()> {
        if self.health.failure().is_some() {
            self.health.note(write::probe(&self.write).await)?;
        }
        sqlx::query("SELECT 1").execute(&self.read).await?;
        Ok(())
    }

    async fn runs_with_status(&self, statuses: &[RunStatus]) -> StoreResult<Vec<Run>> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let mut qb = QueryBuilder::<Sqlite>::new(format!(
            "SELECT {RUN_COLUMNS} FROM runs r WHERE r.status IN "
        ));
        let names: Vec<String> = statuses.iter().map(|s| s.as_str().to_string()).collect();
        common::push_in_list(&names, &mut qb);
        qb.push(" ORDER BY r.created_at, r.id");
        let rows = qb.build().fetch_all(&self.read).await?;
        let rows = rows.iter().map(run_row).collect::<Result<Vec<_>, _>>()?;
        self.load_runs(rows).await
    }
}
