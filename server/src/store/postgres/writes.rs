//! The Postgres metric write path.
//!
//! Why a path of its own: its statements bind one array per column and read `UNNEST`, so a
//! batch costs the same few round trips whatever its size; the common case (only new points
//! of series whose ids are cached) is one auto-committed statement that probes for stored
//! points, reserves the points' seqs (which locks the run), inserts without a per-point
//! `ON CONFLICT` check or `RETURNING`, records the write, and updates the series and rollups.
//! Together that took Postgres ingest from about 250,000 to 380,000 points/s
//! (docs/benchmarks-journal.md, store-perf steps 3, 4 and 6; per-run seqs added about a fifth on a
//! later machine, "Points indexed by (series, step) only"). SQLite has neither arrays nor
//! concurrent writers; its fast path is in `sqlite.rs`. A NaN value is stored as NULL
//! (`NULLIF(value, 'NaN')`: Postgres counts NaN equal to NaN).

use std::collections::HashMap;

use sqlx::postgres::PgConnection;
use sqlx::Row;

use super::Pools;
use crate::store::downsample;
use crate::store::ingest::{self, Batch};
use crate::store::sql_store::{record_write, reserve_seqs, series_for, stored_values, SqlStore};
use crate::store::{Appended, StoreResult};

/// Writes a batch: the one-statement path when it applies, else the locked upsert.
pub async fn write_batch(
    store: &SqlStore,
    pools: &Pools,
    run_id: &str,
    batch: &Batch,
) -> StoreResult<Appended> {
    if !batch.points.is_empty() {
        let appended = match store.writer().await {
            Ok(mut conn) => append_new(pools, conn.postgres()?, run_id, batch).await,
            Err(e) => Err(e),
        };
        if let Some(appended) = store.note_write(appended)? {
            return Ok(appended);
        }
    }
    let mut tx = store.begin_write().await?;
    let result = upsert_batch(&mut tx, run_id, batch).await;
    let (appended, series) = tx.finish(result).await?;
    // After the commit: a cached id is a series that exists.
    pools.series_ids.put(run_id, &series);
    Ok(appended)
}

/// The series updates and rollup upserts of a batch, as data-modifying CTEs `upd` and `roll`
/// over parameters `$n..$n+14` (five series arrays, then ten rollup arrays), both skipped when
/// `guard` (an SQL condition) is false.
fn changes_ctes(n: usize, guard: &str) -> String {
    let p = |i: usize| format!("${}", n + i);
    format!(
        "upd AS (UPDATE metric_series s SET count = s.count + u.added, \
         last_step = CASE WHEN u.step > s.last_step THEN u.step ELSE s.last_step END, \
         last_value = CASE WHEN u.step > s.last_step THEN u.value ELSE s.last_value END, \
         last_time = CASE WHEN u.step > s.last_step THEN u.time ELSE s.last_time END \
         FROM UNNEST({}::int8[], {}::int8[], {}::int8[], {}::float8[], {}::int8[]) \
         AS u(id, added, step, value, time) WHERE s.id = u.id AND {guard}), \
         roll AS (INSERT INTO metric_rollups (series_id, level, bucket, count, min_step, \
         min_value, min_time, max_step, max_value, max_time) \
         SELECT * FROM UNNEST({}::int8[], {}::int4[], {}::int8[], {}::int8[], {}::int8[], \
         {}::float8[], {}::int8[], {}::int8[], {}::float8[], {}::int8[]) WHERE {guard}{})",
        p(0),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        p(8),
        p(9),
        p(10),
        p(11),
        p(12),
        p(13),
        p(14),
        ingest::ROLLUP_MERGE
    )
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Binds the fifteen arrays `changes_ctes` reads.
fn bind_changes<'q>(
    q: PgQuery<'q>,
    series: &[ingest::SeriesUpdate],
    rollups: &[(i64, downsample::RollupDelta)],
) -> PgQuery<'q> {
    q.bind(series.iter().map(|x| x.series_id).collect::<Vec<_>>())
        .bind(series.iter().map(|x| x.added).collect::<Vec<_>>())
        .bind(series.iter().map(|x| x.last_step).collect::<Vec<_>>())
        .bind(series.iter().map(|x| x.last_value).collect::<Vec<_>>())
        .bind(series.iter().map(|x| x.last_time).collect::<Vec<_>>())
        .bind(rollups.iter().map(|x| x.0).collect::<Vec<_>>())
        .bind(rollups.iter().map(|x| x.1.level).collect::<Vec<_>>())
        .bind(rollups.iter().map(|x| x.1.bucket).collect::<Vec<_>>())
        .bind(rollups.iter().map(|x| x.1.agg.count).collect::<Vec<_>>())
        .bind(rollups.iter().map(|x| x.1.agg.min.step).collect::<Vec<_>>())
        .bind(
            rollups
                .iter()
                .map(|x| x.1.agg.min.value)
                .collect::<Vec<_>>(),
        )
        .bind(rollups.iter().map(|x| x.1.agg.min.time).collect::<Vec<_>>())
        .bind(rollups.iter().map(|x| x.1.agg.max.step).collect::<Vec<_>>())
        .bind(
            rollups
                .iter()
                .map(|x| x.1.agg.max.value)
                .collect::<Vec<_>>(),
        )
        .bind(rollups.iter().map(|x| x.1.agg.max.time).collect::<Vec<_>>())
}

