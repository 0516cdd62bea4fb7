//! The run search query, written once: filters, sorts with the runs lacking the sort value
//! last, and keyset pagination behind an opaque cursor ([`SearchPlan`]; the plans each shape
//! gets are in `docs/search.md`).

use super::common::{RunRow, RUN_COLUMNS};
use super::filter::{CmpOp, Condition, Expr, Field, Literal, Predicate};
use super::sql::{Arg, Dialect, Row, Sql, Value};
use super::{RunQuery, SortDir, SortKey, StoreError, StoreResult};
use serde::{Deserialize, Serialize};

/// Where the previous page ended: the last run's sort group, sort value and id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Cursor {
    /// The sort this cursor belongs to (a cursor of another sort is rejected).
    s: String,
    g: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    n: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    i: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    t: Option<String>,
    id: String,
}

fn sort_label(q: &RunQuery) -> String {
    let dir = match q.dir {
        SortDir::Asc => "asc",
        SortDir::Desc => "desc",
    };
    match &q.sort {
        SortKey::CreatedAt => format!("created_at:{dir}"),
        SortKey::Name => format!("name:{dir}"),
        SortKey::Status => format!("status:{dir}"),
        SortKey::Param(k) => format!("param:{dir}:{k}"),
        SortKey::Metric(k) => format!("metric:{dir}:{k}"),
    }
}

fn invalid_cursor(message: &str) -> StoreError {
    StoreError::Invalid {
        field: "cursor",
        message: message.to_string(),
    }
}

fn encode_cursor(c: &Cursor) -> String {
    let json = serde_json::to_vec(c).unwrap_or_default();
    json.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_cursor(text: &str, q: &RunQuery) -> StoreResult<Cursor> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid_cursor("not a cursor returned by this server"));
    }
    let bytes: Vec<u8> = (0..text.len())
        .step_by(2)
        .filter_map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect();
    let c: Cursor = serde_json::from_slice(&bytes)
        .map_err(|_| invalid_cursor("not a cursor returned by this server"))?;
    if c.s != sort_label(q) {
        return Err(invalid_cursor(
            "the cursor belongs to a search with another sort order",
        ));
    }
    Ok(c)
}

/// The plans Postgres may choose for a search's statements, set for the search's own
/// transaction. Its planner prices an equality it has no statistics for at 0.5 % of the
/// table's rows, so after a bulk load, with autovacuum off or behind, it took the experiment's
/// 100,000 runs for a few hundred: it read all of them through a bitmap scan and sorted them
/// (60 ms for the first page, 1 s for a param filter, minutes for MLflow's filtered search,
/// whose EXISTS it turned into joins in the wrong order). Without sorts, hash or merge joins,
/// bitmap and sequential scans (each only priced out of reach, never forbidden), the one plan
/// left is the one each statement is written for: walk the sort index from the cursor, probe
/// each run's filters through their (run, key) keys, stop after the page. Its cost follows the
/// rows walked to fill the page, whatever the statistics say.
pub const POSTGRES_PLANNER: &str = "SELECT set_config('enable_sort', 'off', true), \
     set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true), \
     set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)";

/// Column `name` of a row, whichever backend it came from.
pub(crate) fn named<T: Value>(row: &Row, name: &str) -> Result<T, sqlx::Error> {
    use sqlx::Row as _;
    match row {
        Row::Sqlite(r) => r.try_get(name),
        Row::Postgres(r) => r.try_get(name),
    }
}

/// The sort values of a page's run: its sort group and the value it was ordered by.
#[derive(Debug, Clone, PartialEq)]
pub struct SortValues {
    pub g: i64,
    pub n: Option<f64>,
    pub i: Option<i64>,
    pub t: Option<String>,
}

