//! Metric points of the SQLite backend: batched idempotent writes, rollups, series reads.

use super::{SqliteStore, CHUNK};
use crate::store::common;
use crate::store::downsample::{self, Agg, Extreme, SeriesSource};
use crate::store::ingest;
use crate::store::{
    Appended, MetricKey, MetricPoint, Series, SeriesPoint, StoreResult, StoredPoint,
};
use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};
use std::collections::HashMap;

fn agg(r: &SqliteRow) -> StoreResult<Agg> {
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

struct SqliteSeries<'a> {
    pool: &'a SqlitePool,
    series_id: i64,
}

#[async_trait]
impl SeriesSource for SqliteSeries<'_> {
    async fn raw(&self, from: i64, to: i64) -> StoreResult<Vec<SeriesPoint>> {
        let rows = sqlx::query(
            "SELECT step, value, time FROM metric_points \
             WHERE series_id = ? AND step >= ? AND step <= ? ORDER BY step",
        )
        .bind(self.series_id)
        .bind(from)
        .bind(to)
        .fetch_all(self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(SeriesPoint {
                    step: r.try_get(0)?,
                    value: r.try_get(1)?,
                    time: r.try_get(2)?,
                })
            })
            .collect()
    }

    async fn rollups(&self, level: u32, from: i64, to: i64) -> StoreResult<Vec<Agg>> {
        let rows = sqlx::query(
            "SELECT count, min_step, min_value, min_time, max_step, max_value, max_time \
             FROM metric_rollups WHERE series_id = ? AND level = ? AND bucket >= ? AND bucket < ?",
        )
        .bind(self.series_id)
        .bind(level as i32)
        .bind(from)
        .bind(to)
        .fetch_all(self.pool)
        .await?;
        rows.iter().map(agg).collect()
    }

    async fn bounds(&self, from: i64, to: i64) -> StoreResult<Option<(i64, i64)>> {
        let one = |order: &'static str| {
            sqlx::query_scalar::<_, i64>(if order == "ASC" {
                "SELECT step FROM metric_points WHERE series_id = ? AND step >= ? AND step <= ? \
                 ORDER BY step ASC LIMIT 1"
            } else {
                "SELECT step FROM metric_points WHERE series_id = ? AND step >= ? AND step <= ? \
                 ORDER BY step DESC LIMIT 1"
            })
            .bind(self.series_id)
            .bind(from)
            .bind(to)
            .fetch_optional(self.pool)
        };
        let first = one("ASC").await?;
        let last = one("DESC").await?;
        Ok(first.zip(last))
    }
}

