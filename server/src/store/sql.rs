//! The SQL layer both backends share, so that each query of the store is written once.
//!
//! - [`Sql`]: a statement and its arguments. Parameters are written `$1, $2, ...`, which both
//!   Postgres and SQLite accept, so the text of a statement does not depend on the backend.
//! - [`Dialect`]: the few forms the two databases really spell differently.
//! - [`Conn`] and [`Row`]: a pooled connection of either backend, and typed access to what a
//!   query returns.
//! - [`Tx`]: a write transaction that is acknowledged only after its COMMIT succeeded.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{Database, Encode, Executor, Postgres, Sqlite, Type};

use super::{StoreError, StoreResult};

/// A bound value.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Text(Option<String>),
    Int(Option<i64>),
    Real(Option<f64>),
    Bool(bool),
    Bytes(Vec<u8>),
}

macro_rules! arg_from {
    ($($t:ty => |$v:ident| $e:expr),* $(,)?) => {$(
        impl From<$t> for Arg {
            fn from($v: $t) -> Arg {
                $e
            }
        }
    )*};
}

arg_from!(
    &str => |v| Arg::Text(Some(v.to_string())),
    &String => |v| Arg::Text(Some(v.clone())),
    String => |v| Arg::Text(Some(v)),
    Option<&str> => |v| Arg::Text(v.map(str::to_string)),
    Option<String> => |v| Arg::Text(v),
    i64 => |v| Arg::Int(Some(v)),
    i32 => |v| Arg::Int(Some(i64::from(v))),
    Option<i64> => |v| Arg::Int(v),
    Option<i32> => |v| Arg::Int(v.map(i64::from)),
    f64 => |v| Arg::Real(Some(v)),
    Option<f64> => |v| Arg::Real(v),
    bool => |v| Arg::Bool(v),
    Vec<u8> => |v| Arg::Bytes(v),
);

/// What the two databases spell differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// Starts a write transaction. SQLite takes its write lock at once (there is one writer
    /// connection anyway), so a transaction never fails half-way to upgrade its lock.
    pub fn begin(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            Dialect::Postgres => "BEGIN",
        }
    }

    /// Appended to a read in a write transaction that must lock its row. SQLite has one
    /// writer at a time and no row locks.
    pub fn for_update(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE",
        }
    }

    /// Appended to text in comparisons and sorts, so both order text by code point (SQLite's
    /// BINARY collation does so by itself).
    pub fn text_order(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " COLLATE \"C\"",
        }
    }
}

/// A statement and its arguments, written once for both backends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sql {
    text: String,
    args: Vec<Arg>,
}

impl Sql {
    /// A statement whose parameters, if any, are written `$1, $2, ...` and bound in order
    /// with [`Sql::bind`].
    pub fn new(text: impl Into<String>) -> Sql {
        Sql {
            text: text.into(),
            args: Vec::new(),
        }
    }

    pub fn bind(mut self, value: impl Into<Arg>) -> Sql {
        self.args.push(value.into());
        self
    }

