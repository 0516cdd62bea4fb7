//! Metric reads (keys, series, live catch-up) and the pieces both metric write paths share.

use std::collections::HashMap;

use async_trait::async_trait;

use super::SqlStore;
use crate::store::downsample::{self, Agg, Extreme, SeriesSource};
use crate::store::ingest::SeriesMap;
use crate::store::sql::{Conn, Row, Sql};
use crate::store::{
    common, postgres, MetricExtremes, MetricKey, Series, SeriesPoint, StoreResult, StoredPoint,
};

/// Steps per `IN` list when looking up stored points.
const CHUNK: usize = 500;

/// A point's value: NaN is stored as NULL (`migrations/*/20270310000000_nan_points.sql`).
pub fn point_value(r: &Row, i: usize) -> Result<f64, sqlx::Error> {
    Ok(r.get::<Option<f64>>(i)?.unwrap_or(f64::NAN))
}

/// The series ids of a run's `keys`, creating the missing series (in a write transaction).
pub async fn series_for(tx: &mut Conn, run_id: &str, keys: &[String]) -> StoreResult<SeriesMap> {
    let mut select =
        Sql::new("SELECT id, key FROM metric_series WHERE run_id = $1 AND key IN ").bind(run_id);
    select.tuple(keys);
    let mut series = SeriesMap::default();
    for row in tx.fetch_all(select).await? {
        series.insert(row.col("key")?, row.col("id")?);
    }
    for key in keys {
        if series.get(key).is_none() {
            // The series carries its run's experiment (what a search within one walks).
            let insert = Sql::new(
                "INSERT INTO metric_series (run_id, experiment_id, key, count, last_step, \
                 last_value, last_time) SELECT id, experiment_id, $2, 0, -1, 0, 0 \
                 FROM runs WHERE id = $1 RETURNING id",
            );
            let row = tx
                .fetch_optional(insert.bind(run_id).bind(key))
                .await?
                .ok_or_else(|| common::not_found_run(run_id))?;
            series.insert(key.clone(), row.col("id")?);
        }
    }
    Ok(series)
}

/// The stored values of these (series, step)s.
pub async fn stored_values(
    tx: &mut Conn,
    points: &[(i64, i64)],
) -> StoreResult<HashMap<(i64, i64), f64>> {
    let mut by_series: HashMap<i64, Vec<i64>> = HashMap::new();
    for &(sid, step) in points {
        by_series.entry(sid).or_default().push(step);
    }
    let mut values = HashMap::with_capacity(points.len());
    for (sid, steps) in by_series {
        for chunk in steps.chunks(CHUNK) {
            let mut select =
                Sql::new("SELECT step, value FROM metric_points WHERE series_id = $1 AND step IN ")
                    .bind(sid);
            select.tuple(chunk.iter().copied());
            let rows = tx.fetch_all(select).await?;
            let Some(first) = rows.first() else {
                continue;
            };
            let [step, value] = first.positions(["step", "value"])?;
            for row in &rows {
                values.insert((sid, row.get(step)?), point_value(row, value)?);
            }
        }
    }
    Ok(values)
}

/// Reserves `n` seqs of the run for the points a write is about to store, taking the run's row
/// lock until the transaction ends (so a run's seqs follow commit order); the first reserved
/// seq is the returned base + 1. A run that does not exist is not found.
pub async fn reserve_seqs(tx: &mut Conn, run_id: &str, n: usize) -> StoreResult<i64> {
    let reserve = Sql::new(
        "UPDATE runs SET point_seq = point_seq + $1 WHERE id = $2 \
         RETURNING point_seq - $1 AS base",
    )
    .bind(n as i64)
    .bind(run_id);
    let row = tx
        .fetch_optional(reserve)
        .await?
        .ok_or_else(|| common::not_found_run(run_id))?;
    Ok(row.col("base")?)
}

