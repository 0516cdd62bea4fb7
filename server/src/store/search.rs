//! The run search query, written once: filters, sorts with the runs lacking the sort value
//! last, and keyset pagination behind an opaque cursor.

use super::common::{RunRow, RUN_COLUMNS, RUN_COLUMN_COUNT};
use super::sql::{Arg, Dialect, Row, Sql};
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

/// The sort values a search selects after the run columns, per sort kind.
#[derive(Debug, Clone, PartialEq)]
pub struct SortValues {
    pub g: i64,
    pub n: Option<f64>,
    pub i: Option<i64>,
    pub t: Option<String>,
}

impl SortValues {
    /// The sort columns `build_search` selects after the `RUN_COLUMNS`: `sort_g`,
    /// then those the sort has, in the order n (REAL), i (BIGINT), t (TEXT).
    pub fn from_row(row: &Row, sort: &SortKey) -> Result<SortValues, sqlx::Error> {
        let (n, i, t) = match sort {
            SortKey::CreatedAt => (false, true, false),
            SortKey::Name | SortKey::Status => (false, false, true),
            SortKey::Param(_) => (true, false, true),
            SortKey::Metric(_) => (true, false, false),
        };
        let mut col = RUN_COLUMN_COUNT;
        let mut next = || {
            col += 1;
            col
        };
        Ok(SortValues {
            g: row.get(RUN_COLUMN_COUNT)?,
            n: if n { row.get(next())? } else { None },
            i: if i { row.get(next())? } else { None },
            t: if t { row.get(next())? } else { None },
        })
    }
}

const PARAM_GROUP: &str =
    "(CASE WHEN sp.value IS NULL THEN 2 WHEN sp.num IS NULL THEN 1 ELSE 0 END)";
const METRIC_GROUP: &str = "(CASE WHEN sm.id IS NULL THEN 1 ELSE 0 END)";

/// Writes the page query: run columns plus sort columns, filtered, keyset-paginated, ordered,
/// `limit + 1` rows (the extra one tells whether there is a next page).
pub fn build_search(q: &RunQuery, dialect: Dialect, out: &mut Sql) -> StoreResult<()> {
    let cursor = q
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, q))
        .transpose()?;
    let (dir, op) = match q.dir {
        SortDir::Asc => ("ASC", ">"),
        SortDir::Desc => ("DESC", "<"),
    };
    let c = dialect.text_order();
    out.push("SELECT ");
    out.push(RUN_COLUMNS);
    match &q.sort {
        SortKey::CreatedAt => {
            out.push(", CAST(0 AS BIGINT) AS sort_g, r.created_at AS sort_i FROM runs r");
        }
        SortKey::Name => {
            out.push(", CAST(0 AS BIGINT) AS sort_g, r.name AS sort_t FROM runs r");
        }
        SortKey::Status => {
            out.push(", CAST(0 AS BIGINT) AS sort_g, r.status AS sort_t FROM runs r");
        }
        SortKey::Param(key) => {
            out.push(", CAST(");
            out.push(PARAM_GROUP);
            out.push(" AS BIGINT) AS sort_g, sp.num AS sort_n, sp.value AS sort_t FROM runs r ");
            out.push("LEFT JOIN run_params sp ON sp.run_id = r.id AND sp.key = ");
            out.arg(key.clone());
        }
        SortKey::Metric(key) => {
            out.push(", CAST(");
            out.push(METRIC_GROUP);
            out.push(" AS BIGINT) AS sort_g, sm.last_value AS sort_n FROM runs r ");
            out.push("LEFT JOIN metric_series sm ON sm.run_id = r.id AND sm.key = ");
            out.arg(key.clone());
        }
    }
    out.push(" WHERE ");
    out.push(&q.lifecycle.condition("r"));
    if let Some(exp) = &q.experiment_id {
        out.push(" AND r.experiment_id = ");
        out.arg(exp.clone());
    }
    // Access control, in the query and so before pagination: a page never comes back short
    // because of rows the caller may not see.
    if let Some(visible) = &q.visible_experiments {
        out.push(" AND r.experiment_id IN (NULL");
        for id in visible {
            out.push(", ");
            out.arg(id.clone());
        }
        out.push(")");
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
    if let Some(c) = cursor {
        push_keyset(q, &c, op, dialect, out)?;
    }
    let order = match &q.sort {
        SortKey::CreatedAt => format!(" ORDER BY r.created_at {dir}, r.id {dir}"),
        SortKey::Name => format!(" ORDER BY r.name{c} {dir}, r.id {dir}"),
        SortKey::Status => format!(" ORDER BY r.status{c} {dir}, r.id {dir}"),
        SortKey::Param(_) => {
            format!(" ORDER BY {PARAM_GROUP} ASC, sp.num {dir}, sp.value{c} {dir}, r.id {dir}")
        }
        SortKey::Metric(_) => {
            format!(" ORDER BY {METRIC_GROUP} ASC, sm.last_value {dir}, r.id {dir}")
        }
    };
    out.push(&order);
    out.push(" LIMIT ");
    out.arg(q.limit.clamp(1, 1000) as i64 + 1);
    Ok(())
}

