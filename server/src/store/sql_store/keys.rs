//! The param and metric keys runs have: what a search may name. A search that names a key no
//! run has is refused with the nearest known keys (`crate::search`), so these reads sit on the
//! search path: the presence check is one index probe per key, and the full list (read only
//! when a key is missing) walks the key index once per distinct key, never every row. Both
//! look only at runs of the experiments given (those the caller may read), so a key that only
//! hidden runs have is as unknown as one no run has: params and series carry their run's
//! experiment, and their (experiment, key, ...) index answers per experiment.

use super::SqlStore;
use crate::store::search::named;
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
        experiments: Option<&[String]>,
    ) -> StoreResult<bool> {
        let (table, counts) = source(kind);
        let select = match experiments {
            None => Sql::new(format!(
                "SELECT 1 FROM {table} k WHERE k.key = $1{counts} LIMIT 1"
            ))
            .bind(key),
            // No experiment: no run, so no key (and no query).
            Some([]) => return Ok(false),
            Some(experiments) => {
                let mut q = Sql::new(format!(
                    "SELECT 1 FROM {table} k WHERE k.key = $1{counts} AND k.experiment_id IN "
                ))
                .bind(key);
                q.tuple(experiments.iter().cloned());
                q.push(" LIMIT 1");
                q
            }
        };
        let mut conn = self.reader().await?;
        Ok(conn.fetch_optional(select).await?.is_some())
    }

    pub(super) async fn keys_known(
        &self,
        kind: KeyKind,
        experiments: Option<&[String]>,
    ) -> StoreResult<Vec<String>> {
        let (table, counts) = source(kind);
        let limit = MAX_KNOWN_KEYS as i64;
        let select = match experiments {
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
            Some([]) => return Ok(Vec::new()),
            // The same loose scan within each experiment, through the (experiment, key) index.
            Some(experiments) => {
                let mut q = Sql::new(format!(
                    "WITH RECURSIVE known(experiment_id, key) AS ( \
                       SELECT e.id, (SELECT k.key FROM {table} k \
                                     WHERE k.experiment_id = e.id{counts} \
                                     ORDER BY k.key LIMIT 1) \
                       FROM experiments e WHERE e.id IN "
                ));
                q.tuple(experiments.iter().cloned());
                q.push(&format!(
                    " UNION ALL \
                       SELECT known.experiment_id, (SELECT k.key FROM {table} k \
                                     WHERE k.experiment_id = known.experiment_id \
                                     AND k.key > known.key{counts} ORDER BY k.key LIMIT 1) \
                       FROM known WHERE known.key IS NOT NULL \
                     ) \
                     SELECT DISTINCT key FROM known WHERE key IS NOT NULL ORDER BY key LIMIT "
                ));
                q.arg(limit);
                q
            }
        };
        let mut conn = self.reader().await?;
        let rows = conn.fetch_all(select).await?;
        Ok(rows
            .iter()
            .map(|r| named::<String>(r, "key"))
            .collect::<Result<_, _>>()?)
    }
}
