//! Postgres backend, for teams and heavy ingest. Metric batches are written with array
//! (`UNNEST`) statements: a few round trips per batch whatever its size. Writers to one run are
//! serialized by a row lock on the run, so point sequence numbers follow commit order.

use super::common::{self, Arg, Details, RunRow, SortValues, SqlSink, RUN_COLUMNS};
use super::filter::Filter;
use super::{
    now_ms, Appended, ExitInfo, Experiment, MetricKey, MetricPoint, NewRun, Run, RunEvent, RunPage,
    RunQuery, RunStatus, RunUpdate, Series, Store, StoreError, StoreResult, StoredPoint,
};
use async_trait::async_trait;

mod metrics;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres, QueryBuilder, Row};
use std::str::FromStr;
use std::time::Duration;

pub struct PgStore {
    pool: PgPool,
    /// Series ids of recently written metrics (hints, checked by the write that uses them).
    series_ids: metrics::SeriesCache,
}

impl<'a> SqlSink for QueryBuilder<'a, Postgres> {
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
        super::search_filter::push_postgres(f, self)
    }
    fn text_order(&self) -> &'static str {
        " COLLATE \"C\""
    }
}

fn run_row(row: &PgRow) -> Result<RunRow, sqlx::Error> {
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

fn experiment(row: &PgRow) -> Result<Experiment, sqlx::Error> {
    Ok(Experiment {
        id: row.try_get(0)?,
        name: row.try_get(1)?,
        created_at: row.try_get(2)?,
    })
}

fn event(row: &PgRow) -> StoreResult<RunEvent> {
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

/// A pooled connection. Not getting one (refused, closed, or none free within the pool's
/// timeout) means the database is unavailable, whatever the error says.
pub(super) async fn acquire(pool: &PgPool) -> StoreResult<PoolConnection<Postgres>> {
    pool.acquire().await.map_err(StoreError::Unavailable)
}

pub(super) async fn begin(pool: &PgPool) -> StoreResult<sqlx::Transaction<'static, Postgres>> {
    pool.begin().await.map_err(StoreError::Unavailable)
}

impl PgStore {
    /// Connects and migrates the database.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let options = PgConnectOptions::from_str(url).map_err(|e| StoreError::Invalid {
            field: "database_url",
            message: format!("bad Postgres URL: {e}"),
        })?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await?;
        sqlx::migrate!("../migrations/postgres").run(&pool).await?;
        Ok(PgStore {
            pool,
            series_ids: metrics::SeriesCache::default(),
        })
    }

    async fn run_exists(&self, id: &str) -> StoreResult<()> {
        sqlx::query("SELECT 1 FROM runs WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *acquire(&self.pool).await?)
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
            let sql = format!("SELECT run_id, key, value FROM {table} WHERE run_id = ANY($1)");
            for row in sqlx::query(&sql)
                .bind(ids)
                .fetch_all(&mut *acquire(&self.pool).await?)
                .await?
            {
                out.push((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
            }
        }
        let rows = sqlx::query(
            "SELECT run_id, key, last_step, last_value, last_time FROM metric_series \
             WHERE count > 0 AND run_id = ANY($1)",
        )
        .bind(ids)
        .fetch_all(&mut *acquire(&self.pool).await?)
        .await?;
        for row in rows {
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
        let sql = format!("SELECT id, name, created_at FROM experiments WHERE {column} = $1");
        let row = sqlx::query(&sql)
            .bind(value)
            .fetch_optional(&mut *acquire(&self.pool).await?)
            .await?;
        Ok(row.as_ref().map(experiment).transpose()?)
    }
}

async fn insert_params(
    tx: &mut sqlx::PgConnection,
    run_id: &str,
    config: &serde_json::Value,
) -> StoreResult<()> {
    let params = super::flatten_params(config);
    let nums: Vec<Option<f64>> = params.values().map(|v| common::param_num(v)).collect();
    let (keys, values): (Vec<String>, Vec<String>) = params.into_iter().unzip();
    sqlx::query(
        "INSERT INTO run_params (run_id, key, value, num) \
         SELECT $1, k, v, n FROM UNNEST($2::text[], $3::text[], $4::float8[]) AS u(k, v, n)",
    )
    .bind(run_id)
    .bind(keys)
    .bind(values)
    .bind(nums)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

async fn upsert_tags(
    tx: &mut sqlx::PgConnection,
    run_id: &str,
    tags: &std::collections::BTreeMap<String, String>,
) -> StoreResult<()> {
    let keys: Vec<&str> = tags.keys().map(|k| k.as_str()).collect();
    let values: Vec<&str> = tags.values().map(|v| v.as_str()).collect();
    sqlx::query(
        "INSERT INTO run_tags (run_id, key, value) \
         SELECT $1, k, v FROM UNNEST($2::text[], $3::text[]) AS u(k, v) \
         ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
    )
    .bind(run_id)
    .bind(keys)
    .bind(values)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

async fn insert_event(
    tx: &mut sqlx::PgConnection,
    run_id: &str,
    time: i64,
    from: Option<RunStatus>,
    to: RunStatus,
    reason: Option<&str>,
) -> StoreResult<RunEvent> {
    let row = sqlx::query(
        "INSERT INTO run_events (run_id, time, from_status, to_status, reason) \
         VALUES ($1, $2, $3, $4, $5) RETURNING seq, run_id, time, from_status, to_status, reason",
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
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn create_experiment(&self, name: &str) -> StoreResult<Experiment> {
        let name = common::valid_name("name", name)?;
        let row = sqlx::query(
            "INSERT INTO experiments (id, name, created_at) VALUES ($1, $2, $3) \
             RETURNING id, name, created_at",
        )
        .bind(common::new_id())
        .bind(name)
        .bind(now_ms())
        .fetch_one(&mut *acquire(&self.pool).await?)
        .await
        .map_err(|e| common::map_constraint(e, "name", &format!("experiment `{name}`")))?;
        Ok(experiment(&row)?)
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
        sqlx::query(
            "INSERT INTO experiments (id, name, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(common::new_id())
        .bind(name)
        .bind(now_ms())
        .execute(&mut *acquire(&self.pool).await?)
        .await?;
        self.get_experiment(name).await
    }

    async fn list_experiments(&self) -> StoreResult<Vec<Experiment>> {
        let rows =
            sqlx::query("SELECT id, name, created_at FROM experiments ORDER BY created_at, id")
                .fetch_all(&mut *acquire(&self.pool).await?)
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
        let mut tx = begin(&self.pool).await?;
        let exists = sqlx::query("SELECT 1 FROM experiments WHERE id = $1")
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
             VALUES ($1, $2, $3, $4, $5, $6)",
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
        tx.commit().await?;
        self.get_run(&id).await
    }

    async fn get_run(&self, id: &str) -> StoreResult<Run> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs r WHERE r.id = $1");
        let row = sqlx::query(&sql)
            .bind(id)
            .fetch_optional(&mut *acquire(&self.pool).await?)
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
        let mut tx = begin(&self.pool).await?;
        let stored: Option<String> = sqlx::query_scalar::<_, Option<String>>(
            "SELECT config FROM runs WHERE id = $1 FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| common::not_found_run(id))?;
        if let Some(name) = &update.name {
            let name = common::valid_name("name", name)?;
            sqlx::query("UPDATE runs SET name = $1 WHERE id = $2")
                .bind(name)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        if let Some(notes) = &update.notes {
            sqlx::query("UPDATE runs SET notes = $1 WHERE id = $2")
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
                sqlx::query("UPDATE runs SET config = $1 WHERE id = $2")
                    .bind(config.to_string())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                insert_params(&mut tx, id, config).await?;
            }
        }
        tx.commit().await?;
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
        let mut tx = begin(&self.pool).await?;
        let from: String = sqlx::query_scalar("SELECT status FROM runs WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| common::not_found_run(id))?;
        let from = common::parse_status(&from)?;
        sqlx::query(
            "UPDATE runs SET status = $1, \
             started_at = CASE WHEN $2 AND started_at IS NULL THEN $3 ELSE started_at END, \
             ended_at = CASE WHEN $4 THEN $5 ELSE ended_at END WHERE id = $6",
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
                "UPDATE runs SET exit_code = $1, exit_signal = $2, exit_message = $3 WHERE id = $4",
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
    }

    async fn search_runs(&self, query: &RunQuery) -> StoreResult<RunPage> {
        let mut qb = QueryBuilder::<Postgres>::new("");
        common::build_search(query, &mut qb)?;
        let rows = qb
            .build()
            .fetch_all(&mut *acquire(&self.pool).await?)
            .await?;
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
                g: i64::from(row.try_get::<i32, _>(12)?),
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
        self.write_points(run_id, points, now_ms).await
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
             WHERE run_id = $1 AND seq > $2 ORDER BY seq",
        )
        .bind(run_id)
        .bind(after_seq.unwrap_or(0))
        .fetch_all(&mut *acquire(&self.pool).await?)
        .await?;
        rows.iter().map(event).collect()
    }

    async fn health(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1")
            .execute(&mut *acquire(&self.pool).await?)
            .await?;
        Ok(())
    }

    async fn runs_with_status(&self, statuses: &[RunStatus]) -> StoreResult<Vec<Run>> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs r WHERE r.status = ANY($1) ORDER BY r.created_at, r.id"
        );
        let rows = sqlx::query(&sql)
            .bind(names)
            .fetch_all(&mut *acquire(&self.pool).await?)
            .await?;
        let rows = rows.iter().map(run_row).collect::<Result<Vec<_>, _>>()?;
        self.load_runs(rows).await
    }
}