/// Records which seqs and steps a write stored, for live catch-up (`points_after`).
pub async fn record_write(tx: &mut Conn, run_id: &str, stored: &[StoredPoint]) -> StoreResult<()> {
    let Some(first) = stored.first() else {
        return Ok(());
    };
    let (mut seqs, mut steps) = ((first.seq, first.seq), (first.step, first.step));
    for p in stored {
        seqs = (seqs.0.min(p.seq), seqs.1.max(p.seq));
        steps = (steps.0.min(p.step), steps.1.max(p.step));
    }
    let insert = Sql::new(
        "INSERT INTO metric_writes (run_id, first_seq, last_seq, first_step, last_step, count) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    );
    tx.execute(
        insert
            .bind(run_id)
            .bind(seqs.0)
            .bind(seqs.1)
            .bind(steps.0)
            .bind(steps.1)
            .bind(stored.len() as i64),
    )
    .await?;
    Ok(())
}

/// A run's write as `metric_writes` records it.
#[derive(Clone, Copy)]
struct Write {
    last_seq: i64,
    first_step: i64,
    last_step: i64,
    count: i64,
}

/// Writes read per catch-up page.
const WRITES_PAGE: i64 = 256;

/// The run's writes that may hold seqs above `after`, in seq order: the one whose range holds
/// `after` (ranges never overlap, so it is the last to start at or below it) and those after.
async fn writes_from(conn: &mut Conn, run_id: &str, after: i64) -> StoreResult<Vec<Write>> {
    let select = Sql::new(
        "SELECT last_seq, first_step, last_step, count FROM metric_writes \
         WHERE run_id = $1 AND last_seq > $2 AND first_seq >= COALESCE((SELECT MAX(first_seq) \
         FROM metric_writes WHERE run_id = $1 AND first_seq <= $2), $2) \
         ORDER BY first_seq LIMIT $3",
    )
    .bind(run_id)
    .bind(after)
    .bind(WRITES_PAGE);
    let rows = conn.fetch_all(select).await?;
    let write = |r: &Row| -> Result<Write, sqlx::Error> {
        Ok(Write {
            last_seq: r.col("last_seq")?,
            first_step: r.col("first_step")?,
            last_step: r.col("last_step")?,
            count: r.col("count")?,
        })
    };
    Ok(rows.iter().map(write).collect::<Result<_, _>>()?)
}

/// The first writes of `writes` that hold at least `wanted` points (all when they hold fewer),
/// merged into one: their last seq and the step range they touched. `None` when there are none.
fn take_writes(writes: &[Write], wanted: usize) -> Option<Write> {
    let first = writes.first()?;
    let mut taken = *first;
    for w in &writes[1..] {
        if taken.count >= wanted as i64 {
            break;
        }
        taken.last_seq = w.last_seq;
        taken.first_step = taken.first_step.min(w.first_step);
        taken.last_step = taken.last_step.max(w.last_step);
        taken.count += w.count;
    }
    Some(taken)
}

/// Rollup rows (`count`, then `min_`/`max_` step, value and time) as aggregates; the
/// columns are found by name on the first row.
fn aggs(rows: &[Row]) -> Result<Vec<Agg>, sqlx::Error> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let [count, min_step, min_value, min_time, max_step, max_value, max_time] =
        first.positions([
            "count",
            "min_step",
            "min_value",
            "min_time",
            "max_step",
            "max_value",
            "max_time",
        ])?;
    rows.iter()
        .map(|r| {
            Ok(Agg {
                count: r.get(count)?,
                min: Extreme {
                    step: r.get(min_step)?,
                    value: r.get(min_value)?,
                    time: r.get(min_time)?,
                },
                max: Extreme {
                    step: r.get(max_step)?,
                    value: r.get(max_value)?,
                    time: r.get(max_time)?,
                },
            })
        })
        .collect()
}

/// `step, value, time` rows as points; the columns are found by name on the first row.
fn series_points(rows: &[Row]) -> StoreResult<Vec<SeriesPoint>> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let [step, value, time] = first.positions(["step", "value", "time"])?;
    rows.iter()
        .map(|r| {
            Ok(SeriesPoint {
                step: r.get(step)?,
                value: point_value(r, value)?,
                time: r.get(time)?,
            })
        })
        .collect()
}

/// One series of the store, read for `downsample::read_series`.
struct SqlSeries<'a> {
    store: &'a SqlStore,
    series_id: i64,
}