    /// The statement with anonymous `?` parameters, its arguments in the order they appear
    /// (repeated where a `$n` is used twice), for SQLite. SQLite binds `?` in order at no
    /// cost, but sqlx looks every numbered parameter up by name and SQLite's name lookup is a
    /// linear search, so a batch insert of 2,500 `$n` parameters spent most of its time there
    /// (63% of SQLite ingest in a profile, ten times slower than with `?`). Quoted text and
    /// identifiers are left alone.
    pub fn positional(self) -> (String, Vec<Arg>) {
        let mut text = String::with_capacity(self.text.len());
        let mut args = Vec::with_capacity(self.args.len());
        let mut quote: Option<char> = None;
        let mut chars = self.text.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (None, '\'' | '"') => quote = Some(c),
                (None, '$') => {
                    let digits: String = self.text[i + 1..]
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    let arg = digits
                        .parse::<usize>()
                        .ok()
                        .and_then(|n| n.checked_sub(1))
                        .and_then(|n| self.args.get(n));
                    if let Some(arg) = arg {
                        text.push('?');
                        args.push(arg.clone());
                        for _ in 0..digits.len() {
                            chars.next();
                        }
                        continue;
                    }
                }
                _ => {}
            }
            text.push(c);
        }
        (text, args)
    }

    /// Appends text.
    pub fn push(&mut self, text: &str) -> &mut Sql {
        self.text.push_str(text);
        self
    }

    /// Appends the next parameter (`$n`) and binds it.
    pub fn arg(&mut self, value: impl Into<Arg>) -> &mut Sql {
        self.args.push(value.into());
        let n = self.args.len();
        self.text.push('$');
        self.text.push_str(&n.to_string());
        self
    }

    /// Appends `(v1, v2, ...)`, one parameter per value (a row of a VALUES list, or an `IN`
    /// list).
    pub fn tuple<A: Into<Arg>>(&mut self, values: impl IntoIterator<Item = A>) -> &mut Sql {
        self.push("(");
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.arg(v);
        }
        self.push(")")
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// The same statement behind `prefix` (an `EXPLAIN ...`), with the same arguments.
    pub fn prefixed(&self, prefix: &str) -> Sql {
        Sql {
            text: format!("{prefix}{}", self.text),
            args: self.args.clone(),
        }
    }
}

/// Binds `args` to a query of either backend (every `Arg` type is one both encode).
fn bind_all<'q, DB: Database>(
    mut query: sqlx::query::Query<'q, DB, DB::Arguments<'q>>,
    args: Vec<Arg>,
) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    Option<String>: Encode<'q, DB> + Type<DB>,
    Option<i64>: Encode<'q, DB> + Type<DB>,
    Option<f64>: Encode<'q, DB> + Type<DB>,
    bool: Encode<'q, DB> + Type<DB>,
    Vec<u8>: Encode<'q, DB> + Type<DB>,
{
    for arg in args {
        query = match arg {
            Arg::Text(v) => query.bind(v),
            Arg::Int(v) => query.bind(v),
            Arg::Real(v) => query.bind(v),
            Arg::Bool(v) => query.bind(v),
            Arg::Bytes(v) => query.bind(v),
        };
    }
    query
}

/// A row of either backend.
pub enum Row {
    Sqlite(SqliteRow),
    Postgres(PgRow),
}

/// A Rust type both backends decode a column into.
pub trait Value:
    for<'r> sqlx::Decode<'r, Sqlite>
    + Type<Sqlite>
    + for<'r> sqlx::Decode<'r, Postgres>
    + Type<Postgres>
{
}

impl<T> Value for T where
    T: for<'r> sqlx::Decode<'r, Sqlite>
        + Type<Sqlite>
        + for<'r> sqlx::Decode<'r, Postgres>
        + Type<Postgres>
{
}

impl Row {
    /// Column `i`. Postgres is strict about widths: a BIGINT column is an `i64`, an INTEGER
    /// one an `i32`.
    pub fn get<T: Value>(&self, i: usize) -> Result<T, sqlx::Error> {
        use sqlx::Row as _;
        match self {
            Row::Sqlite(r) => r.try_get(i),
            Row::Postgres(r) => r.try_get(i),
        }
    }

    /// The column named `name` in the `SELECT` (its column name, or its `AS` alias): a change
    /// of the column list cannot shift it onto another column, as it can a position.
    pub fn col<T: Value>(&self, name: &str) -> Result<T, sqlx::Error> {
        use sqlx::Row as _;
        match self {
            Row::Sqlite(r) => r.try_get(name),
            Row::Postgres(r) => r.try_get(name),
        }
    }

    /// The positions of the columns `names`, looked up once by name so a loop over many rows
    /// of one query reads each by position (`get`) without hashing a name per value.
    pub fn positions<const N: usize>(&self, names: [&str; N]) -> Result<[usize; N], sqlx::Error> {
        use sqlx::{Column as _, Row as _};
        let mut out = [0; N];
        for (slot, name) in out.iter_mut().zip(names) {
            *slot = match self {
                Row::Sqlite(r) => r.try_column(name)?.ordinal(),
                Row::Postgres(r) => r.try_column(name)?.ordinal(),
            };
        }
        Ok(out)
    }
}

