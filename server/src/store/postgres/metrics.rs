//! Metric points of the Postgres backend: batched idempotent writes, rollups, series reads.

use super::PgStore;
use crate::store::common;
use crate::store::downsample::{self, Agg, Extreme, SeriesSource};
use crate::store::ingest;
use crate::store::{MetricKey, MetricPoint, Series, SeriesPoint, StoreResult, StoredPoint};
use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

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
        let rows = sqlx::query(
            "SELECT step, value, time FROM metric_points \
             WHERE series_id = $1 AND step >= $2 AND step <= $3 ORDER BY step",
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
             FROM metric_rollups WHERE series_id = $1 AND level = $2 AND bucket >= $3 AND bucket < $4",
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
                "SELECT step FROM metric_points WHERE series_id = $1 AND step >= $2 AND step <= $3 \
                 ORDER BY step ASC LIMIT 1"
            } else {
                "SELECT step FROM metric_points WHERE series_id = $1 AND step >= $2 AND step <= $3 \
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

impl PgStore {
    pub(super) async fn write_points(
        &self,
        run_id: &str,
        points: &[MetricPoint],
        now_ms: i64,
    ) -> StoreResult<Vec<StoredPoint>> {
        let batch = ingest::prepare_batch(points, now_ms)?;
        let mut tx = self.pool.begin().await?;
        // The row lock serializes writers of one run, so seq order is commit order.
        sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
            .bind(run_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| common::not_found_run(run_id))?;
        if batch.points.is_empty() {
            return Ok(Vec::new());
        }
        // Series of the batch's keys, created on first use.
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
        let n = batch.points.len();
        let (mut sids, mut steps, mut values, mut times) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for p in &batch.points {
            sids.push(series.id(&p.key));
            steps.push(p.step);
            values.push(p.value);
            times.push(p.time);
        }
        let rows = sqlx::query(
            "INSERT INTO metric_points (series_id, step, value, time) \
             SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::float8[], $4::int8[]) \
             ON CONFLICT (series_id, step) DO NOTHING RETURNING seq, series_id, step",
        )
        .bind(sids)
        .bind(steps)
        .bind(values)
        .bind(times)
        .fetch_all(&mut *tx)
        .await?;
        let mut inserted = std::collections::HashMap::with_capacity(rows.len());
        for row in rows {
            let seq: i64 = row.try_get(0)?;
            inserted.insert((row.try_get::<i64, _>(1)?, row.try_get::<i64, _>(2)?), seq);
        }
        let outcome = ingest::summarize(&batch, &series, &inserted);
        if !outcome.series.is_empty() {
            let u = &outcome.series;
            sqlx::query(
                "UPDATE metric_series s SET count = s.count + u.added, \
                 last_step = CASE WHEN u.step > s.last_step THEN u.step ELSE s.last_step END, \
                 last_value = CASE WHEN u.step > s.last_step THEN u.value ELSE s.last_value END, \
                 last_time = CASE WHEN u.step > s.last_step THEN u.time ELSE s.last_time END \
                 FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::float8[], $5::int8[]) \
                 AS u(id, added, step, value, time) WHERE s.id = u.id",
            )
            .bind(u.iter().map(|x| x.series_id).collect::<Vec<_>>())
            .bind(u.iter().map(|x| x.added).collect::<Vec<_>>())
            .bind(u.iter().map(|x| x.last_step).collect::<Vec<_>>())
            .bind(u.iter().map(|x| x.last_value).collect::<Vec<_>>())
            .bind(u.iter().map(|x| x.last_time).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?;
        }
        if !outcome.rollups.is_empty() {
            let r = &outcome.rollups;
            let sql = format!(
                "INSERT INTO metric_rollups (series_id, level, bucket, count, min_step, \
                 min_value, min_time, max_step, max_value, max_time) \
                 SELECT * FROM UNNEST($1::int8[], $2::int4[], $3::int8[], $4::int8[], \
                 $5::int8[], $6::float8[], $7::int8[], $8::int8[], $9::float8[], $10::int8[]){}",
                ingest::ROLLUP_MERGE
            );
            sqlx::query(&sql)
                .bind(r.iter().map(|x| x.0).collect::<Vec<_>>())
                .bind(r.iter().map(|x| x.1.level).collect::<Vec<_>>())
                .bind(r.iter().map(|x| x.1.bucket).collect::<Vec<_>>())
                .bind(r.iter().map(|x| x.1.agg.count).collect::<Vec<_>>())
                .bind(r.iter().map(|x| x.1.agg.min.step).collect::<Vec<_>>())
                .bind(r.iter().map(|x| x.1.agg.min.value).collect::<Vec<_>>())
                .bind(r.iter().map(|x| x.1.agg.min.time).collect::<Vec<_>>())
                .bind(r.iter().map(|x| x.1.agg.max.step).collect::<Vec<_>>())
                .bind(r.iter().map(|x| x.1.agg.max.value).collect::<Vec<_>>())
                .bind(r.iter().map(|x| x.1.agg.max.time).collect::<Vec<_>>())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(outcome.stored)
    }

    pub(super) async fn keys_of(&self, run_id: &str) -> StoreResult<Vec<MetricKey>> {
        self.run_exists(run_id).await?;
        Ok(sqlx::query_as::<_, MetricKey>(
            "SELECT key, count, last_step, last_value FROM metric_series \
             WHERE run_id = $1 AND count > 0 ORDER BY key",
        )
        .bind(run_id)
        .fetch_all(&self.pool)
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
                .fetch_optional(&self.pool)
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
        .fetch_all(&self.pool)
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
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }
}