/// (series, step) → seq from three arrays of equal length (NULL when no row was inserted).
fn inserted_map(
    seqs: Option<Vec<i64>>,
    sids: Option<Vec<i64>>,
    steps: Option<Vec<i64>>,
) -> HashMap<(i64, i64), i64> {
    let (seqs, sids, steps) = (
        seqs.unwrap_or_default(),
        sids.unwrap_or_default(),
        steps.unwrap_or_default(),
    );
    sids.into_iter().zip(steps).zip(seqs).collect()
}

/// Columns of a batch's points for `UNNEST`.
struct Columns {
    sids: Vec<i64>,
    steps: Vec<i64>,
    values: Vec<f64>,
    times: Vec<i64>,
}

impl Columns {
    fn of(batch: &ingest::Batch, series: &ingest::SeriesMap) -> Self {
        let n = batch.points.len();
        let mut c = Columns {
            sids: Vec::with_capacity(n),
            steps: Vec::with_capacity(n),
            values: Vec::with_capacity(n),
            times: Vec::with_capacity(n),
        };
        for p in &batch.points {
            c.sids.push(series.id(&p.key));
            c.steps.push(p.step);
            c.values.push(p.value);
            c.times.push(p.time);
        }
        c
    }
}

/// `(seqs, series ids, steps)` of inserted points, aggregated into one row.
type Inserted = (Option<Vec<i64>>, Option<Vec<i64>>, Option<Vec<i64>>);