/// A pooled connection of either backend.
pub enum Conn {
    Sqlite(PoolConnection<Sqlite>),
    Postgres(PoolConnection<Postgres>),
}

impl Conn {
    pub async fn fetch_all(&mut self, q: Sql) -> Result<Vec<Row>, sqlx::Error> {
        Ok(match self {
            Conn::Sqlite(c) => {
                let (text, args) = q.positional();
                bind_all(sqlx::query(&text), args)
                    .fetch_all(&mut **c)
                    .await?
                    .into_iter()
                    .map(Row::Sqlite)
                    .collect()
            }
            Conn::Postgres(c) => bind_all(sqlx::query(&q.text), q.args)
                .fetch_all(&mut **c)
                .await?
                .into_iter()
                .map(Row::Postgres)
                .collect(),
        })
    }

    pub async fn fetch_optional(&mut self, q: Sql) -> Result<Option<Row>, sqlx::Error> {
        Ok(match self {
            Conn::Sqlite(c) => {
                let (text, args) = q.positional();
                bind_all(sqlx::query(&text), args)
                    .fetch_optional(&mut **c)
                    .await?
                    .map(Row::Sqlite)
            }
            Conn::Postgres(c) => bind_all(sqlx::query(&q.text), q.args)
                .fetch_optional(&mut **c)
                .await?
                .map(Row::Postgres),
        })
    }

    pub async fn fetch_one(&mut self, q: Sql) -> Result<Row, sqlx::Error> {
        self.fetch_optional(q)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Runs a statement; returns the rows it affected.
    pub async fn execute(&mut self, q: Sql) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Conn::Sqlite(c) => {
                let (text, args) = q.positional();
                bind_all(sqlx::query(&text), args)
                    .execute(&mut **c)
                    .await?
                    .rows_affected()
            }
            Conn::Postgres(c) => bind_all(sqlx::query(&q.text), q.args)
                .execute(&mut **c)
                .await?
                .rows_affected(),
        })
    }

    /// A statement without parameters, sent as it is (transaction control).
    async fn raw(&mut self, text: &str) -> Result<(), sqlx::Error> {
        match self {
            Conn::Sqlite(c) => c.execute(text).await.map(|_| ()),
            Conn::Postgres(c) => c.execute(text).await.map(|_| ()),
        }
    }

    /// The Postgres connection, for the statements only Postgres has (array parameters).
    pub fn postgres(&mut self) -> StoreResult<&mut sqlx::PgConnection> {
        match self {
            Conn::Postgres(c) => Ok(&mut **c),
            Conn::Sqlite(_) => Err(StoreError::Database(sqlx::Error::Protocol(
                "a Postgres statement on a SQLite connection".into(),
            ))),
        }
    }

    fn dialect(&self) -> Dialect {
        match self {
            Conn::Sqlite(_) => Dialect::Sqlite,
            Conn::Postgres(_) => Dialect::Postgres,
        }
    }

    /// Closes the connection when it is dropped instead of returning it to the pool.
    fn discard(&mut self) {
        match self {
            Conn::Sqlite(c) => c.close_on_drop(),
            Conn::Postgres(c) => c.close_on_drop(),
        }
    }
}

