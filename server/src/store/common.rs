//! Backend-neutral pieces of the store: row assembly, ids, error mapping, and the run search
//! query (written once against a small sink both backends' query builders implement).

use super::filter::Filter;
use super::{
    ExitInfo, LatestMetric, Run, RunQuery, RunStatus, SortDir, SortKey, StoreError, StoreResult,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// A fresh run id: uuid v4 as 32 lowercase hex characters.
pub fn new_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The numeric value of a param, when it is a finite number (for numeric filters and sorts).
pub fn param_num(value: &str) -> Option<f64> {
    value.trim().parse::<f64>().ok().filter(|v| v.is_finite())
}

pub fn parse_status(s: &str) -> StoreResult<RunStatus> {
    s.parse::<RunStatus>()
        .map_err(|e| StoreError::Database(sqlx::Error::Decode(e.into())))
}

/// Maps a constraint violation to a client error; anything else stays a database fault.
pub fn map_constraint(e: sqlx::Error, field: &'static str, what: &str) -> StoreError {
    use sqlx::error::ErrorKind;
    let kind = e.as_database_error().map(|d| d.kind());
    match kind {
        Some(ErrorKind::UniqueViolation) => StoreError::Conflict {
            field: Some(field),
            message: format!("{what} already exists"),
        },
        Some(ErrorKind::ForeignKeyViolation)
        | Some(ErrorKind::NotNullViolation)
        | Some(ErrorKind::CheckViolation) => StoreError::Invalid {
            field,
            message: format!("{what} is not valid"),
        },
        _ => StoreError::Database(e),
    }
}

pub fn not_found_run(id: &str) -> StoreError {
    StoreError::NotFound {
        entity: "run",
        id: id.to_string(),
    }
}

/// The columns of `runs` every run read selects, in this order.
pub const RUN_COLUMNS: &str = "r.id, r.experiment_id, r.name, r.status, r.created_at, \
     r.started_at, r.ended_at, r.config, r.notes, r.exit_code, r.exit_signal, r.exit_message";

/// A `runs` row before tags, params and metrics are attached.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub id: String,
    pub experiment_id: String,
    pub name: String,
    pub status: String,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub config: Option<String>,
    pub notes: String,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub exit_message: Option<String>,
}

/// Related rows of a set of runs, each tagged with its run id.
#[derive(Debug, Default)]
pub struct Details {
    pub tags: Vec<(String, String, String)>,
    pub params: Vec<(String, String, String)>,
    /// (run id, key, step, value, time)
    pub metrics: Vec<(String, String, i64, f64, i64)>,
}

pub fn assemble_runs(rows: Vec<RunRow>, details: Details) -> StoreResult<Vec<Run>> {
    let mut runs = Vec::with_capacity(rows.len());
    let mut index = HashMap::with_capacity(rows.len());
    for row in rows {
        let config = match row.config.as_deref() {
            Some(text) => Some(
                serde_json::from_str(text)
                    .map_err(|e| StoreError::Database(sqlx::Error::Decode(e.into())))?,
            ),
            None => None,
        };
        let exit =
            if row.exit_code.is_some() || row.exit_signal.is_some() || row.exit_message.is_some() {
                Some(ExitInfo {
                    exit_code: row.exit_code,
                    signal: row.exit_signal,
                    message: row.exit_message,
                })
            } else {
                None
            };
        index.insert(row.id.clone(), runs.len());
        runs.push(Run {
            status: parse_status(&row.status)?,
            id: row.id,
            name: row.name,
            experiment_id: row.experiment_id,
            created_at: row.created_at,
            started_at: row.started_at,
            ended_at: row.ended_at,
            config,
            params: BTreeMap::new(),
            tags: BTreeMap::new(),
            notes: row.notes,
            exit,
            latest_metrics: BTreeMap::new(),
        });
    }
    for (id, k, v) in details.tags {
        if let Some(&i) = index.get(&id) {
            runs[i].tags.insert(k, v);
        }
    }
    for (id, k, v) in details.params {
        if let Some(&i) = index.get(&id) {
            runs[i].params.insert(k, v);
        }
    }
    for (id, key, step, value, time) in details.metrics {
        if let Some(&i) = index.get(&id) {
            runs[i]
                .latest_metrics
                .insert(key, LatestMetric { step, value, time });
        }
    }
    Ok(runs)
}

/// A bound value of a backend-neutral query.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Text(String),
    Int(i64),
    Real(f64),
}

/// What the search query is written against; implemented by both backends' query builders.
pub trait SqlSink {
    fn sql(&mut self, s: &str);
    fn arg(&mut self, a: Arg);
    /// Pushes the `q` filter as a boolean condition on alias `r`.
    fn filter(&mut self, f: &Filter) -> StoreResult<()>;
    /// Appended to text sort columns so both backends order text by code point.
    fn text_order(&self) -> &'static str {
        ""
    }
}

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

