//! What only SQLite has: its connections (one writer, readers beside it in WAL mode), the page
//! cap the tests fill a database with, and its metric write fast path.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

use super::ingest::{self, Batch, SeriesMap};
use super::sql::{Arg, Conn, Sql};
use super::sql_store::{record_write, reserve_seqs, series_for, stored_values, SqlStore};
use super::{Appended, StoreError, StoreResult};

/// Rows per multi-row INSERT (4 to 10 parameters each, well under SQLite's limit).
const CHUNK: usize = 500;

/// Writes go through a one-connection pool, so writers queue in-process instead of failing
/// with "database is locked"; reads use a read-only pool (WAL lets them run beside the writer).
pub struct Pools {
    pub write: SqlitePool,
    pub read: SqlitePool,
    /// `PRAGMA max_page_count` of every write connection (0: SQLite's own maximum).
    page_limit: Arc<AtomicU64>,
}

impl Pools {
    /// Opens (creating the file and its directory if missing) and migrates the database.
    pub async fn open(url: &str) -> StoreResult<Pools> {
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
        Ok(Pools {
            write,
            read,
            page_limit,
        })
    }

    /// Caps the database at `pages` pages (`None`: SQLite's own maximum) on the write
    /// connection and every one opened after it.
    pub async fn set_page_limit(&self, pages: Option<u64>) -> StoreResult<()> {
        self.page_limit.store(pages.unwrap_or(0), Ordering::Release);
        // SQLite clamps the value to its compile-time maximum.
        let pages = pages.unwrap_or(u64::from(u32::MAX));
        sqlx::query(&format!("PRAGMA max_page_count = {pages}"))
            .execute(&self.write)
            .await?;
        Ok(())
    }
}

/// Writes a batch in one transaction on the one write connection.
///
/// Why a path of its own: there is only one writer, so when the probe finds none of the
/// batch's points stored, the points are inserted with the seqs reserved for them (the run's
/// next ones, in input order) without `ON CONFLICT` or `RETURNING`, so no row per point travels
/// back through sqlx's SQLite worker (SQLite ingest went from about 373,000 to 522,000
/// points/s: docs/benchmarks-journal.md, store-perf step 5). SQLite has no arrays to send a
/// batch in one statement, as Postgres does (`postgres/writes.rs`). A re-sent or overlapping
/// batch takes the upsert.
pub async fn write_batch(store: &SqlStore, run_id: &str, batch: &Batch) -> StoreResult<Appended> {
    let mut tx = store.begin_write().await?;
    let result = write_in(&mut tx, run_id, batch).await;
    tx.finish(result).await
}

async fn write_in(tx: &mut Conn, run_id: &str, batch: &Batch) -> StoreResult<Appended> {
    let base = reserve_seqs(tx, run_id, batch.points.len()).await?;
    if batch.points.is_empty() {
        return Ok(Appended::default());
    }
    let series = series_for(tx, run_id, &batch.keys).await?;
    // This connection is the only writer, so what the probe sees stays true until commit.
    let mut clash = false;
    for (sid, lo, hi) in ingest::step_ranges(batch, &series) {
        let probe = Sql::new(
            "SELECT EXISTS (SELECT 1 FROM metric_points \
             WHERE series_id = $1 AND step >= $2 AND step <= $3) AS clash",
        );
        clash = tx
            .fetch_one(probe.bind(sid).bind(lo).bind(hi))
            .await?
            .col("clash")?;
        if clash {
            break;
        }
    }
    let (outcome, earlier) = if clash {
        upsert_points(tx, batch, &series, base).await?
    } else {
        (
            insert_new(tx, batch, &series, base).await?,
            Default::default(),
        )
    };
    record_write(tx, run_id, &outcome.stored).await?;
    for u in &outcome.series {
        let update = Sql::new(
            "UPDATE metric_series SET count = count + $1, \
             last_step = CASE WHEN $2 > last_step THEN $2 ELSE last_step END, \
             last_value = CASE WHEN $2 > last_step THEN $3 ELSE last_value END, \
             last_time = CASE WHEN $2 > last_step THEN $4 ELSE last_time END WHERE id = $5",
        );
        tx.execute(
            update
                .bind(u.added)
                .bind(u.last_step)
                .bind(u.last_value)
                .bind(u.last_time)
                .bind(u.series_id),
        )
        .await?;
    }
    for chunk in outcome.rollups.chunks(CHUNK) {
        let mut insert = Sql::new(
            "INSERT INTO metric_rollups (series_id, level, bucket, count, min_step, \
             min_value, min_time, max_step, max_value, max_time) VALUES ",
        );
        for (i, (sid, d)) in chunk.iter().enumerate() {
            if i > 0 {
                insert.push(", ");
            }
            let (min, max) = (d.agg.min, d.agg.max);
            insert.tuple::<Arg>([
                (*sid).into(),
                d.level.into(),
                d.bucket.into(),
                d.agg.count.into(),
                min.step.into(),
                min.value.into(),
                min.time.into(),
                max.step.into(),
                max.value.into(),
                max.time.into(),
            ]);
        }
        insert.push(ingest::ROLLUP_MERGE);
        tx.execute(insert).await?;
    }
    Ok(Appended {
        conflicts: ingest::conflicts(batch, &series, &earlier),
        stored: outcome.stored,
    })
}

