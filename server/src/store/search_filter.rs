//! Renders a parsed `q` filter into the run search query of each backend.

use super::filter::Filter;
use super::StoreResult;
use sqlx::{Postgres, QueryBuilder, Sqlite};

fn unavailable() -> super::StoreError {
    super::StoreError::Invalid {
        field: "q",
        message: "run filters are not available in this build".to_string(),
    }
}

pub fn push_sqlite(_f: &Filter, _qb: &mut QueryBuilder<'_, Sqlite>) -> StoreResult<()> {
    Err(unavailable())
}

pub fn push_postgres(_f: &Filter, _qb: &mut QueryBuilder<'_, Postgres>) -> StoreResult<()> {
    Err(unavailable())
}