/// The common case in one round trip (two when the series ids are not cached): a batch of
/// only new points for existing series. One statement checks the series ids, probes each
/// series' step range of the batch for stored points (one index descent per series instead of
/// an `ON CONFLICT` check per point), and, when there are none, reserves the points' seqs in
/// the run row (locking it), inserts the points with them, records the write and applies the
/// series and rollup changes.
/// `None` (nothing written) when a series is missing, the run is unknown, or a point of the
/// batch may already exist: `upsert_batch` handles those.
async fn append_new(
    pools: &Pools,
    conn: &mut PgConnection,
    run_id: &str,
    batch: &Batch,
) -> StoreResult<Option<Appended>> {
    let series = match pools.series_ids.get(run_id, &batch.keys) {
        Some(series) => series,
        None => {
            let rows = sqlx::query(
                "SELECT id, key FROM metric_series WHERE run_id = $1 AND key = ANY($2)",
            )
            .bind(run_id)
            .bind(&batch.keys)
            .fetch_all(&mut *conn)
            .await?;
            if rows.len() != batch.keys.len() {
                return Ok(None);
            }
            let mut series = ingest::SeriesMap::default();
            for row in rows {
                series.insert(row.try_get("key")?, row.try_get("id")?);
            }
            pools.series_ids.put(run_id, &series);
            series
        }
    };
    let columns = Columns::of(batch, &series);
    let (series_updates, rollups) = ingest::changes(batch, &series, |_, _| true);
    let ranges = ingest::step_ranges(batch, &series);
    let first_step = ranges.iter().map(|r| r.1).min().unwrap_or(0);
    let last_step = ranges.iter().map(|r| r.2).max().unwrap_or(0);
    // One statement, so one transaction that commits before it returns. `run` reserves the
    // points' seqs and takes the run's row lock before any point is inserted, so a run's
    // seqs follow commit order. The probe reads the statement's snapshot: a writer that
    // committed while this one waited for the lock is not seen, and should the two overlap,
    // the plain insert fails on the unique index and changes nothing.
    let guard = "EXISTS (SELECT 1 FROM run)";
    let sql = format!(
        "WITH clash AS MATERIALIZED (SELECT EXISTS (SELECT 1 FROM \
             UNNEST($6::int8[], $7::int8[], $8::int8[]) AS r(sid, lo, hi) WHERE EXISTS \
             (SELECT 1 FROM metric_points p WHERE p.series_id = r.sid \
             AND p.step >= r.lo AND p.step <= r.hi)) AS found), \
             run AS MATERIALIZED (UPDATE runs SET point_seq = point_seq + cardinality($1::int8[]) \
             WHERE id = $5 AND NOT (SELECT found FROM clash) AND (SELECT count(*) FROM \
             metric_series WHERE run_id = $5 AND id = ANY($6::int8[])) = cardinality($6::int8[]) \
             RETURNING point_seq - cardinality($1::int8[]) AS base), \
             ins AS (INSERT INTO metric_points (series_id, step, value, time, seq) \
             SELECT u.sid, u.step, NULLIF(u.value, 'NaN'), u.time, run.base + u.ord FROM run, \
             UNNEST($1::int8[], $2::int8[], $3::float8[], $4::int8[]) WITH ORDINALITY \
             AS u(sid, step, value, time, ord)), \
             wr AS (INSERT INTO metric_writes (run_id, first_seq, last_seq, first_step, \
             last_step, count) SELECT $5, base + 1, base + cardinality($1::int8[]), $9, $10, \
             cardinality($1::int8[]) FROM run), {} \
             SELECT (SELECT base FROM run) AS base",
        changes_ctes(11, guard)
    );
    let q = sqlx::query(&sql)
        .bind(&columns.sids)
        .bind(&columns.steps)
        .bind(&columns.values)
        .bind(&columns.times)
        .bind(run_id)
        .bind(ranges.iter().map(|r| r.0).collect::<Vec<_>>())
        .bind(ranges.iter().map(|r| r.1).collect::<Vec<_>>())
        .bind(ranges.iter().map(|r| r.2).collect::<Vec<_>>())
        .bind(first_step)
        .bind(last_step);
    let row = match bind_changes(q, &series_updates, &rollups)
        .fetch_one(&mut *conn)
        .await
    {
        Ok(row) => row,
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            pools.series_ids.forget(run_id);
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let Some(base) = row.try_get::<Option<i64>, _>("base")? else {
        // The run is unknown, a cached id is stale, or points exist: start from scratch.
        pools.series_ids.forget(run_id);
        return Ok(None);
    };
    let seqs: Vec<i64> = (1..=batch.points.len() as i64).map(|i| base + i).collect();
    // Every point was new: only repeats within the batch can conflict.
    let conflicts = ingest::conflicts(batch, &series, &HashMap::new());
    let stored = ingest::stored_in_order(batch, &seqs);
    Ok(Some(Appended { stored, conflicts }))
}

/// Writes a batch in one transaction under the run's row lock: missing series are created,
/// points upserted (a stored (series, step) keeps its first value), and only the new points
/// counted in their series and rollups.
async fn upsert_batch(
    tx: &mut crate::store::sql::Conn,
    run_id: &str,
    batch: &Batch,
) -> StoreResult<(Appended, ingest::SeriesMap)> {
    // The row lock serializes writers of one run, so seq order is commit order. It is a
    // statement of its own: the statements after it take their snapshots once it is held,
    // so they see every series and point the previous holder committed.
    let base = reserve_seqs(tx, run_id, batch.points.len()).await?;
    if batch.points.is_empty() {
        return Ok((Appended::default(), ingest::SeriesMap::default()));
    }
    let series = series_for(tx, run_id, &batch.keys).await?;
    let columns = Columns::of(batch, &series);
    let (seqs, sids, steps): Inserted = sqlx::query_as(
        "WITH ins AS (INSERT INTO metric_points (series_id, step, value, time, seq) \
         SELECT u.sid, u.step, NULLIF(u.value, 'NaN'), u.time, $5 + u.ord FROM UNNEST($1::int8[], \
         $2::int8[], $3::float8[], $4::int8[]) WITH ORDINALITY AS u(sid, step, value, time, ord) \
         ON CONFLICT (series_id, step) DO NOTHING RETURNING seq, series_id, step) \
         SELECT array_agg(seq), array_agg(series_id), array_agg(step) FROM ins",
    )
    .bind(&columns.sids)
    .bind(&columns.steps)
    .bind(&columns.values)
    .bind(&columns.times)
    .bind(base)
    .fetch_one(&mut *tx.postgres()?)
    .await?;
    let inserted = inserted_map(seqs, sids, steps);
    let outcome = ingest::summarize(batch, &series, &inserted);
    record_write(tx, run_id, &outcome.stored).await?;
    let earlier = stored_values(tx, &ingest::not_inserted(batch, &series, &inserted)).await?;
    if !outcome.series.is_empty() {
        let sql = format!("WITH {} SELECT 1", changes_ctes(1, "true"));
        bind_changes(sqlx::query(&sql), &outcome.series, &outcome.rollups)
            .execute(&mut *tx.postgres()?)
            .await?;
    }
    let appended = Appended {
        conflicts: ingest::conflicts(batch, &series, &earlier),
        stored: outcome.stored,
    };
    Ok((appended, series))
}