#[async_trait]
impl SeriesSource for SqlSeries<'_> {
    async fn raw(&self, from: i64, to: i64) -> StoreResult<Vec<SeriesPoint>> {
        let mut conn = self.store.reader().await?;
        if let Conn::Postgres(pg) = &mut conn {
            return postgres::raw_points(pg, self.series_id, from, to, i64::MAX).await;
        }
        let select = Sql::new(
            "SELECT step, value, time FROM metric_points \
             WHERE series_id = $1 AND step >= $2 AND step <= $3 ORDER BY step",
        );
        let rows = conn
            .fetch_all(select.bind(self.series_id).bind(from).bind(to))
            .await?;
        series_points(&rows)
    }

    async fn rollups(&self, level: u32, from: i64, to: i64) -> StoreResult<Vec<Agg>> {
        let select = Sql::new(
            "SELECT count, min_step, min_value, min_time, max_step, max_value, max_time \
             FROM metric_rollups WHERE series_id = $1 AND level = $2 \
             AND bucket >= $3 AND bucket < $4",
        );
        let rows = self
            .store
            .reader()
            .await?
            .fetch_all(
                select
                    .bind(self.series_id)
                    .bind(i64::from(level))
                    .bind(from)
                    .bind(to),
            )
            .await?;
        Ok(aggs(&rows)?)
    }

    async fn bounds(&self, from: i64, to: i64) -> StoreResult<Option<(i64, i64)>> {
        let mut conn = self.store.reader().await?;
        let mut ends = [None, None];
        for (end, order) in ends.iter_mut().zip(["ASC", "DESC"]) {
            let select = Sql::new(format!(
                "SELECT step FROM metric_points WHERE series_id = $1 AND step >= $2 \
                 AND step <= $3 ORDER BY step {order} LIMIT 1"
            ));
            let row = conn
                .fetch_optional(select.bind(self.series_id).bind(from).bind(to))
                .await?;
            *end = row.map(|r| r.col::<i64>("step")).transpose()?;
        }
        Ok(ends[0].zip(ends[1]))
    }

    async fn nan_points(&self, from: i64, to: i64, limit: usize) -> StoreResult<Vec<SeriesPoint>> {
        // The partial index on (series_id, step) WHERE value IS NULL holds only these.
        let select = Sql::new(
            "SELECT step, time FROM metric_points WHERE series_id = $1 AND step >= $2 \
             AND step <= $3 AND value IS NULL ORDER BY step LIMIT $4",
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .store
            .reader()
            .await?
            .fetch_all(select.bind(self.series_id).bind(from).bind(to).bind(limit))
            .await?;
        rows.iter()
            .map(|r| {
                Ok(SeriesPoint {
                    step: r.col("step")?,
                    value: f64::NAN,
                    time: r.col("time")?,
                })
            })
            .collect()
    }
}

impl SqlStore {
    pub(super) async fn extremes_of(
        &self,
        run_ids: &[String],
        keys: &[String],
    ) -> StoreResult<Vec<MetricExtremes>> {
        if run_ids.is_empty() || keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut select = Sql::new(
            "SELECT s.run_id, s.key, MIN(p.value) AS min, MAX(p.value) AS max \
             FROM metric_series s JOIN metric_points p ON p.series_id = s.id \
             WHERE p.value IS NOT NULL AND s.run_id IN ",
        );
        select.tuple(run_ids);
        select.push(" AND s.key IN ");
        select.tuple(keys);
        select.push(" GROUP BY s.run_id, s.key");
        let mut conn = self.reader().await?;
        let rows = conn.fetch_all(select).await?;
        let extremes = |r: &Row| -> Result<MetricExtremes, sqlx::Error> {
            Ok(MetricExtremes {
                run_id: r.col("run_id")?,
                key: r.col("key")?,
                min: r.col("min")?,
                max: r.col("max")?,
            })
        };
        Ok(rows.iter().map(extremes).collect::<Result<_, _>>()?)
    }

    pub(super) async fn keys_of(&self, run_id: &str) -> StoreResult<Vec<MetricKey>> {
        let mut conn = self.reader().await?;
        self.run_exists(&mut conn, run_id).await?;
        let select = Sql::new(
            "SELECT key, count, last_step, last_value FROM metric_series \
             WHERE run_id = $1 AND count > 0 ORDER BY key",
        );
        let rows = conn.fetch_all(select.bind(run_id)).await?;
        let key = |r: &Row| -> Result<MetricKey, sqlx::Error> {
            Ok(MetricKey {
                key: r.col("key")?,
                count: r.col("count")?,
                last_step: r.col("last_step")?,
                // A series of NaN points only has no finite latest value.
                last_value: if r.col::<i64>("last_step")? < 0 {
                    f64::NAN
                } else {
                    r.col("last_value")?
                },
            })
        };
        Ok(rows.iter().map(key).collect::<Result<_, _>>()?)
    }

