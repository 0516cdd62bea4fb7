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

/// The series ids of a run's `keys`, creating the missing series (in a write transaction).
pub async fn series_for(tx: &mut Conn, run_id: &str, keys: &[String]) -> StoreResult<SeriesMap> {
    let mut select =
        Sql::new("SELECT id, key FROM metric_series WHERE run_id = $1 AND key IN ").bind(run_id);
    select.tuple(keys);
    let mut series = SeriesMap::default();
    for row in tx.fetch_all(select).await? {
        series.insert(row.get(1)?, row.get(0)?);
    }
    for key in keys {
        if series.get(key).is_none() {
            let insert = Sql::new(
                "INSERT INTO metric_series (run_id, key, count, last_step, last_value, \
                 last_time) VALUES ($1, $2, 0, -1, 0, 0) RETURNING id",
            );
            let row = tx.fetch_one(insert.bind(run_id).bind(key)).await?;
            series.insert(key.clone(), row.get(0)?);
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
            for row in tx.fetch_all(select).await? {
                values.insert((sid, row.get(0)?), row.get(1)?);
            }
        }
    }
    Ok(values)
}

fn agg(r: &Row) -> Result<Agg, sqlx::Error> {
    let extreme = |i: usize| -> Result<Extreme, sqlx::Error> {
        Ok(Extreme {
            step: r.get(i)?,
            value: r.get(i + 1)?,
            time: r.get(i + 2)?,
        })
    };
    Ok(Agg {
        count: r.get(0)?,
        min: extreme(1)?,
        max: extreme(4)?,
    })
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
        rows.iter()
            .map(|r| {
                Ok(SeriesPoint {
                    step: r.get(0)?,
                    value: r.get(1)?,
                    time: r.get(2)?,
                })
            })
            .collect()
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
        Ok(rows.iter().map(agg).collect::<Result<_, _>>()?)
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
            *end = row.map(|r| r.get::<i64>(0)).transpose()?;
        }
        Ok(ends[0].zip(ends[1]))
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
            "SELECT s.run_id, s.key, MIN(p.value), MAX(p.value) FROM metric_series s \
             JOIN metric_points p ON p.series_id = s.id WHERE s.run_id IN ",
        );
        select.tuple(run_ids);
        select.push(" AND s.key IN ");
        select.tuple(keys);
        select.push(" GROUP BY s.run_id, s.key");
        let mut conn = self.reader().await?;
        let rows = conn.fetch_all(select).await?;
        let extremes = |r: &Row| -> Result<MetricExtremes, sqlx::Error> {
            Ok(MetricExtremes {
                run_id: r.get(0)?,
                key: r.get(1)?,
                min: r.get(2)?,
                max: r.get(3)?,
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
                key: r.get(0)?,
                count: r.get(1)?,
                last_step: r.get(2)?,
                last_value: r.get(3)?,
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
            series_id: series.get(0)?,
        };
        let count: i64 = series.get(1)?;
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
            .map(|r| Ok((r.get::<i64>(0)?, r.get::<String>(1)?)))
            .collect::<Result<HashMap<_, _>, sqlx::Error>>()?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // Series ids first: the points scan then walks `seq` order without a join.
        let mut select = Sql::new(
            "SELECT series_id, step, value, time, seq FROM metric_points WHERE seq > $1 \
             AND step > $2 AND ",
        )
        .bind(after_seq.unwrap_or(0))
        .bind(after_step.unwrap_or(-1));
        select.push(&self.dialect().unindexed("series_id"));
        select.push(" IN ").tuple(keys.keys().copied());
        select.push(" ORDER BY seq LIMIT ").arg(limit as i64);
        let rows = conn.fetch_all(select).await?;
        rows.iter()
            .map(|r| {
                let sid: i64 = r.get(0)?;
                Ok(StoredPoint {
                    key: keys.get(&sid).cloned().unwrap_or_default(),
                    step: r.get(1)?,
                    value: r.get(2)?,
                    time: r.get(3)?,
                    seq: r.get(4)?,
                })
            })
            .collect()
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
        let series_id: i64 = series.get(0)?;
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
        rows.iter()
            .map(|r| {
                Ok(SeriesPoint {
                    step: r.get(0)?,
                    value: r.get(1)?,
                    time: r.get(2)?,
                })
            })
            .collect()
    }
}
