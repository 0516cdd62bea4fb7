//! Renders a parsed `q` filter into the run search query of each backend.

use super::filter::Filter;
use super::StoreResult;
use sqlx::{Postgres, QueryBuilder, Sqlite};

pub fn push_sqlite(f: &Filter, qb: &mut QueryBuilder<'_, Sqlite>) -> StoreResult<()> {
    f.push_sqlite(qb);
    Ok(())
}

pub fn push_postgres(f: &Filter, qb: &mut QueryBuilder<'_, Postgres>) -> StoreResult<()> {
    f.push_postgres(qb);
    Ok(())
}
