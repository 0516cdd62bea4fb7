//! Metric points of the Postgres backend: batched idempotent writes, rollups, series reads.

use super::{acquire, begin, PgStore};
use crate::store::common;
use crate::store::downsample::{self, Agg, Extreme, SeriesSource};
use crate::store::ingest;
use crate::store::{
    Appended, MetricKey, MetricPoint, Series, SeriesPoint, StoreResult, StoredPoint,
};
use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use std::collections::HashMap;

fn agg(r: &PgRow) -> StoreResult<Agg> {
    Ok(Agg {
        count: r.try_get(0)?,
        min: Extreme {
            step: r.try_get(1)?,
            value: r.try_get(2)?,
            time: r.try_get(3)?,
        },
        max: Extreme {
            step: r.try_get(4)?,
            value: r.try_get(5)?,
            time: r.try_get(6)?,
        },
    })
}

struct PostgresSeries<'a> {
    pool: &'a PgPool,
    series_id: i64,
}

#[async_trait]
impl SeriesSource for PostgresSeries<'_> {
    async fn raw(&self, from: i64, to: i64) -> StoreResult<Vec<SeriesPoint>> {
        // One row of three arrays: decoding it costs a fraction of one row per point, on both
        // ends of the connection.
        let (steps, values, times): (Option<Vec<i64>>, Option<Vec<f64>>, Option<Vec<i64>>) =
            sqlx::query_as(
                "SELECT array_agg(step), array_agg(value), array_agg(time) FROM \
                 (SELECT step, value, time FROM metric_points \
                  WHERE series_id = $1 AND step >= $2 AND step <= $3 ORDER BY step) AS p",
            )
            .bind(self.series_id)
            .bind(from)
            .bind(to)
            .fetch_one(&mut *acquire(self.pool).await?)
            .await?;
        let (steps, values, times) = (
            steps.unwrap_or_default(),
            values.unwrap_or_default(),
            times.unwrap_or_default(),
        );
        let mut points: Vec<SeriesPoint> = steps
            .into_iter()
            .zip(values)
            .zip(times)
            .map(|((step, value), time)| SeriesPoint { step, value, time })
            .collect();
        // Aggregates take the rows in the sorted subquery's order; SQL does not promise that,
        // so the order is checked (and restored) here.
        if !points.windows(2).all(|w| w[0].step < w[1].step) {
            points.sort_by_key(|p| p.step);
        }
        Ok(points)
    }

    async fn rollups(&self, level: u32, from: i64, to: i64) -> StoreResult<Vec<Agg>> {
        let rows = sqlx::query(
            "SELECT count, min_step, min_value, min_time, max_step, max_value, max_time \
             FROM metric_rollups WHERE series_id = $1 AND level = $2 AND bucket >= $3 AND bucket < $4",
        )
        .bind(self.series_id)
        .bind(level as i32)
        .bind(from)
        .bind(to)
        .fetch_all(&mut *acquire(self.pool).await?)
        .await?;
        rows.iter().map(agg).collect()
    }

    async fn bounds(&self, from: i64, to: i64) -> StoreResult<Option<(i64, i64)>> {
        let mut conn = acquire(self.pool).await?;
        let mut one = async |order: &'static str| {
            sqlx::query_scalar::<_, i64>(if order == "ASC" {
                "SELECT step FROM metric_points WHERE series_id = $1 AND step >= $2 AND step <= $3 \
                 ORDER BY step ASC LIMIT 1"
            } else {
                "SELECT step FROM metric_points WHERE series_id = $1 AND step >= $2 AND step <= $3 \
                 ORDER BY step DESC LIMIT 1"
            })
            .bind(self.series_id)
            .bind(from)
            .bind(to)
            .fetch_optional(&mut *conn)
            .await
        };
        let first = one("ASC").await?;
        let last = one("DESC").await?;
        Ok(first.zip(last))
    }
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

/// Most (run, key) → series id entries the cache holds before it starts over.
const SERIES_CACHE_MAX: usize = 100_000;

/// Series ids of recently written (run, key)s, so that a batch need not look them up. An entry
/// is only a hint: the statement that uses it checks that every id is a series of the run.
#[derive(Default)]
pub(super) struct SeriesCache(std::sync::Mutex<CachedIds>);