    pub(super) async fn series_of(
        &self,
        run_id: &str,
        key: &str,
        start_step: Option<i64>,
        end_step: Option<i64>,
        max_points: usize,
    ) -> StoreResult<Series> {
        let mut conn = self.reader().await?;
        let select = Sql::new("SELECT id, count FROM metric_series WHERE run_id = $1 AND key = $2");
        let Some(series) = conn.fetch_optional(select.bind(run_id).bind(key)).await? else {
            self.run_exists(&mut conn, run_id).await?;
            return Ok(common::empty_series(key));
        };
        drop(conn);
        let src = SqlSeries {
            store: self,
            series_id: series.col("id")?,
        };
        let count: i64 = series.col("count")?;
        downsample::read_series(&src, key, count, start_step, end_step, max_points).await
    }

    pub(super) async fn points_after(
        &self,
        run_id: &str,
        after_seq: Option<i64>,
        after_step: Option<i64>,
        limit: usize,
    ) -> StoreResult<Vec<StoredPoint>> {
        let mut conn = self.reader().await?;
        self.run_exists(&mut conn, run_id).await?;
        let rows = conn
            .fetch_all(Sql::new("SELECT id, key FROM metric_series WHERE run_id = $1").bind(run_id))
            .await?;
        let keys = rows
            .iter()
            .map(|r| Ok((r.col::<i64>("id")?, r.col::<String>("key")?)))
            .collect::<Result<HashMap<_, _>, sqlx::Error>>()?;
        let mut out = Vec::new();
        if keys.is_empty() || limit == 0 {
            return Ok(out);
        }
        let mut after = after_seq.unwrap_or(0);
        // Writes in seq order, a page at a time: their seq ranges do not overlap, so the points
        // with seqs up to the last taken write's all lie in the taken writes' step range.
        loop {
            let writes = writes_from(&mut conn, run_id, after).await?;
            let Some(taken) = take_writes(&writes, limit - out.len()) else {
                return Ok(out);
            };
            let mut select = Sql::new(
                "SELECT series_id, step, value, time, seq FROM metric_points \
                 WHERE seq > $1 AND seq <= $2 AND step >= $3 AND step <= $4 AND step > $5 \
                 AND series_id IN ",
            )
            .bind(after)
            .bind(taken.last_seq)
            .bind(taken.first_step)
            .bind(taken.last_step)
            .bind(after_step.unwrap_or(-1));
            select.tuple(keys.keys().copied());
            select.push(" ORDER BY seq LIMIT ");
            select.arg((limit - out.len()) as i64);
            let rows = conn.fetch_all(select).await?;
            if let Some(first) = rows.first() {
                let [series_id, step, value, time, seq] =
                    first.positions(["series_id", "step", "value", "time", "seq"])?;
                for r in &rows {
                    let sid: i64 = r.get(series_id)?;
                    out.push(StoredPoint {
                        key: keys.get(&sid).cloned().unwrap_or_default(),
                        step: r.get(step)?,
                        value: point_value(r, value)?,
                        time: r.get(time)?,
                        seq: r.get(seq)?,
                    });
                }
            }
            if out.len() >= limit {
                return Ok(out);
            }
            after = taken.last_seq;
        }
    }

    pub(super) async fn history_of(
        &self,
        run_id: &str,
        key: &str,
        after_step: Option<i64>,
        limit: usize,
    ) -> StoreResult<Vec<SeriesPoint>> {
        let mut conn = self.reader().await?;
        let select = Sql::new("SELECT id FROM metric_series WHERE run_id = $1 AND key = $2");
        let Some(series) = conn.fetch_optional(select.bind(run_id).bind(key)).await? else {
            self.run_exists(&mut conn, run_id).await?;
            return Ok(Vec::new());
        };
        let series_id: i64 = series.col("id")?;
        let from = after_step.map_or(0, |s| s.saturating_add(1));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        if let Conn::Postgres(pg) = &mut conn {
            // Rows as arrays, as the chart reads do: decoding 25,000 rows one by one costs more.
            return postgres::raw_points(pg, series_id, from, crate::store::MAX_STEP, limit).await;
        }
        // The (series_id, step) unique index walks the page in step order.
        let select = Sql::new(
            "SELECT step, value, time FROM metric_points WHERE series_id = $1 AND step >= $2 \
             ORDER BY step LIMIT $3",
        );
        let rows = conn
            .fetch_all(select.bind(series_id).bind(from).bind(limit))
            .await?;
        series_points(&rows)
    }
}
