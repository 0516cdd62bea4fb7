//! Transactions on SQLite's one write connection, and what the store knows about its health.
//!
//! sqlx's `Transaction` keeps its own count of open transactions beside SQLite's. When SQLite
//! rolls a transaction back by itself (it may on SQLITE_FULL or an I/O error, and a failed
//! COMMIT always does), that count stays at one: the next `begin` issues a SAVEPOINT inside what
//! sqlx believes is an open transaction and its "commit" only releases that savepoint. With the
//! connection in that state every later write was answered as a success and never committed.
//!
//! So the write connection's transactions are plain `BEGIN IMMEDIATE` / `COMMIT` statements, and
//! a transaction that does not end in a successful COMMIT (an error, a failed commit, a request
//! cancelled half-way) closes its connection: SQLite rolls back whatever the closed connection
//! held, and the pool opens a fresh one for the next writer. A write is acknowledged only after
//! its COMMIT returned success.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use sqlx::pool::PoolConnection;
use sqlx::{Executor, Sqlite, SqliteConnection, SqlitePool};

use crate::store::StoreResult;

/// An open transaction on the write connection; commit it with `commit`.
pub(super) struct WriteTx {
    conn: PoolConnection<Sqlite>,
    /// Set only by a COMMIT that returned success.
    committed: bool,
}

impl WriteTx {
    pub(super) async fn begin(pool: &SqlitePool) -> StoreResult<WriteTx> {
        let mut conn = pool.acquire().await?;
        if let Err(e) = conn.execute("BEGIN IMMEDIATE").await {
            conn.close_on_drop();
            return Err(e.into());
        }
        Ok(WriteTx {
            conn,
            committed: false,
        })
    }

    /// Commits; only an `Ok` here means the transaction's writes are stored.
    pub(super) async fn commit(mut self) -> StoreResult<()> {
        // On failure `self` drops uncommitted, which closes the connection.
        self.conn.execute("COMMIT").await?;
        self.committed = true;
        Ok(())
    }
}

impl Deref for WriteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.conn
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        // Not committed: whatever state SQLite left the connection in, it is not reused.
        if !self.committed {
            self.conn.close_on_drop();
        }
    }
}

/// The last write failure that was the database's fault (not the client's), until a write
/// succeeds again.
#[derive(Default)]
pub(super) struct WriteHealth(Mutex<Option<String>>);

impl WriteHealth {
    /// Records the outcome of a write and passes it on.
    pub(super) fn note<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        let mut failure = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(_) => *failure = None,
            Err(e) if e.is_database_fault() => *failure = Some(e.to_string()),
            Err(_) => {}
        }
        result
    }

    /// The failure that makes the store unhealthy, if any.
    pub(super) fn failure(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Room for one more full batch of points (10,000 points take well under this).
const PROBE_BYTES: usize = 1 << 20;

/// A committed write of `PROBE_BYTES`, deleted again in the same transaction: proves after a
/// failed write that the database has room again. A probe smaller than a real write would
/// pass while real writes still fail.
pub(super) async fn probe(pool: &SqlitePool) -> StoreResult<()> {
    let mut tx = WriteTx::begin(pool).await?;
    sqlx::query("INSERT INTO store_probe (data) VALUES ($1)")
        .bind(vec![0u8; PROBE_BYTES])
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM store_probe")
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}