/// Entries in all, and run → key → series id.
type CachedIds = (usize, HashMap<String, HashMap<String, i64>>);

impl SeriesCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, CachedIds> {
        // Every operation leaves the map consistent, so a panicked holder does not matter.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The ids of all `keys` of the run, or `None` when one is not cached.
    fn get(&self, run_id: &str, keys: &[String]) -> Option<ingest::SeriesMap> {
        let cache = self.lock();
        let run = cache.1.get(run_id)?;
        let mut series = ingest::SeriesMap::default();
        for key in keys {
            series.insert(key.clone(), *run.get(key)?);
        }
        Some(series)
    }

    fn put(&self, run_id: &str, series: &ingest::SeriesMap) {
        let mut cache = self.lock();
        if cache.0 >= SERIES_CACHE_MAX {
            *cache = (0, HashMap::new());
        }
        let (entries, runs) = &mut *cache;
        let run = runs.entry(run_id.to_string()).or_default();
        for (key, id) in series.iter() {
            if run.insert(key.clone(), id).is_none() {
                *entries += 1;
            }
        }
    }

    fn forget(&self, run_id: &str) {
        let mut cache = self.lock();
        if let Some(run) = cache.1.remove(run_id) {
            cache.0 -= run.len();
        }
    }
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

impl PgStore {
    pub(super) async fn write_points(
        &self,
        run_id: &str,
        points: &[MetricPoint],
        now_ms: i64,
    ) -> StoreResult<Appended> {
        let batch = ingest::prepare_batch(points, now_ms)?;
        if !batch.points.is_empty() {
            if let Some(appended) = self.append_new(run_id, &batch).await? {
                return Ok(appended);
            }
        }
        self.upsert_batch(run_id, &batch).await
    }

