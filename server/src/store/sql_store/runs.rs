//! Experiments, runs (tags, params, status events) and the run search.

use std::collections::BTreeMap;

use super::SqlStore;
use crate::store::common::{self, Details, RunRow, RUN_COLUMNS};
use crate::store::search::{self, named};
use crate::store::sql::{Conn, Dialect, Row, Sql, Tx, WriteHealth};
use crate::store::{
    flatten_params, now_ms, ExitInfo, NewRun, QueryPlan, Run, RunEvent, RunPage, RunQuery,
    RunStatus, RunUpdate, StoreError, StoreResult,
};

/// Rows per multi-row INSERT (4 parameters each, well under either database's limit).
const CHUNK: usize = 500;

const EVENT_COLUMNS: &str = "seq, run_id, time, from_status, to_status, reason";

fn event(row: &Row) -> StoreResult<RunEvent> {
    let from: Option<String> = row.col("from_status")?;
    let to: String = row.col("to_status")?;
    Ok(RunEvent {
        seq: row.col("seq")?,
        run_id: row.col("run_id")?,
        time: row.col("time")?,
        from_status: from.as_deref().map(common::parse_status).transpose()?,
        to_status: common::parse_status(&to)?,
        reason: row.col("reason")?,
    })
}

fn run_rows(rows: &[Row]) -> Result<Vec<RunRow>, sqlx::Error> {
    rows.iter().map(RunRow::from_row).collect()
}

/// Appends a flattened config as write-once params; returns how many it flattened to.
async fn insert_params(
    tx: &mut Conn,
    run_id: &str,
    config: &serde_json::Value,
) -> StoreResult<usize> {
    let params: Vec<_> = flatten_params(config).into_iter().collect();
    super::run_data::insert_param_rows(tx, run_id, &params).await?;
    Ok(params.len())
}

/// Sets tags, replacing the values of keys the run already has.
async fn upsert_tags(
    tx: &mut Conn,
    run_id: &str,
    tags: &BTreeMap<String, String>,
) -> StoreResult<()> {
    let tags: Vec<_> = tags.iter().collect();
    for chunk in tags.chunks(CHUNK) {
        let mut upsert = Sql::new("INSERT INTO run_tags (run_id, key, value) VALUES ");
        for (i, (k, v)) in chunk.iter().enumerate() {
            if i > 0 {
                upsert.push(", ");
            }
            upsert.tuple([run_id, k.as_str(), v.as_str()]);
        }
        upsert.push(" ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value");
        tx.execute(upsert).await?;
    }
    Ok(())
}

async fn insert_event(
    tx: &mut Conn,
    run_id: &str,
    time: i64,
    from: Option<RunStatus>,
    to: RunStatus,
    reason: Option<&str>,
) -> StoreResult<RunEvent> {
    let insert = Sql::new(format!(
        "INSERT INTO run_events (run_id, time, from_status, to_status, reason) \
         VALUES ($1, $2, $3, $4, $5) RETURNING {EVENT_COLUMNS}"
    ));
    let row = tx
        .fetch_one(
            insert
                .bind(run_id)
                .bind(time)
                .bind(from.map(|s| s.as_str()))
                .bind(to.as_str())
                .bind(reason),
        )
        .await?;
    event(&row)
}

/// The reads of a set of runs' tags, params and latest metrics, in that order: each one probe
/// of the table's (run, key) key per run, so they cost what the page holds.
fn detail_statements(ids: &[String]) -> [Sql; 3] {
    let select = |text: &str| {
        let mut select = Sql::new(text);
        select.tuple(ids);
        select
    };
    [
        select("SELECT run_id, key, value FROM run_tags WHERE run_id IN "),
        select("SELECT run_id, key, value FROM run_params WHERE run_id IN "),
        select(
            // A series of NaN points only (last_step -1) has no latest value.
            "SELECT run_id, key, last_step, last_value, last_time FROM metric_series \
             WHERE last_step >= 0 AND run_id IN ",
        ),
    ]
}