/// A write transaction, ended by [`Tx::finish`].
///
/// Plain `BEGIN` / `COMMIT` / `ROLLBACK` statements rather than sqlx's `Transaction`: that one
/// keeps its own count of open transactions beside the database's. When SQLite rolled a
/// transaction back by itself (it does on SQLITE_FULL in a one-row statement, and on a failed
/// COMMIT), the ROLLBACK on drop failed, the count stayed at one and the next `begin` opened a
/// SAVEPOINT; after one more failed write the connection sat inside a transaction that was
/// never committed again, and every later write was acknowledged and lost.
///
/// Here a transaction that is not ended by a successful COMMIT or ROLLBACK (a failed COMMIT or
/// ROLLBACK, a request cancelled half-way) closes its connection, which rolls back whatever it
/// held; the pool opens a fresh one for the next writer. A write is acknowledged only after its
/// COMMIT returned success, and every outcome is noted in the store's [`WriteHealth`].
pub struct Tx<'s> {
    conn: Conn,
    /// Set once COMMIT or ROLLBACK was sent (whatever its outcome).
    ended: bool,
    health: &'s WriteHealth,
}

impl<'s> Tx<'s> {
    pub async fn begin(mut conn: Conn, health: &'s WriteHealth) -> StoreResult<Tx<'s>> {
        if let Err(e) = conn.raw(conn.dialect().begin()).await {
            conn.discard();
            return health.note(Err(e.into()));
        }
        Ok(Tx {
            conn,
            ended: false,
            health,
        })
    }

    /// Commits when `result` is `Ok` (an `Ok` returned here means the writes are stored), rolls
    /// back otherwise, and passes `result` on.
    pub async fn finish<T>(mut self, result: StoreResult<T>) -> StoreResult<T> {
        let ended = match &result {
            Ok(_) => self.conn.raw("COMMIT").await,
            Err(_) => self.conn.raw("ROLLBACK").await,
        };
        self.ended = true;
        if let Err(e) = ended {
            self.conn.discard();
            if result.is_ok() {
                return self.health.note(Err(e.into()));
            }
        }
        self.health.note(result)
    }
}

impl Deref for Tx<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl DerefMut for Tx<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        // Not ended (the request was cancelled): the connection is not reused.
        if !self.ended {
            self.conn.discard();
        }
    }
}

/// The last write failure that was the database's fault (not the client's), until a write
/// succeeds again.
#[derive(Default)]
pub struct WriteHealth(Mutex<Option<String>>);

impl WriteHealth {
    /// Records the outcome of a write and passes it on.
    pub fn note<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        let mut failure = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(_) => *failure = None,
            Err(e) if e.is_database_fault() => *failure = Some(e.to_string()),
            Err(_) => {}
        }
        result
    }

    /// Whether the last write failed for the database's sake.
    pub fn failing(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

/// Room for one more full batch of points (10,000 points take well under this).
const PROBE_BYTES: usize = 1 << 20;

/// A committed write of `PROBE_BYTES`, deleted again in the same transaction: proves after a
/// failed write that the database takes writes again. A probe smaller than a real write would
/// pass while real writes still fail.
pub async fn probe(conn: Conn, health: &WriteHealth) -> StoreResult<()> {
    let mut tx = Tx::begin(conn, health).await?;
    let result = async {
        tx.execute(
            Sql::new("INSERT INTO store_probe (data) VALUES ($1)").bind(vec![0u8; PROBE_BYTES]),
        )
        .await?;
        tx.execute(Sql::new("DELETE FROM store_probe")).await?;
        Ok(())
    }
    .await;
    tx.finish(result).await
}

/// Maps a failure to get a pooled connection: the database is unavailable, whatever the error
/// says (refused, closed, a database that no longer accepts connections, none free in time).
pub fn unavailable(e: sqlx::Error) -> StoreError {
    match StoreError::from(e) {
        StoreError::Database(e) => StoreError::Unavailable(e),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_parameters_become_positional_ones_in_the_order_they_appear() {
        let q = Sql::new("SELECT $2, '$1 and ''$2''', \"a$1\", $1, $2, $10")
            .bind(1i64)
            .bind("b");
        let (text, args) = q.positional();
        assert_eq!(text, "SELECT ?, '$1 and ''$2''', \"a$1\", ?, ?, $10");
        assert_eq!(
            args,
            vec![
                Arg::Text(Some("b".into())),
                Arg::Int(Some(1)),
                Arg::Text(Some("b".into()))
            ]
        );
    }
}