    /// The common case in one round trip (two when the series ids are not cached): a batch of
    /// only new points for existing series. One statement checks the series ids, locks the run row, probes each series' step range of the batch for stored
    /// points (one index descent per series instead of an `ON CONFLICT` check per point), and,
    /// when there are none, inserts the points and applies the series and rollup changes.
    /// `None` (nothing written) when a series is missing, the run is unknown, or a point of the
    /// batch may already exist: `upsert_batch` handles those.
    async fn append_new(
        &self,
        run_id: &str,
        batch: &ingest::Batch,
    ) -> StoreResult<Option<Appended>> {
        let series = match self.series_ids.get(run_id, &batch.keys) {
            Some(series) => series,
            None => {
                let rows = sqlx::query(
                    "SELECT id, key FROM metric_series WHERE run_id = $1 AND key = ANY($2)",
                )
                .bind(run_id)
                .bind(&batch.keys)
                .fetch_all(&mut *acquire(&self.pool).await?)
                .await?;
                if rows.len() != batch.keys.len() {
                    return Ok(None);
                }
                let mut series = ingest::SeriesMap::default();
                for row in rows {
                    series.insert(row.try_get(1)?, row.try_get(0)?);
                }
                self.series_ids.put(run_id, &series);
                series
            }
        };
        let columns = Columns::of(batch, &series);
        let (series_updates, rollups) = ingest::changes(batch, &series, |_, _| true);
        let ranges = ingest::step_ranges(batch, &series);
        // One statement, so one transaction that commits before it returns. The run lock is
        // taken before any point gets its seq (the guard is evaluated before the first row),
        // so a run's seqs follow commit order. The probe reads the statement's snapshot: a
        // writer that committed while this one waited for the lock is not seen, and should the
        // two overlap, the plain insert fails on the unique index and changes nothing.
        let guard = "(SELECT ok FROM run) AND NOT (SELECT found FROM clash)";
        let sql = format!(
            "WITH run AS MATERIALIZED (SELECT true AS ok FROM runs WHERE id = $5 \
             AND (SELECT count(*) FROM metric_series WHERE run_id = $5 AND id = ANY($6::int8[])) \
             = cardinality($6::int8[]) FOR UPDATE), \
             clash AS MATERIALIZED (SELECT EXISTS (SELECT 1 FROM \
             UNNEST($6::int8[], $7::int8[], $8::int8[]) AS r(sid, lo, hi) WHERE EXISTS \
             (SELECT 1 FROM metric_points p WHERE p.series_id = r.sid \
             AND p.step >= r.lo AND p.step <= r.hi)) AS found), \
             ins AS (INSERT INTO metric_points (series_id, step, value, time) \
             SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::float8[], $4::int8[]) \
             WHERE {guard} RETURNING seq, series_id, step), {} \
             SELECT COALESCE({guard}, false), array_agg(seq), array_agg(series_id), \
             array_agg(step) FROM ins",
            changes_ctes(9, guard)
        );
        let q = sqlx::query(&sql)
            .bind(&columns.sids)
            .bind(&columns.steps)
            .bind(&columns.values)
            .bind(&columns.times)
            .bind(run_id)
            .bind(ranges.iter().map(|r| r.0).collect::<Vec<_>>())
            .bind(ranges.iter().map(|r| r.1).collect::<Vec<_>>())
            .bind(ranges.iter().map(|r| r.2).collect::<Vec<_>>());
        let row = match bind_changes(q, &series_updates, &rollups)
            .fetch_one(&mut *acquire(&self.pool).await?)
            .await
        {
            Ok(row) => row,
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                self.series_ids.forget(run_id);
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        if !row.try_get::<bool, _>(0)? {
            // The run is unknown, a cached id is stale, or points exist: start from scratch.
            self.series_ids.forget(run_id);
            return Ok(None);
        }
        let (seqs, sids, steps): Inserted = (row.try_get(1)?, row.try_get(2)?, row.try_get(3)?);
        let seqs = seqs.unwrap_or_default();
        // Every point was new: only repeats within the batch can conflict.
        let conflicts = ingest::conflicts(batch, &series, &HashMap::new());
        // Rows usually come back in input order; then seqs pair up with points directly.
        let stored =
            if sids.as_ref() == Some(&columns.sids) && steps.as_ref() == Some(&columns.steps) {
                ingest::stored_in_order(batch, &seqs)
            } else {
                ingest::stored(batch, &series, &inserted_map(Some(seqs), sids, steps))
            };
        Ok(Some(Appended { stored, conflicts }))
    }

    /// Writes a batch in one transaction under the run's row lock: missing series are created,
    /// points upserted (a stored (series, step) keeps its first value), and only the new points
    /// counted in their series and rollups.
    async fn upsert_batch(&self, run_id: &str, batch: &ingest::Batch) -> StoreResult<Appended> {
        let mut tx = begin(&self.pool).await?;
        // The row lock serializes writers of one run, so seq order is commit order. It is a
        // statement of its own: the statements after it take their snapshots once it is held,
        // so they see every series and point the previous holder committed.
        sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
            .bind(run_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| common::not_found_run(run_id))?;
        if batch.points.is_empty() {
            return Ok(Appended::default());
        }
        let mut series = ingest::SeriesMap::default();
        let rows =
            sqlx::query("SELECT id, key FROM metric_series WHERE run_id = $1 AND key = ANY($2)")
                .bind(run_id)
                .bind(&batch.keys)
                .fetch_all(&mut *tx)
                .await?;
        for row in rows {
            series.insert(row.try_get(1)?, row.try_get(0)?);
        }
        // Series of the batch's keys, created on first use.
        let missing: Vec<&String> = batch
            .keys
            .iter()
            .filter(|k| series.get(k).is_none())
            .collect();
        if !missing.is_empty() {
            let rows = sqlx::query(
                "INSERT INTO metric_series (run_id, key, count, last_step, last_value, last_time) \
                 SELECT $1, k, 0, -1, 0, 0 FROM UNNEST($2::text[]) AS u(k) RETURNING id, key",
            )
            .bind(run_id)
            .bind(missing)
            .fetch_all(&mut *tx)
            .await?;
            for row in rows {
                series.insert(row.try_get(1)?, row.try_get(0)?);
            }
        }
        let columns = Columns::of(batch, &series);
        let (seqs, sids, steps): Inserted = sqlx::query_as(
            "WITH ins AS (INSERT INTO metric_points (series_id, step, value, time) \
             SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::float8[], $4::int8[]) \
             ON CONFLICT (series_id, step) DO NOTHING RETURNING seq, series_id, step) \
             SELECT array_agg(seq), array_agg(series_id), array_agg(step) FROM ins",
        )
        .bind(&columns.sids)
        .bind(&columns.steps)
        .bind(&columns.values)
        .bind(&columns.times)
        .fetch_one(&mut *tx)
        .await?;
        let inserted = inserted_map(seqs, sids, steps);
        let outcome = ingest::summarize(batch, &series, &inserted);
        // Values of the points that were stored before, to report the ones sent differently.
        let (old_sids, old_steps): (Vec<i64>, Vec<i64>) =
            ingest::not_inserted(batch, &series, &inserted)
                .into_iter()
                .unzip();
        let mut earlier = HashMap::new();
        if !old_sids.is_empty() {
            let rows = sqlx::query(
                "SELECT p.series_id, p.step, p.value FROM metric_points p \
                 JOIN UNNEST($1::int8[], $2::int8[]) AS u(sid, step) \
                 ON p.series_id = u.sid AND p.step = u.step",
            )
            .bind(&old_sids)
            .bind(&old_steps)
            .fetch_all(&mut *tx)
            .await?;
            for row in rows {
                earlier.insert((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?);
            }
        }
        if !outcome.series.is_empty() {
            let sql = format!("WITH {} SELECT 1", changes_ctes(1, "true"));
            bind_changes(sqlx::query(&sql), &outcome.series, &outcome.rollups)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.series_ids.put(run_id, &series);
        Ok(Appended {
            conflicts: ingest::conflicts(batch, &series, &earlier),
            stored: outcome.stored,
        })
    }

    pub(super) async fn keys_of(&self, run_id: &str) -> StoreResult<Vec<MetricKey>> {
        self.run_exists(run_id).await?;
        Ok(sqlx::query_as::<_, MetricKey>(
            "SELECT key, count, last_step, last_value FROM metric_series \
             WHERE run_id = $1 AND count > 0 ORDER BY key",
        )
        .bind(run_id)
        .fetch_all(&mut *acquire(&self.pool).await?)
        .await?)
    }

    pub(super) async fn series_of(
        &self,
        run_id: &str,
        key: &str,
        start_step: Option<i64>,
        end_step: Option<i64>,
        max_points: usize,
    ) -> StoreResult<Series> {
        let series =
            sqlx::query("SELECT id, count FROM metric_series WHERE run_id = $1 AND key = $2")
                .bind(run_id)
                .bind(key)
                .fetch_optional(&mut *acquire(&self.pool).await?)
                .await?;
        let Some(series) = series else {
            self.run_exists(run_id).await?;
            return Ok(common::empty_series(key));
        };
        let src = PostgresSeries {
            pool: &self.pool,
            series_id: series.try_get(0)?,
        };
        let count: i64 = series.try_get(1)?;
        downsample::read_series(&src, key, count, start_step, end_step, max_points).await
    }

    pub(super) async fn points_after(
        &self,
        run_id: &str,
        after_seq: Option<i64>,
        after_step: Option<i64>,
        limit: usize,
    ) -> StoreResult<Vec<StoredPoint>> {
        let keys = self.series_keys(run_id).await?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = keys.keys().copied().collect();
        // Series ids first: the points scan then walks `seq` order without a join.
        let rows = sqlx::query(
            "SELECT series_id, step, value, time, seq FROM metric_points \
             WHERE series_id = ANY($1) AND seq > $2 AND step > $3 ORDER BY seq LIMIT $4",
        )
        .bind(ids)
        .bind(after_seq.unwrap_or(0))
        .bind(after_step.unwrap_or(-1))
        .bind(limit as i64)
        .fetch_all(&mut *acquire(&self.pool).await?)
        .await?;
        rows.iter()
            .map(|r| {
                let sid: i64 = r.try_get(0)?;
                Ok(StoredPoint {
                    key: keys.get(&sid).cloned().unwrap_or_default(),
                    step: r.try_get(1)?,
                    value: r.try_get(2)?,
                    time: r.try_get(3)?,
                    seq: r.try_get(4)?,
                })
            })
            .collect()
    }

    /// Series id → key of every metric of the run (`NotFound` for an unknown run).
    async fn series_keys(
        &self,
        run_id: &str,
    ) -> StoreResult<std::collections::HashMap<i64, String>> {
        self.run_exists(run_id).await?;
        let rows = sqlx::query("SELECT id, key FROM metric_series WHERE run_id = $1")
            .bind(run_id)
            .fetch_all(&mut *acquire(&self.pool).await?)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }
}
