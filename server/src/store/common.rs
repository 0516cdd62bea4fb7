//! Backend-neutral pieces of the store: ids, validation, error mapping and run assembly.

use super::sql::Row;
use super::{ExitInfo, LatestMetric, Run, RunStatus, StoreError, StoreResult};
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

/// The columns of `runs` every run read selects, each named (SQLite leaves the name of a column
/// without `AS` unspecified), in this order; [`RunRow::from_row`] reads them by name.
/// `created_by` is the name of the user who created the run.
pub const RUN_COLUMNS: &str = "r.id AS id, r.experiment_id AS experiment_id, r.name AS name, \
     r.status AS status, r.created_at AS created_at, r.started_at AS started_at, \
     r.ended_at AS ended_at, r.config AS config, r.notes AS notes, r.exit_code AS exit_code, \
     r.exit_signal AS exit_signal, r.exit_message AS exit_message, \
     (SELECT u.name FROM users u WHERE u.id = r.created_by) AS created_by, \
     r.deleted_at AS deleted_at";

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
    pub created_by: Option<String>,
    pub deleted_at: Option<i64>,
}

impl RunRow {
    /// A row that selected `RUN_COLUMNS`, read by column name.
    pub fn from_row(row: &Row) -> Result<RunRow, sqlx::Error> {
        Ok(RunRow {
            id: row.col("id")?,
            experiment_id: row.col("experiment_id")?,
            name: row.col("name")?,
            status: row.col("status")?,
            created_at: row.col("created_at")?,
            started_at: row.col("started_at")?,
            ended_at: row.col("ended_at")?,
            config: row.col("config")?,
            notes: row.col("notes")?,
            exit_code: row.col("exit_code")?,
            exit_signal: row.col("exit_signal")?,
            exit_message: row.col("exit_message")?,
            created_by: row.col("created_by")?,
            deleted_at: row.col("deleted_at")?,
        })
    }
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
            created_by: row.created_by,
            deleted_at: row.deleted_at,
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