/// Tags, params and latest metrics of a set of runs.
async fn details(conn: &mut Conn, ids: &[String]) -> StoreResult<Details> {
    let mut d = Details::default();
    if ids.is_empty() {
        return Ok(d);
    }
    let [tags, params, metrics] = detail_statements(ids);
    for (select, out) in [(tags, &mut d.tags), (params, &mut d.params)] {
        for row in conn.fetch_all(select).await? {
            out.push((
                named(&row, "run_id")?,
                named(&row, "key")?,
                named(&row, "value")?,
            ));
        }
    }
    for row in conn.fetch_all(metrics).await? {
        d.metrics.push((
            named(&row, "run_id")?,
            named(&row, "key")?,
            named(&row, "last_step")?,
            named(&row, "last_value")?,
            named(&row, "last_time")?,
        ));
    }
    Ok(d)
}

/// Runs with their tags, params and latest metrics.
async fn load_runs(conn: &mut Conn, rows: Vec<RunRow>) -> StoreResult<Vec<Run>> {
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let details = details(conn, &ids).await?;
    common::assemble_runs(rows, details)
}

impl SqlStore {
    pub(super) async fn run_exists(&self, conn: &mut Conn, id: &str) -> StoreResult<()> {
        conn.fetch_optional(Sql::new("SELECT 1 FROM runs WHERE id = $1").bind(id))
            .await?
            .map(|_| ())
            .ok_or_else(|| common::not_found_run(id))
    }