/// Which sort columns `build_search` selects (after `RUN_COLUMNS`): `sort_g` always, then
/// these, in this order.
pub fn sort_columns(sort: &SortKey) -> (bool, bool, bool) {
    // (n: REAL, i: BIGINT, t: TEXT)
    match sort {
        SortKey::CreatedAt => (false, true, false),
        SortKey::Name | SortKey::Status => (false, false, true),
        SortKey::Param(_) => (true, false, true),
        SortKey::Metric(_) => (true, false, false),
    }
}

const PARAM_GROUP: &str =
    "(CASE WHEN sp.value IS NULL THEN 2 WHEN sp.num IS NULL THEN 1 ELSE 0 END)";
const METRIC_GROUP: &str = "(CASE WHEN sm.id IS NULL THEN 1 ELSE 0 END)";

/// Writes the page query: run columns plus sort columns, filtered, keyset-paginated, ordered,
/// `limit + 1` rows (the extra one tells whether there is a next page).
pub fn build_search(q: &RunQuery, out: &mut dyn SqlSink) -> StoreResult<()> {
    let cursor = q
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, q))
        .transpose()?;
    let (dir, op) = match q.dir {
        SortDir::Asc => ("ASC", ">"),
        SortDir::Desc => ("DESC", "<"),
    };
    let c = out.text_order();
    out.sql("SELECT ");
    out.sql(RUN_COLUMNS);
    match &q.sort {
        SortKey::CreatedAt => out.sql(", 0 AS sort_g, r.created_at AS sort_i FROM runs r"),
        SortKey::Name => out.sql(", 0 AS sort_g, r.name AS sort_t FROM runs r"),
        SortKey::Status => out.sql(", 0 AS sort_g, r.status AS sort_t FROM runs r"),
        SortKey::Param(key) => {
            out.sql(", ");
            out.sql(PARAM_GROUP);
            out.sql(" AS sort_g, sp.num AS sort_n, sp.value AS sort_t FROM runs r ");
            out.sql("LEFT JOIN run_params sp ON sp.run_id = r.id AND sp.key = ");
            out.arg(Arg::Text(key.clone()));
        }
        SortKey::Metric(key) => {
            out.sql(", ");
            out.sql(METRIC_GROUP);
            out.sql(" AS sort_g, sm.last_value AS sort_n FROM runs r ");
            out.sql("LEFT JOIN metric_series sm ON sm.run_id = r.id AND sm.key = ");
            out.arg(Arg::Text(key.clone()));
        }
    }
    out.sql(" WHERE 1 = 1");
    if let Some(exp) = &q.experiment_id {
        out.sql(" AND r.experiment_id = ");
        out.arg(Arg::Text(exp.clone()));
    }
    if let Some(status) = q.status {
        out.sql(" AND r.status = ");
        out.arg(Arg::Text(status.as_str().to_string()));
    }
    if let Some(tag) = &q.tag {
        out.sql(" AND EXISTS (SELECT 1 FROM run_tags t WHERE t.run_id = r.id AND t.key = ");
        match tag.split_once('=') {
            Some((k, v)) => {
                out.arg(Arg::Text(k.to_string()));
                out.sql(" AND t.value = ");
                out.arg(Arg::Text(v.to_string()));
            }
            None => out.arg(Arg::Text(tag.clone())),
        }
        out.sql(")");
    }
    if let Some(f) = &q.filter {
        out.sql(" AND (");
        out.filter(f)?;
        out.sql(")");
    }
    if let Some(c) = cursor {
        push_keyset(q, &c, op, out)?;
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
    out.sql(&order);
    out.sql(" LIMIT ");
    out.arg(Arg::Int(q.limit.clamp(1, 1000) as i64 + 1));
    Ok(())
}

