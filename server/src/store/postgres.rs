//! What only Postgres has: its connection pool, the series-id cache of its write path, and
//! its raw series read. The metric write path is in `postgres/writes.rs`.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::PgPool;

use super::ingest;
use super::{SeriesPoint, StoreError, StoreResult};

mod writes;
pub use writes::write_batch;

pub struct Pools {
    pub pool: PgPool,
    /// Series ids of recently written metrics (hints, checked by the write that uses them).
    series_ids: SeriesCache,
}

impl Pools {
    /// Connects and migrates the database.
    pub async fn open(url: &str) -> StoreResult<Pools> {
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
        Ok(Pools {
            pool,
            series_ids: SeriesCache::default(),
        })
    }
}

/// Points of a series with `from <= step <= to`, in step order, as one row of three arrays:
/// decoding it costs a fraction of one row per point on both ends of the connection (with the
/// single raw read beside it, Postgres read-back went from about 1.2 to 2.7 million points/s:
/// docs/benchmarks-journal.md, store-perf steps 1 and 2). SQLite reads rows
/// (`sql_store/metrics.rs`).
/// The points of a series with steps in `from..=to`, in step order, at most `limit`.
pub async fn raw_points(
    conn: &mut PgConnection,
    series_id: i64,
    from: i64,
    to: i64,
    limit: i64,
) -> StoreResult<Vec<SeriesPoint>> {
    // A NaN point's value is NULL (`migrations/postgres/20270310000000_nan_points.sql`).
    type Arrays = (Option<Vec<i64>>, Option<Vec<Option<f64>>>, Option<Vec<i64>>);
    let (steps, values, times): Arrays = sqlx::query_as(
        "SELECT array_agg(step), array_agg(value), array_agg(time) FROM \
         (SELECT step, value, time FROM metric_points \
          WHERE series_id = $1 AND step >= $2 AND step <= $3 ORDER BY step LIMIT $4) AS p",
    )
    .bind(series_id)
    .bind(from)
    .bind(to)
    .bind(limit)
    .fetch_one(conn)
    .await?;
    let mut points: Vec<SeriesPoint> = steps
        .unwrap_or_default()
        .into_iter()
        .zip(values.unwrap_or_default())
        .zip(times.unwrap_or_default())
        .map(|((step, value), time)| SeriesPoint {
            step,
            value: value.unwrap_or(f64::NAN),
            time,
        })
        .collect();
    // Aggregates take the rows in the sorted subquery's order; SQL does not promise that,
    // so the order is checked (and restored) here.
    if !points.windows(2).all(|w| w[0].step < w[1].step) {
        points.sort_by_key(|p| p.step);
    }
    Ok(points)
}

/// Most (run, key) → series id entries the cache holds before it starts over.
const SERIES_CACHE_MAX: usize = 100_000;

/// Series ids of recently written (run, key)s, so that a batch need not look them up. An entry
/// is only a hint: the statement that uses it checks that every id is a series of the run.
#[derive(Default)]
pub struct SeriesCache(std::sync::Mutex<CachedIds>);

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
    pub fn get(&self, run_id: &str, keys: &[String]) -> Option<ingest::SeriesMap> {
        let cache = self.lock();
        let run = cache.1.get(run_id)?;
        let mut series = ingest::SeriesMap::default();
        for key in keys {
            series.insert(key.clone(), *run.get(key)?);
        }
        Some(series)
    }

    pub fn put(&self, run_id: &str, series: &ingest::SeriesMap) {
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

    pub fn forget(&self, run_id: &str) {
        let mut cache = self.lock();
        if let Some(run) = cache.1.remove(run_id) {
            cache.0 -= run.len();
        }
    }
}