/// Every point of the batch is new: `batch.points[i]` gets seq `base + 1 + i` and no row
/// needs to come back.
async fn insert_new(
    tx: &mut Conn,
    batch: &Batch,
    series: &SeriesMap,
    base: i64,
) -> StoreResult<ingest::Outcome> {
    for insert in point_inserts(batch, series, base) {
        tx.execute(insert).await?;
    }
    let seqs: Vec<i64> = (1..=batch.points.len() as i64).map(|i| base + i).collect();
    let (series_updates, rollups) = ingest::changes(batch, series, |_, _| true);
    Ok(ingest::Outcome {
        stored: ingest::stored_in_order(batch, &seqs),
        series: series_updates,
        rollups,
    })
}

/// Inserts the points that are not stored yet, keeping stored ones as they are; returns what
/// the new ones change and the values of the points stored before.
async fn upsert_points(
    tx: &mut Conn,
    batch: &Batch,
    series: &SeriesMap,
    base: i64,
) -> StoreResult<(ingest::Outcome, std::collections::HashMap<(i64, i64), f64>)> {
    let mut inserted = std::collections::HashMap::with_capacity(batch.points.len());
    for mut insert in point_inserts(batch, series, base) {
        insert.push(" ON CONFLICT (series_id, step) DO NOTHING RETURNING seq, series_id, step");
        let rows = tx.fetch_all(insert).await?;
        let Some(first) = rows.first() else {
            continue;
        };
        let [seq, series_id, step] = first.positions(["seq", "series_id", "step"])?;
        for row in &rows {
            inserted.insert(
                (row.get::<i64>(series_id)?, row.get::<i64>(step)?),
                row.get::<i64>(seq)?,
            );
        }
    }
    let earlier = stored_values(tx, &ingest::not_inserted(batch, series, &inserted)).await?;
    Ok((ingest::summarize(batch, series, &inserted), earlier))
}

/// Multi-row INSERTs of the batch's points, `CHUNK` rows each, `batch.points[i]` with seq
/// `base + 1 + i`.
fn point_inserts<'a>(
    batch: &'a Batch,
    series: &'a SeriesMap,
    base: i64,
) -> impl Iterator<Item = Sql> + 'a {
    batch
        .points
        .chunks(CHUNK)
        .enumerate()
        .map(move |(c, chunk)| {
            let first = base + 1 + (c * CHUNK) as i64;
            let mut insert =
                Sql::new("INSERT INTO metric_points (seq, series_id, step, value, time) VALUES ");
            for (i, p) in chunk.iter().enumerate() {
                if i > 0 {
                    insert.push(", ");
                }
                insert.tuple::<Arg>([
                    (first + i as i64).into(),
                    series.id(&p.key).into(),
                    p.step.into(),
                    // NaN is stored as NULL (SQLite would make it NULL anyway, unasked).
                    (!p.value.is_nan()).then_some(p.value).into(),
                    p.time.into(),
                ]);
            }
            insert
        })
}