/// The search as the statements it runs: one per sort group, in page order. A sort by a
/// metric has two groups (the runs with the key, ordered by its latest value; then the runs
/// without it, by id), a sort by a param three (numeric values, text values, missing), the
/// other sorts one. Each group's statement orders by exactly the columns of one index
/// (`metric_series (experiment_id, key, last_value, run_id)`, `run_params (experiment_id, key,
/// num, value, run_id)`, on Postgres a partial twin for text values, the `runs` indexes, and
/// the same without the experiment for a search over several), so the database walks that
/// index from the cursor, probes each run's filters through their (run, key) keys, and stops
/// after `limit + 1` rows: the cost follows the rows walked to fill the page, not the
/// experiment. The next group runs only when a page is not full yet. The sort table comes
/// first in a `CROSS JOIN`, which SQLite always reads as the outer loop (without statistics it
/// walked the experiment's runs and sorted them); Postgres reorders it freely and is held to
/// the walk by [`POSTGRES_PLANNER`].
pub struct SearchPlan<'q> {
    q: &'q RunQuery,
    cursor: Option<Cursor>,
}

impl<'q> SearchPlan<'q> {
    pub fn new(q: &'q RunQuery) -> StoreResult<SearchPlan<'q>> {
        let cursor = q
            .cursor
            .as_deref()
            .map(|c| decode_cursor(c, q))
            .transpose()?;
        Ok(SearchPlan { q, cursor })
    }

    /// Rows a page asks for: its size and one more (which tells whether a next page exists).
    pub fn wanted(&self) -> usize {
        self.q.limit.clamp(1, 1000) + 1
    }

    /// The sort groups still to read, in page order: the cursor's group and those after it.
    pub fn groups(&self) -> std::ops::Range<i64> {
        let count = match self.q.sort {
            SortKey::CreatedAt | SortKey::Name | SortKey::Status => 1,
            SortKey::Metric(_) => 2,
            SortKey::Param(_) => 3,
        };
        let first = self.cursor.as_ref().map_or(0, |c| c.g.clamp(0, count));
        first..count
    }

    /// The statement reading up to `limit` runs of sort group `g`.
    pub fn statement(&self, g: i64, limit: usize, dialect: Dialect) -> StoreResult<Sql> {
        let q = self.q;
        let (dir, op) = match q.dir {
            SortDir::Asc => ("ASC", ">"),
            SortDir::Desc => ("DESC", "<"),
        };
        let c = dialect.text_order();
        let mut out = Sql::new("SELECT ");
        out.push(RUN_COLUMNS);
        // The cursor bounds only its own group; later groups start at their beginning.
        let cursor = self.cursor.as_ref().filter(|c| c.g == g);
        let bad = || invalid_cursor("the cursor is incomplete");
        // The keyset's columns before the run id, with the cursor's values for them.
        let mut keyset: Vec<(String, Arg)> = Vec::new();
        let order: String;
        match (&q.sort, g) {
            (SortKey::CreatedAt, _) => {
                out.push(", r.created_at AS sort_i FROM runs r WHERE ");
                order = format!("r.created_at {dir}, r.id {dir}");
                if let Some(cur) = cursor {
                    keyset.push(("r.created_at".into(), Arg::from(cur.i.ok_or_else(bad)?)));
                }
            }
            (SortKey::Name | SortKey::Status, _) => {
                let col = if matches!(q.sort, SortKey::Name) {
                    "r.name"
                } else {
                    "r.status"
                };
                out.push(&format!(", {col} AS sort_t FROM runs r WHERE "));
                order = format!("{col}{c} {dir}, r.id {dir}");
                if let Some(cur) = cursor {
                    keyset.push((
                        format!("{col}{c}"),
                        Arg::from(cur.t.clone().ok_or_else(bad)?),
                    ));
                }
            }
            (SortKey::Metric(key), 0) => {
                out.push(
                    ", sm.last_value AS sort_n FROM metric_series sm \
                     CROSS JOIN runs r WHERE r.id = sm.run_id AND sm.key = ",
                );
                out.arg(key.clone());
                scope(q, "sm", &mut out);
                // A filter on the sort metric bounds the walk itself (the filter still holds).
                if let Some(f) = &q.filter {
                    let mut bounds = Vec::new();
                    metric_bounds(f.expr(), key, &mut bounds);
                    for (op, value) in bounds {
                        out.push(&format!(" AND sm.last_value {} ", op.as_sql()));
                        out.arg(value);
                    }
                }
                // A series of NaN points only has no latest value: its run sorts with those
                // lacking the key.
                out.push(" AND sm.last_step >= 0 AND ");
                order = format!("sm.last_value {dir}, sm.run_id {dir}");
                if let Some(cur) = cursor {
                    keyset.push(("sm.last_value".into(), Arg::from(cur.n.ok_or_else(bad)?)));
                }
            }
            (SortKey::Param(key), 0) => {
                out.push(
                    ", sp.num AS sort_n, sp.value AS sort_t FROM run_params sp \
                     CROSS JOIN runs r WHERE r.id = sp.run_id AND sp.key = ",
                );
                out.arg(key.clone());
                scope(q, "sp", &mut out);
                out.push(" AND sp.num IS NOT NULL AND ");
                order = format!("sp.num {dir}, sp.value{c} {dir}, sp.run_id {dir}");
                if let Some(cur) = cursor {
                    keyset.push(("sp.num".into(), Arg::from(cur.n.ok_or_else(bad)?)));
                    keyset.push((
                        format!("sp.value{c}"),
                        Arg::from(cur.t.clone().ok_or_else(bad)?),
                    ));
                }
            }
            (SortKey::Param(key), 1) => {
                out.push(
                    ", sp.value AS sort_t FROM run_params sp \
                     CROSS JOIN runs r WHERE r.id = sp.run_id AND sp.key = ",
                );
                out.arg(key.clone());
                scope(q, "sp", &mut out);
                out.push(" AND sp.num IS NULL AND ");
                order = format!("sp.value{c} {dir}, sp.run_id {dir}");
                if let Some(cur) = cursor {
                    keyset.push((
                        format!("sp.value{c}"),
                        Arg::from(cur.t.clone().ok_or_else(bad)?),
                    ));
                }
            }
            (SortKey::Metric(key) | SortKey::Param(key), _) => {
                let (table, valued) = match q.sort {
                    SortKey::Metric(_) => ("metric_series", " AND k.last_step >= 0"),
                    _ => ("run_params", ""),
                };
                out.push(&format!(
                    " FROM runs r WHERE NOT EXISTS (SELECT 1 FROM {table} k \
                     WHERE k.run_id = r.id AND k.key = "
                ));
                out.arg(key.clone());
                out.push(valued);
                out.push(") AND ");
                order = format!("r.id {dir}");
            }
        }
        push_conditions(q, dialect, &mut out);
        if let Some(cur) = cursor {
            // Strictly after the cursor: (sort columns..., id) beyond the cursor's.
            let id_col = match (&q.sort, g) {
                (SortKey::Metric(_), 0) => "sm.run_id",
                (SortKey::Param(_), 0 | 1) => "sp.run_id",
                _ => "r.id",
            };
            let cols: Vec<&str> = keyset.iter().map(|(col, _)| col.as_str()).collect();
            out.push(&format!(
                " AND ({}{id_col}) {op} (",
                cols.iter().map(|c| format!("{c}, ")).collect::<String>()
            ));
            for (_, v) in keyset {
                out.arg(v);
                out.push(", ");
            }
            out.arg(cur.id.clone());
            out.push(")");
        }
        out.push(&format!(" ORDER BY {order} LIMIT "));
        out.arg(limit as i64);
        Ok(out)
    }

    /// The sort values of a row `statement(g, ..)` returned, read by column name.
    pub fn sort_values(&self, g: i64, row: &Row) -> Result<SortValues, sqlx::Error> {
        let mut v = SortValues {
            g,
            n: None,
            i: None,
            t: None,
        };
        match (&self.q.sort, g) {
            (SortKey::CreatedAt, _) => v.i = Some(named(row, "sort_i")?),
            (SortKey::Name | SortKey::Status, _) => v.t = Some(named(row, "sort_t")?),
            (SortKey::Metric(_), 0) => v.n = Some(named(row, "sort_n")?),
            (SortKey::Param(_), 0) => {
                v.n = Some(named(row, "sort_n")?);
                v.t = Some(named(row, "sort_t")?);
            }
            (SortKey::Param(_), 1) => v.t = Some(named(row, "sort_t")?),
            _ => {}
        }
        Ok(v)
    }
}

/// The comparisons of a filter's top-level conjunction on the latest value of metric `key`.
fn metric_bounds(expr: &Expr, key: &str, out: &mut Vec<(CmpOp, f64)>) {
    match expr {
        Expr::And(a, b) => {
            metric_bounds(a, key, out);
            metric_bounds(b, key, out);
        }
        Expr::Cond(Condition {
            field: Field::Metric(k),
            predicate:
                Predicate::Compare {
                    op,
                    value: Literal::Number(n),
                },
        }) if k == key && *op != CmpOp::Ne => out.push((*op, *n)),
        _ => {}
    }
}

/// The one experiment a search covers, if it covers one.
fn one_experiment(q: &RunQuery) -> Option<&str> {
    match (q.experiment_id.as_deref(), q.visible_experiments.as_deref()) {
        (Some(e), _) => Some(e),
        (None, Some([one])) => Some(one.as_str()),
        _ => None,
    }
}

/// Within one experiment, the sort table's own experiment column bounds the walk (its index
/// leads with it); the run's conditions still hold.
fn scope(q: &RunQuery, alias: &str, out: &mut Sql) {
    if let Some(e) = one_experiment(q) {
        out.push(&format!(" AND {alias}.experiment_id = "));
        out.arg(e.to_string());
    }
}

/// What every group's statement requires of a run: its lifecycle, experiment, visibility,
/// status, tag and filter.
fn push_conditions(q: &RunQuery, dialect: Dialect, out: &mut Sql) {
    out.push(&q.lifecycle.condition("r"));
    if let Some(exp) = &q.experiment_id {
        out.push(" AND r.experiment_id = ");
        out.arg(exp.clone());
    }
    // Access control, in the query and so before pagination: a page never comes back short
    // because of rows the caller may not see. One experiment is an equality, so an index on
    // (experiment_id, sort column) serves it in order.
    match q.visible_experiments.as_deref() {
        Some([one]) => {
            out.push(" AND r.experiment_id = ");
            out.arg(one.clone());
        }
        Some(visible) => {
            out.push(" AND r.experiment_id IN (NULL");
            for id in visible {
                out.push(", ");
                out.arg(id.clone());
            }
            out.push(")");
        }
        None => {}
    }
    if let Some(status) = q.status {
        out.push(" AND r.status = ");
        out.arg(status.as_str().to_string());
    }
    if let Some(tag) = &q.tag {
        out.push(" AND EXISTS (SELECT 1 FROM run_tags t WHERE t.run_id = r.id AND t.key = ");
        match tag.split_once('=') {
            Some((k, v)) => {
                out.arg(k.to_string());
                out.push(" AND t.value = ");
                out.arg(v.to_string());
            }
            None => {
                out.arg(tag.clone());
            }
        }
        out.push(")");
    }
    if let Some(f) = &q.filter {
        out.push(" AND (");
        f.push(out, dialect);
        out.push(")");
    }
}

/// The cursor pointing after `last` (the last run of a full page).
/// Cuts a search fetched with `limit + 1` rows back to `limit` and, when a row was left over,
/// returns the cursor of the page's last run.
pub fn finish_page(q: &RunQuery, runs: &mut Vec<RunRow>, sorts: &[SortValues]) -> Option<String> {
    let limit = q.limit.clamp(1, 1000);
    if runs.len() <= limit {
        return None;
    }
    runs.truncate(limit);
    Some(next_cursor(q, &runs[limit - 1].id, &sorts[limit - 1]))
}

pub fn next_cursor(q: &RunQuery, last_id: &str, v: &SortValues) -> String {
    encode_cursor(&Cursor {
        s: sort_label(q),
        g: v.g,
        n: v.n,
        i: v.i,
        t: v.t.clone(),
        id: last_id.to_string(),
    })
}