/// Rows strictly after the cursor in the sort order; runs lacking the sort value come last.
fn push_keyset(q: &RunQuery, c: &Cursor, op: &str, out: &mut dyn SqlSink) -> StoreResult<()> {
    let bad = || invalid_cursor("the cursor is incomplete");
    let coll = out.text_order();
    let id = Arg::Text(c.id.clone());
    let simple = |col: &str, v: Arg, out: &mut dyn SqlSink| {
        out.sql(&format!(" AND ({col}, r.id) {op} ("));
        out.arg(v);
        out.sql(", ");
        out.arg(id.clone());
        out.sql(")");
    };
    match &q.sort {
        SortKey::CreatedAt => simple("r.created_at", Arg::Int(c.i.ok_or_else(bad)?), out),
        SortKey::Name => simple(
            &format!("r.name{coll}"),
            Arg::Text(c.t.clone().ok_or_else(bad)?),
            out,
        ),
        SortKey::Status => simple(
            &format!("r.status{coll}"),
            Arg::Text(c.t.clone().ok_or_else(bad)?),
            out,
        ),
        SortKey::Param(_) => {
            let g = PARAM_GROUP;
            match c.g {
                0 => {
                    out.sql(&format!(
                        " AND ({g} > 0 OR ({g} = 0 AND (sp.num, sp.value{coll}, r.id) {op} ("
                    ));
                    out.arg(Arg::Real(c.n.ok_or_else(bad)?));
                    out.sql(", ");
                    out.arg(Arg::Text(c.t.clone().ok_or_else(bad)?));
                    out.sql(", ");
                    out.arg(id);
                    out.sql(")))");
                }
                1 => {
                    out.sql(&format!(
                        " AND ({g} > 1 OR ({g} = 1 AND (sp.value{coll}, r.id) {op} ("
                    ));
                    out.arg(Arg::Text(c.t.clone().ok_or_else(bad)?));
                    out.sql(", ");
                    out.arg(id);
                    out.sql(")))");
                }
                _ => {
                    out.sql(&format!(" AND ({g} = 2 AND r.id {op} "));
                    out.arg(id);
                    out.sql(")");
                }
            }
        }
        SortKey::Metric(_) => {
            let g = METRIC_GROUP;
            if c.g == 0 {
                out.sql(&format!(
                    " AND ({g} > 0 OR ({g} = 0 AND (sm.last_value, r.id) {op} ("
                ));
                out.arg(Arg::Real(c.n.ok_or_else(bad)?));
                out.sql(", ");
                out.arg(id);
                out.sql(")))");
            } else {
                out.sql(&format!(" AND ({g} = 1 AND r.id {op} "));
                out.arg(id);
                out.sql(")");
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

/// Pushes `(?, ?, ...)` of text arguments (an `IN` list).
pub fn push_in_list(ids: &[String], out: &mut dyn SqlSink) {
    out.sql("(");
    for (n, id) in ids.iter().enumerate() {
        if n > 0 {
            out.sql(", ");
        }
        out.arg(Arg::Text(id.clone()));
    }
    out.sql(")");
}

/// A trimmed, non-empty name, or `Invalid` naming the field.
pub fn valid_name<'a>(field: &'static str, name: &'a str) -> StoreResult<&'a str> {
    let name = name.trim();
    if name.is_empty() {
        return Err(StoreError::Invalid {
            field,
            message: "must not be empty".to_string(),
        });
    }
    no_nul(field, name)?;
    Ok(name)
}

/// Postgres text cannot hold NUL characters: refuse them on both backends as a client error.
pub fn no_nul(field: &'static str, text: &str) -> StoreResult<()> {
    if text.contains('\0') {
        return Err(StoreError::Invalid {
            field,
            message: "must not contain NUL characters".to_string(),
        });
    }
    Ok(())
}

/// Checks the free text a run create or update carries.
pub fn check_run_text(
    tags: Option<&BTreeMap<String, String>>,
    notes: Option<&str>,
    config: Option<&serde_json::Value>,
) -> StoreResult<()> {
    for (k, v) in tags.into_iter().flatten() {
        no_nul("tags", k)?;
        no_nul("tags", v)?;
        if k.is_empty() {
            return Err(StoreError::Invalid {
                field: "tags",
                message: "a tag key must not be empty".to_string(),
            });
        }
    }
    if let Some(notes) = notes {
        no_nul("notes", notes)?;
    }
    if let Some(config) = config {
        for (k, v) in super::flatten_params(config) {
            no_nul("config", &k)?;
            no_nul("config", &v)?;
        }
    }
    Ok(())
}

/// Whether `config` should be stored: true when the run has none yet, false when it has this
/// same config, `Conflict` when it has a different one (configs are write-once).
pub fn config_is_new(stored: Option<&str>, config: &serde_json::Value) -> StoreResult<bool> {
    let Some(stored) = stored else {
        return Ok(true);
    };
    let stored: serde_json::Value = serde_json::from_str(stored)
        .map_err(|e| StoreError::Database(sqlx::Error::Decode(e.into())))?;
    if &stored == config {
        Ok(false)
    } else {
        Err(StoreError::Conflict {
            field: Some("config"),
            message: "config is write-once and this run already has a different one".to_string(),
        })
    }
}

pub fn empty_series(key: &str) -> super::Series {
    super::Series {
        key: key.to_string(),
        total: 0,
        downsampled: false,
        points: Vec::new(),
    }
}