impl SqliteStore {
    pub(super) async fn write_points(
        &self,
        run_id: &str,
        points: &[MetricPoint],
        now_ms: i64,
    ) -> StoreResult<Appended> {
        let batch = ingest::prepare_batch(points, now_ms)?;
        let mut tx = self.begin_write().await?;
        sqlx::query("SELECT 1 FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| common::not_found_run(run_id))?;
        if batch.points.is_empty() {
            tx.commit().await?;
            return Ok(Appended::default());
        }
        // Series of the batch's keys, created on first use.
        let mut qb =
            QueryBuilder::<Sqlite>::new("SELECT id, key FROM metric_series WHERE run_id = ");
        qb.push_bind(run_id).push(" AND key IN ");
        common::push_in_list(&batch.keys, &mut qb);
        let mut series = ingest::SeriesMap::default();
        for row in qb.build().fetch_all(&mut *tx).await? {
            series.insert(row.try_get(1)?, row.try_get(0)?);
        }
        for key in &batch.keys {
            if series.get(key).is_none() {
                let sid: i64 = sqlx::query_scalar(
                    "INSERT INTO metric_series (run_id, key, count, last_step, last_value, \
                     last_time) VALUES (?, ?, 0, -1, 0, 0) RETURNING id",
                )
                .bind(run_id)
                .bind(key)
                .fetch_one(&mut *tx)
                .await?;
                series.insert(key.clone(), sid);
            }
        }
        let rows: Vec<(i64, i64, f64, i64)> = batch
            .points
            .iter()
            .map(|p| (series.id(&p.key), p.step, p.value, p.time))
            .collect();
        // This connection is the only writer, so what the probe sees stays true until commit.
        let mut clash = false;
        for (sid, lo, hi) in ingest::step_ranges(&batch, &series) {
            clash = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM metric_points \
                 WHERE series_id = ? AND step >= ? AND step <= ?)",
            )
            .bind(sid)
            .bind(lo)
            .bind(hi)
            .fetch_one(&mut *tx)
            .await?;
            if clash {
                break;
            }
        }
        let mut earlier = HashMap::new();
        let outcome = if clash {
            let (outcome, stored_before) =
                self.upsert_points(&mut tx, &batch, &series, &rows).await?;
            earlier = stored_before;
            outcome
        } else {
            // Every point is new: it gets the next seq in input order (above every seq ever
            // used, as AUTOINCREMENT would) and no row needs to come back.
            let base: i64 = sqlx::query_scalar(
                "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence \
                 WHERE name = 'metric_points'), 0), COALESCE((SELECT MAX(seq) FROM metric_points), 0))",
            )
            .fetch_one(&mut *tx)
            .await?;
            for (c, chunk) in rows.chunks(CHUNK).enumerate() {
                let first = base + 1 + (c * CHUNK) as i64;
                let mut qb = QueryBuilder::<Sqlite>::new(
                    "INSERT INTO metric_points (seq, series_id, step, value, time) ",
                );
                qb.push_values(
                    chunk.iter().enumerate(),
                    |mut b, (i, &(sid, step, value, time))| {
                        b.push_bind(first + i as i64)
                            .push_bind(sid)
                            .push_bind(step)
                            .push_bind(value)
                            .push_bind(time);
                    },
                );
                qb.build().execute(&mut *tx).await?;
            }
            let seqs: Vec<i64> = (1..=rows.len() as i64).map(|i| base + i).collect();
            let (series_updates, rollups) = ingest::changes(&batch, &series, |_, _| true);
            ingest::Outcome {
                stored: ingest::stored_in_order(&batch, &seqs),
                series: series_updates,
                rollups,
            }
        };
        for u in &outcome.series {
            sqlx::query(
                "UPDATE metric_series SET count = count + ?, \
                 last_step = CASE WHEN ? > last_step THEN ? ELSE last_step END, \
                 last_value = CASE WHEN ? > last_step THEN ? ELSE last_value END, \
                 last_time = CASE WHEN ? > last_step THEN ? ELSE last_time END WHERE id = ?",
            )
            .bind(u.added)
            .bind(u.last_step)
            .bind(u.last_step)
            .bind(u.last_step)
            .bind(u.last_value)
            .bind(u.last_step)
            .bind(u.last_time)
            .bind(u.series_id)
            .execute(&mut *tx)
            .await?;
        }
        for chunk in outcome.rollups.chunks(CHUNK) {
            let mut qb = QueryBuilder::<Sqlite>::new(
                "INSERT INTO metric_rollups (series_id, level, bucket, count, min_step, \
                 min_value, min_time, max_step, max_value, max_time) ",
            );
            qb.push_values(chunk, |mut b, (sid, d)| {
                b.push_bind(*sid)
                    .push_bind(d.level)
                    .push_bind(d.bucket)
                    .push_bind(d.agg.count)
                    .push_bind(d.agg.min.step)
                    .push_bind(d.agg.min.value)
                    .push_bind(d.agg.min.time)
                    .push_bind(d.agg.max.step)
                    .push_bind(d.agg.max.value)
                    .push_bind(d.agg.max.time);
            });
            qb.push(ingest::ROLLUP_MERGE);
            qb.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Appended {
            conflicts: ingest::conflicts(&batch, &series, &earlier),
            stored: outcome.stored,
        })
    }

    /// Inserts the points that are not stored yet, keeping stored ones as they are, and
    /// returns what the new ones change and the values of those stored before
    /// ((series, step) → value).
    async fn upsert_points(
        &self,
        tx: &mut super::write::WriteTx,
        batch: &ingest::Batch,
        series: &ingest::SeriesMap,
        rows: &[(i64, i64, f64, i64)],
    ) -> StoreResult<(ingest::Outcome, HashMap<(i64, i64), f64>)> {
        let mut inserted = HashMap::with_capacity(rows.len());
        for chunk in rows.chunks(CHUNK) {
            let mut qb = QueryBuilder::<Sqlite>::new(
                "INSERT INTO metric_points (series_id, step, value, time) ",
            );
            qb.push_values(chunk, |mut b, &(sid, step, value, time)| {
                b.push_bind(sid)
                    .push_bind(step)
                    .push_bind(value)
                    .push_bind(time);
            });
            qb.push(" ON CONFLICT (series_id, step) DO NOTHING RETURNING seq, series_id, step");
            for row in qb.build().fetch_all(&mut **tx).await? {
                let seq: i64 = row.try_get(0)?;
                inserted.insert((row.try_get::<i64, _>(1)?, row.try_get::<i64, _>(2)?), seq);
            }
        }
        let mut earlier = HashMap::new();
        let mut by_series: HashMap<i64, Vec<i64>> = HashMap::new();
        for (sid, step) in ingest::not_inserted(batch, series, &inserted) {
            by_series.entry(sid).or_default().push(step);
        }
        for (sid, steps) in by_series {
            for chunk in steps.chunks(CHUNK) {
                let mut qb = QueryBuilder::<Sqlite>::new(
                    "SELECT step, value FROM metric_points WHERE series_id = ",
                );
                qb.push_bind(sid).push(" AND step IN (");
                let mut list = qb.separated(", ");
                for step in chunk {
                    list.push_bind(*step);
                }
                qb.push(")");
                for row in qb.build().fetch_all(&mut **tx).await? {
                    earlier.insert((sid, row.try_get::<i64, _>(0)?), row.try_get(1)?);
                }
            }
        }
        Ok((ingest::summarize(batch, series, &inserted), earlier))
    }

    pub(super) async fn keys_of(&self, run_id: &str) -> StoreResult<Vec<MetricKey>> {
        self.run_exists(run_id).await?;
        Ok(sqlx::query_as::<_, MetricKey>(
            "SELECT key, count, last_step, last_value FROM metric_series \
             WHERE run_id = ? AND count > 0 ORDER BY key",
        )
        .bind(run_id)
        .fetch_all(&self.read)
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
            sqlx::query("SELECT id, count FROM metric_series WHERE run_id = ? AND key = ?")
                .bind(run_id)
                .bind(key)
                .fetch_optional(&self.read)
                .await?;
        let Some(series) = series else {
            self.run_exists(run_id).await?;
            return Ok(common::empty_series(key));
        };
        let src = SqliteSeries {
            pool: &self.read,
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
        let ids: Vec<String> = keys.keys().map(|id| id.to_string()).collect();
        // Series ids first: the points scan then walks `seq` order without a join. The ids are
        // integers from the database, inlined as literals; `+series_id` keeps SQLite on the
        // rowid (seq) range instead of sorting every point of the run for each page.
        let sql = format!(
            "SELECT series_id, step, value, time, seq FROM metric_points \
             WHERE +series_id IN ({}) AND seq > ? AND step > ? ORDER BY seq LIMIT ?",
            ids.join(", ")
        );
        let rows = sqlx::query(&sql)
            .bind(after_seq.unwrap_or(0))
            .bind(after_step.unwrap_or(-1))
            .bind(limit as i64)
            .fetch_all(&self.read)
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
        let rows = sqlx::query("SELECT id, key FROM metric_series WHERE run_id = ?")
            .bind(run_id)
            .fetch_all(&self.read)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }
}
