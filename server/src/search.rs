//! Run search: the one parser behind `GET /api/v1/runs` and the runs page, so both accept the
//! same sort keys, the same filter language and the same page sizes, with the same messages.

use serde::Deserialize;

use crate::store::filter::Filter;
use crate::store::{DynStore, RunQuery, RunStatus, SortDir, SortKey, StoreError};

/// Page size when `limit` is absent, and the largest allowed.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;

/// A run search as it arrives in a query string. Everything is a string so each bad value gets
/// an error naming its parameter; empty values mean "not given" (an HTML form sends them).
#[derive(Debug, Default, Clone, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchParams {
    /// Experiment id or name.
    pub experiment: Option<String>,
    /// One of created, queued, running, finished, failed, stopped.
    pub status: Option<String>,
    /// `key` (tag present) or `key=value`.
    pub tag: Option<String>,
    /// Filter, e.g. `metrics.val/loss < 2.5 and params.training.learning_rate = 0.001`.
    pub q: Option<String>,
    /// `created_at`, `name`, `status`, `params.<key>` or `metrics.<key>`; prefix `-` for
    /// descending (`+` or nothing for ascending). Default `-created_at`.
    pub sort: Option<String>,
    /// 1..=1000, default 100.
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// Why a search was refused: the parameter, and what is wrong with it in plain words.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchError {
    pub field: &'static str,
    pub message: String,
    /// For `q`: the character offset where the filter stopped making sense.
    pub position: Option<usize>,
}

impl std::fmt::Display for SearchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

impl SearchParams {
    /// The trimmed, non-empty value of a parameter (what pages echo back into their form).
    pub fn value(&self, field: &str) -> &str {
        let v = match field {
            "experiment" => &self.experiment,
            "status" => &self.status,
            "tag" => &self.tag,
            "q" => &self.q,
            "sort" => &self.sort,
            "limit" => &self.limit,
            "cursor" => &self.cursor,
            _ => return "",
        };
        given(v).unwrap_or("")
    }

    /// Checks every parameter and resolves the experiment (by id or name) into a store query.
    pub async fn to_query(&self, store: &DynStore) -> Result<RunQuery, SearchOrStoreError> {
        let (sort, dir) = match given(&self.sort) {
            Some(text) => parse_sort(text)?,
            None => (SortKey::CreatedAt, SortDir::Desc),
        };
        let limit = parse_limit(given(&self.limit))?;
        let status = given(&self.status).map(parse_status).transpose()?;
        // Untrimmed, so an error's position points into the text the user wrote.
        let filter = self
            .q
            .as_deref()
            .filter(|q| !q.trim().is_empty())
            .map(parse_filter)
            .transpose()?;
        let experiment_id = match given(&self.experiment) {
            Some(e) => Some(store.get_experiment(e).await?.id),
            None => None,
        };
        Ok(RunQuery {
            experiment_id,
            status,
            tag: given(&self.tag).map(str::to_string),
            filter,
            sort,
            dir,
            limit,
            cursor: given(&self.cursor).map(str::to_string),
        })
    }
}

/// A search can fail on its parameters or in the store (an unknown experiment, say).
#[derive(Debug)]
pub enum SearchOrStoreError {
    Search(SearchError),
    Store(StoreError),
}

impl From<SearchError> for SearchOrStoreError {
    fn from(e: SearchError) -> Self {
        SearchOrStoreError::Search(e)
    }
}

impl From<StoreError> for SearchOrStoreError {
    fn from(e: StoreError) -> Self {
        SearchOrStoreError::Store(e)
    }
}

/// Parses `sort`: `[-|+]created_at|name|status|params.<key>|metrics.<key>`.
pub fn parse_sort(text: &str) -> Result<(SortKey, SortDir), SearchError> {
    let (dir, name) = match text.strip_prefix('-') {
        Some(rest) => (SortDir::Desc, rest),
        None => (SortDir::Asc, text.strip_prefix('+').unwrap_or(text)),
    };
    let key = match name {
        "created_at" => SortKey::CreatedAt,
        "name" => SortKey::Name,
        "status" => SortKey::Status,
        _ => match name.split_once('.') {
            Some(("params", key)) if !key.is_empty() => SortKey::Param(key.to_string()),
            Some(("metrics", key)) if !key.is_empty() => SortKey::Metric(key.to_string()),
            _ => {
                return Err(SearchError {
                    field: "sort",
                    message: format!(
                        "cannot sort by `{text}`: expected created_at, name, status, \
                         params.<key> or metrics.<key>, optionally prefixed with `-`"
                    ),
                    position: None,
                })
            }
        },
    };
    Ok((key, dir))
}

/// Parses `limit`: absent is the default page size; otherwise 1..=MAX_LIMIT.
pub fn parse_limit(text: Option<&str>) -> Result<usize, SearchError> {
    let Some(text) = text else {
        return Ok(DEFAULT_LIMIT);
    };
    match text.parse::<usize>() {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        _ => Err(SearchError {
            field: "limit",
            message: format!("limit must be an integer from 1 to {MAX_LIMIT}, got `{text}`"),
            position: None,
        }),
    }
}

pub fn parse_status(text: &str) -> Result<RunStatus, SearchError> {
    text.parse::<RunStatus>().map_err(|message| SearchError {
        field: "status",
        message,
        position: None,
    })
}

fn parse_filter(text: &str) -> Result<Filter, SearchError> {
    Filter::parse(text).map_err(|e| SearchError {
        field: "q",
        message: e.message,
        position: Some(e.position),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_specs_parse_into_key_and_direction() {
        let cases = [
            ("created_at", SortKey::CreatedAt, SortDir::Asc),
            ("-created_at", SortKey::CreatedAt, SortDir::Desc),
            ("name", SortKey::Name, SortDir::Asc),
            ("+name", SortKey::Name, SortDir::Asc),
            (
                "-metrics.val/loss",
                SortKey::Metric("val/loss".into()),
                SortDir::Desc,
            ),
            (
                "params.training.lr",
                SortKey::Param("training.lr".into()),
                SortDir::Asc,
            ),
        ];
        for (text, key, dir) in cases {
            let (k, d) = parse_sort(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((k, d), (key, dir), "{text}");
        }
    }

    #[test]
    fn unknown_sort_keys_are_rejected_naming_the_sort_field() {
        for text in ["bogus", "params.", "metrics", "-", "latest.loss"] {
            match parse_sort(text) {
                Err(e) => assert_eq!(e.field, "sort", "{text}"),
                Ok(parsed) => panic!("{text}: expected an error, got {parsed:?}"),
            }
        }
    }

    #[test]
    fn limits_outside_one_to_a_thousand_are_rejected() {
        assert_eq!(parse_limit(None).ok(), Some(DEFAULT_LIMIT));
        assert_eq!(parse_limit(Some("1000")).ok(), Some(1000));
        for bad in ["0", "1001", "-1", "ten", ""] {
            assert!(parse_limit(Some(bad)).is_err(), "{bad}");
        }
    }
}