/// Rows strictly after the cursor in the sort order; runs lacking the sort value come last.
fn push_keyset(
    q: &RunQuery,
    c: &Cursor,
    op: &str,
    dialect: Dialect,
    out: &mut Sql,
) -> StoreResult<()> {
    let bad = || invalid_cursor("the cursor is incomplete");
    let coll = dialect.text_order();
    let id = Arg::from(c.id.clone());
    let simple = |col: &str, v: Arg, out: &mut Sql| {
        out.push(&format!(" AND ({col}, r.id) {op} ("));
        out.arg(v);
        out.push(", ");
        out.arg(id.clone());
        out.push(")");
    };
    match &q.sort {
        SortKey::CreatedAt => simple("r.created_at", Arg::from(c.i.ok_or_else(bad)?), out),
        SortKey::Name => simple(
            &format!("r.name{coll}"),
            Arg::from(c.t.clone().ok_or_else(bad)?),
            out,
        ),
        SortKey::Status => simple(
            &format!("r.status{coll}"),
            Arg::from(c.t.clone().ok_or_else(bad)?),
            out,
        ),
        SortKey::Param(_) => {
            let g = PARAM_GROUP;
            match c.g {
                0 => {
                    out.push(&format!(
                        " AND ({g} > 0 OR ({g} = 0 AND (sp.num, sp.value{coll}, r.id) {op} ("
                    ));
                    out.arg(c.n.ok_or_else(bad)?);
                    out.push(", ");
                    out.arg(c.t.clone().ok_or_else(bad)?);
                    out.push(", ");
                    out.arg(id);
                    out.push(")))");
                }
                1 => {
                    out.push(&format!(
                        " AND ({g} > 1 OR ({g} = 1 AND (sp.value{coll}, r.id) {op} ("
                    ));
                    out.arg(c.t.clone().ok_or_else(bad)?);
                    out.push(", ");
                    out.arg(id);
                    out.push(")))");
                }
                _ => {
                    out.push(&format!(" AND ({g} = 2 AND r.id {op} "));
                    out.arg(id);
                    out.push(")");
                }
            }
        }
        SortKey::Metric(_) => {
            let g = METRIC_GROUP;
            if c.g == 0 {
                out.push(&format!(
                    " AND ({g} > 0 OR ({g} = 0 AND (sm.last_value, r.id) {op} ("
                ));
                out.arg(c.n.ok_or_else(bad)?);
                out.push(", ");
                out.arg(id);
                out.push(")))");
            } else {
                out.push(&format!(" AND ({g} = 1 AND r.id {op} "));
                out.arg(id);
                out.push(")");
            }
        }
    }
    Ok(())
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
