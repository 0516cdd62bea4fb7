//! The param and metric keys runs have: what a search may name. A search that names a key no
//! run has is refused with the nearest known keys (`crate::search`), so these reads sit on the
//! search path: the presence check is one index probe per key, and the full list (read only
//! when a key is missing) walks the key index once per distinct key, never every row.

use super::SqlStore;
use crate::store::sql::Sql;
use crate::store::{KeyKind, StoreResult, MAX_KNOWN_KEYS};

/// The table holding a kind of key (alias `k`), and the condition a row must meet to count: a metric
/// series counts once it holds a point (only then does it have a latest value to compare).
fn source(kind: KeyKind) -> (&'static str, &'static str) {
    match kind {
        KeyKind::Param => ("run_params", ""),
        KeyKind::Metric => ("metric_series", " AND k.count > 0"),
    }
}

impl SqlStore {
    pub(super) async fn key_exists(
        &self,
        kind: KeyKind,
        key: &str,
        experiment_id: Option<&str>,
    ) -> StoreResult<bool> {
        let (table, counts) = source(kind);
        let select = match experiment_id {
            None => Sql::new(format!(
                "SELECT 1 FROM {table} k WHERE k.key = $1{counts} LIMIT 1"
            ))
            .bind(key),
            Some(experiment) => Sql::new(format!(
                "SELECT 1 FROM {table} k JOIN runs r ON r.id = k.run_id \
                 WHERE k.key = $1 AND r.experiment_id = $2{counts} LIMIT 1"
            ))
            .bind(key)
            .bind(experiment),
        };
        let mut conn = self.reader().await?;
        Ok(conn.fetch_optional(select).await?.is_some())
    }

    pub(super) async fn keys_known(
        &self,
        kind: KeyKind,
        experiment_id: Option<&str>,
    ) -> StoreResult<Vec<String>> {
        let (table, counts) = source(kind);
        let limit = MAX_KNOWN_KEYS as i64;
        let select = match experiment_id {
            // A loose index scan: each step finds the next greater key through the key index,
            // so the cost follows the number of distinct keys, not the number of rows.
            None => Sql::new(format!(
                "WITH RECURSIVE known(key) AS ( \
                   SELECT (SELECT k.key FROM {table} k WHERE TRUE{counts} ORDER BY k.key LIMIT 1) \
                   UNION ALL \
                   SELECT (SELECT k.key FROM {table} k WHERE k.key > known.key{counts} \
                           ORDER BY k.key LIMIT 1) \
                   FROM known WHERE known.key IS NOT NULL \
                 ) \
                 SELECT key FROM known WHERE key IS NOT NULL LIMIT $1"
            ))
            .bind(limit),
            Some(experiment) => Sql::new(format!(
                "SELECT DISTINCT k.key FROM {table} k JOIN runs r ON r.id = k.run_id \
                 WHERE r.experiment_id = $1{counts} ORDER BY k.key LIMIT $2"
            ))
            .bind(experiment)
            .bind(limit),
        };
        let mut conn = self.reader().await?;
        let rows = conn.fetch_all(select).await?;
        Ok(rows
            .iter()
            .map(|r| r.get::<String>(0))
            .collect::<Result<_, _>>()?)
    }
}
