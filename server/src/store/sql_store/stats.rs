//! The planner's statistics, kept fresh by the store itself. A database that never gathered
//! statistics on the run tables (a bulk import, autovacuum off or behind, SQLite, which never
//! gathers them by itself) plans from guesses. The search statements do not depend on them
//! (`store::search`), but the filters inside them and every other query do better with them,
//! so the store refreshes them after large writes: once the rows written since the last refresh
//! reach a fifth of those written before it (at least [`FIRST_REFRESH`]), at most once per
//! [`MIN_INTERVAL`], in a task of its own (never on a request's path), one at a time.
//! Postgres runs `ANALYZE` of the run tables; SQLite `ANALYZE` of the same tables with
//! `PRAGMA analysis_limit` bounding the rows it reads per index.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{PgPool, SqlitePool};

/// Rows written (runs, their params and tags) before the first refresh: about a thousand runs
/// of twenty params.
pub const FIRST_REFRESH: u64 = 20_000;
/// Least time between two refreshes.
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);
/// Rows SQLite's `ANALYZE` reads per index (`PRAGMA analysis_limit`).
const SQLITE_ANALYSIS_LIMIT: i64 = 2_000;
/// The tables searches read.
const TABLES: [&str; 4] = ["runs", "run_params", "run_tags", "metric_series"];

/// Where a refresh runs: Postgres' pool, or SQLite's write connection (`ANALYZE` writes
/// `sqlite_stat1`).
#[derive(Clone)]
pub enum Target {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

pub struct Statistics {
    target: Target,
    /// Rows written since the store opened, and the count at which the next refresh is due.
    written: AtomicU64,
    due_at: AtomicU64,
    running: Arc<AtomicBool>,
    last: Mutex<Option<Instant>>,
}

impl Statistics {
    pub fn new(target: Target) -> Statistics {
        Statistics {
            target,
            written: AtomicU64::new(0),
            due_at: AtomicU64::new(FIRST_REFRESH),
            running: Arc::new(AtomicBool::new(false)),
            last: Mutex::new(None),
        }
    }

    /// Counts `rows` written to the run tables and starts a refresh when one is due.
    pub fn note_written(&self, rows: u64) {
        let written = self.written.fetch_add(rows, Ordering::Relaxed) + rows;
        if written < self.due_at.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < MIN_INTERVAL) {
                return;
            }
            if self.running.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        self.due_at.store(
            written + (written / 5).max(FIRST_REFRESH),
            Ordering::Relaxed,
        );
        let target = self.target.clone();
        let running = self.running.clone();
        // Outside a runtime (a synchronous caller) there is nowhere to run it; the next write
        // inside one will.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            running.store(false, Ordering::Release);
            return;
        };
        runtime.spawn(async move {
            if let Err(e) = refresh(&target).await {
                tracing::warn!(error = %e, "refreshing the planner's statistics failed");
            }
            running.store(false, Ordering::Release);
        });
    }

    /// Refreshes now, waiting for it.
    pub async fn refresh_now(&self) -> Result<(), sqlx::Error> {
        refresh(&self.target).await
    }
}

async fn refresh(target: &Target) -> Result<(), sqlx::Error> {
    match target {
        Target::Postgres(pool) => {
            sqlx::query(&format!("ANALYZE {}", TABLES.join(", ")))
                .execute(pool)
                .await?;
        }
        Target::Sqlite(pool) => {
            let mut conn = pool.acquire().await?;
            sqlx::query(&format!("PRAGMA analysis_limit = {SQLITE_ANALYSIS_LIMIT}"))
                .execute(&mut *conn)
                .await?;
            for table in TABLES {
                sqlx::query(&format!("ANALYZE {table}"))
                    .execute(&mut *conn)
                    .await?;
            }
        }
    }
    Ok(())
}