    pub(super) async fn insert_run(&self, new: NewRun) -> StoreResult<Run> {
        let id = common::new_id();
        let name = match &new.name {
            Some(n) => common::valid_name("name", n)?.to_string(),
            None => format!("run-{}", &id[..8]),
        };
        common::check_run_text(Some(&new.tags), None, new.config.as_ref())?;
        let status = new.status.unwrap_or(RunStatus::Created);
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let result = async {
            let exists = Sql::new("SELECT deleted_at FROM experiments WHERE id = $1");
            let Some(row) = tx.fetch_optional(exists.bind(&new.experiment_id)).await? else {
                return Err(StoreError::NotFound {
                    entity: "experiment",
                    id: new.experiment_id.clone(),
                });
            };
            if row.col::<Option<i64>>("deleted_at")?.is_some() {
                return Err(StoreError::Invalid {
                    field: "experiment_id",
                    message: "the experiment is deleted: restore it before adding runs".into(),
                });
            }
            let insert = Sql::new(
                "INSERT INTO runs (id, experiment_id, name, status, created_at, config, \
                 created_by) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            );
            tx.execute(
                insert
                    .bind(&id)
                    .bind(&new.experiment_id)
                    .bind(&name)
                    .bind(status.as_str())
                    .bind(now)
                    .bind(new.config.as_ref().map(|c| c.to_string()))
                    .bind(new.created_by.as_deref()),
            )
            .await
            .map_err(|e| common::map_constraint(e, "run", "run"))?;
            let mut params = 0;
            if let Some(c) = &new.config {
                params = insert_params(&mut tx, &id, c).await?;
            }
            upsert_tags(&mut tx, &id, &new.tags).await?;
            insert_event(&mut tx, &id, now, None, status, Some("created")).await?;
            Ok(params)
        }
        .await;
        let params = tx.finish(result).await?;
        self.statistics
            .note_written((1 + params + new.tags.len()) as u64);
        self.find_run(&id).await
    }

    pub(super) async fn find_run(&self, id: &str) -> StoreResult<Run> {
        let mut conn = self.reader().await?;
        let select = Sql::new(format!("SELECT {RUN_COLUMNS} FROM runs r WHERE r.id = $1"));
        let row = conn
            .fetch_optional(select.bind(id))
            .await?
            .ok_or_else(|| common::not_found_run(id))?;
        load_runs(&mut conn, vec![RunRow::from_row(&row)?])
            .await?
            .pop()
            .ok_or_else(|| common::not_found_run(id))
    }

    pub(super) async fn change_run(&self, id: &str, update: RunUpdate) -> StoreResult<Run> {
        common::check_run_text(
            update.tags.as_ref(),
            update.notes.as_deref(),
            update.config.as_ref(),
        )?;
        let lock = self.dialect().for_update();
        let mut tx = self.begin_write().await?;
        let result = async {
            let select = Sql::new(format!("SELECT config FROM runs WHERE id = $1{lock}"));
            let stored: Option<String> = tx
                .fetch_optional(select.bind(id))
                .await?
                .ok_or_else(|| common::not_found_run(id))?
                .col("config")?;
            if let Some(name) = &update.name {
                let name = common::valid_name("name", name)?;
                let set = Sql::new("UPDATE runs SET name = $1 WHERE id = $2");
                tx.execute(set.bind(name).bind(id)).await?;
            }
            if let Some(notes) = &update.notes {
                let set = Sql::new("UPDATE runs SET notes = $1 WHERE id = $2");
                tx.execute(set.bind(notes).bind(id)).await?;
            }
            if let Some(tags) = &update.tags {
                upsert_tags(&mut tx, id, tags).await?;
            }
            if let Some(config) = &update.config {
                if common::config_is_new(stored.as_deref(), config)? {
                    let set = Sql::new("UPDATE runs SET config = $1 WHERE id = $2");
                    tx.execute(set.bind(config.to_string()).bind(id)).await?;
                    insert_params(&mut tx, id, config).await?;
                }
            }
            Ok(())
        }
        .await;
        tx.finish(result).await?;
        self.find_run(id).await
    }

    pub(super) async fn replace_exit(&self, id: &str, exit: Option<ExitInfo>) -> StoreResult<()> {
        let exit = exit.unwrap_or_default();
        let mut tx = self.begin_write().await?;
        let result = async {
            let set = Sql::new(
                "UPDATE runs SET exit_code = $1, exit_signal = $2, exit_message = $3 \
                 WHERE id = $4",
            );
            let changed = tx
                .execute(
                    set.bind(exit.exit_code)
                        .bind(exit.signal)
                        .bind(exit.message.as_deref())
                        .bind(id),
                )
                .await?;
            if changed == 0 {
                return Err(common::not_found_run(id));
            }
            Ok(())
        }
        .await;
        tx.finish(result).await
    }

    pub(super) async fn change_status(
        &self,
        id: &str,
        status: RunStatus,
        reason: Option<&str>,
        exit: Option<ExitInfo>,
    ) -> StoreResult<RunEvent> {
        let now = now_ms();
        let lock = self.dialect().for_update();
        let mut tx = self.begin_write().await?;
        let result = async {
            let select = Sql::new(format!("SELECT status FROM runs WHERE id = $1{lock}"));
            let from: String = tx
                .fetch_optional(select.bind(id))
                .await?
                .ok_or_else(|| common::not_found_run(id))?
                .col("status")?;
            let from = common::parse_status(&from)?;
            let set = Sql::new(
                "UPDATE runs SET status = $1, \
                 started_at = CASE WHEN $2 AND started_at IS NULL THEN $3 ELSE started_at END, \
                 ended_at = CASE WHEN $4 THEN $3 ELSE ended_at END WHERE id = $5",
            );
            tx.execute(
                set.bind(status.as_str())
                    .bind(status == RunStatus::Running)
                    .bind(now)
                    .bind(status.is_terminal())
                    .bind(id),
            )
            .await?;
            if let Some(exit) = &exit {
                let set = Sql::new(
                    "UPDATE runs SET exit_code = $1, exit_signal = $2, exit_message = $3 \
                     WHERE id = $4",
                );
                tx.execute(
                    set.bind(exit.exit_code)
                        .bind(exit.signal)
                        .bind(exit.message.as_deref())
                        .bind(id),
                )
                .await?;
            }
            insert_event(&mut tx, id, now, Some(from), status, reason).await
        }
        .await;
        tx.finish(result).await
    }

    pub(super) async fn search(&self, query: &RunQuery) -> StoreResult<RunPage> {
        self.search_explained(query, None).await
    }

    /// The search, and with `plans` each statement it ran beside the database's plan of it:
    /// the page's statements (one per sort group read) and the reads of the page's tags,
    /// params and metrics. On Postgres they run in a transaction of their own under
    /// [`search::POSTGRES_PLANNER`].
    pub(super) async fn search_explained(
        &self,
        query: &RunQuery,
        plans: Option<&mut Vec<QueryPlan>>,
    ) -> StoreResult<RunPage> {
        let mut conn = self.reader().await?;
        if self.dialect() == Dialect::Sqlite {
            return self.search_on(&mut conn, query, plans).await;
        }
        // Read-only work: its outcome says nothing of the database's health for writes.
        let health = WriteHealth::default();
        let mut tx = Tx::begin(conn, &health).await?;
        let result = async {
            tx.execute(Sql::new(search::POSTGRES_PLANNER)).await?;
            self.search_on(&mut tx, query, plans).await
        }
        .await;
        tx.finish(result).await
    }

    async fn search_on(
        &self,
        conn: &mut Conn,
        query: &RunQuery,
        mut plans: Option<&mut Vec<QueryPlan>>,
    ) -> StoreResult<RunPage> {
        let plan = search::SearchPlan::new(query)?;
        let wanted = plan.wanted();
        let mut runs = Vec::new();
        let mut sorts = Vec::new();
        for g in plan.groups() {
            let select = plan.statement(g, wanted - runs.len(), self.dialect())?;
            if let Some(plans) = plans.as_deref_mut() {
                plans.push(self.explain(conn, &select).await?);
            }
            for row in conn.fetch_all(select).await? {
                runs.push(RunRow::from_row(&row)?);
                sorts.push(plan.sort_values(g, &row)?);
            }
            if runs.len() >= wanted {
                break;
            }
        }
        let next_cursor = search::finish_page(query, &mut runs, &sorts);
        let ids: Vec<String> = runs.iter().map(|r| r.id.clone()).collect();
        if let Some(plans) = plans {
            for select in detail_statements(&ids) {
                plans.push(self.explain(conn, &select).await?);
            }
        }
        Ok(RunPage {
            runs: load_runs(conn, runs).await?,
            next_cursor,
        })
    }

    /// The database's plan of a statement: Postgres runs it under
    /// `EXPLAIN (ANALYZE, FORMAT JSON)` (what each node read), SQLite answers
    /// `EXPLAIN QUERY PLAN` (one line per step, `SCAN` or `SEARCH ... USING INDEX`).
    async fn explain(&self, conn: &mut Conn, select: &Sql) -> StoreResult<QueryPlan> {
        let (prefix, sqlite) = match self.dialect() {
            Dialect::Postgres => ("EXPLAIN (ANALYZE, FORMAT JSON) ", false),
            Dialect::Sqlite => ("EXPLAIN QUERY PLAN ", true),
        };
        use sqlx::Row as _;
        let rows = conn.fetch_all(select.prefixed(prefix)).await?;
        let mut plan = String::new();
        for row in &rows {
            match row {
                Row::Sqlite(r) if sqlite => {
                    plan.push_str(r.try_get::<String, _>("detail")?.as_str());
                    plan.push('\n');
                }
                Row::Postgres(r) => {
                    plan.push_str(&r.try_get::<serde_json::Value, _>("QUERY PLAN")?.to_string());
                }
                Row::Sqlite(_) => {}
            }
        }
        Ok(QueryPlan {
            statement: select.text().to_string(),
            plan,
        })
    }

    pub(super) async fn events_of(
        &self,
        run_id: &str,
        after_seq: Option<i64>,
    ) -> StoreResult<Vec<RunEvent>> {
        let mut conn = self.reader().await?;
        self.run_exists(&mut conn, run_id).await?;
        let select = Sql::new(format!(
            "SELECT {EVENT_COLUMNS} FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq"
        ));
        let rows = conn
            .fetch_all(select.bind(run_id).bind(after_seq.unwrap_or(0)))
            .await?;
        rows.iter().map(event).collect()
    }

    pub(super) async fn runs_in(&self, statuses: &[RunStatus]) -> StoreResult<Vec<Run>> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let mut select = Sql::new(format!(
            "SELECT {RUN_COLUMNS} FROM runs r WHERE r.status IN "
        ));
        select.tuple(statuses.iter().map(|s| s.as_str()));
        select.push(" ORDER BY r.created_at, r.id");
        let mut conn = self.reader().await?;
        let rows = conn.fetch_all(select).await?;
        load_runs(&mut conn, run_rows(&rows)?).await
    }
}
