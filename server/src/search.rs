//! Run search: the one parser behind `GET /api/v1/runs` and the runs page, so both accept the
//! same sort keys, the same filter language and the same page sizes, with the same messages.

use serde::Deserialize;

use crate::store::filter::{written_key, Filter};
use crate::store::{
    DynStore, Experiment, KeyKind, RunQuery, RunStatus, SortDir, SortKey, StoreError,
};

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
    /// One of created, queued, running, finished, failed, stopped, lost.
    pub status: Option<String>,
    /// `key` (tag present) or `key=value`.
    pub tag: Option<String>,
    /// Filter, e.g. `metrics.val/loss < 2.5 and params.training.learning_rate = 0.001`. A
    /// metric compares its latest finite value; `metrics.train/loss IS NAN` finds runs that
    /// logged a NaN point of the key (`IS NOT NAN`: they have the key and no NaN point).
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

impl std::error::Error for SearchError {}

/// A refused search names its parameter; `q` keeps its position.
impl From<SearchError> for crate::error::Error {
    fn from(e: SearchError) -> Self {
        match e.position {
            Some(position) if e.field == "q" => crate::error::Error::InvalidFilter {
                position,
                message: e.message,
            },
            _ => crate::error::Error::Malformed {
                field: Some(e.field.to_string()),
                message: e.message,
            },
        }
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

    /// Checks every parameter and resolves the experiment (by id or name) into a store query
    /// over the runs of `visible` experiments (`None`: every one). An experiment outside them
    /// is "not found", exactly like one that does not exist, and a key only their runs lack is
    /// unknown (the message suggests only keys of runs the caller may read).
    pub async fn to_query(
        &self,
        store: &DynStore,
        visible: Option<Vec<String>>,
    ) -> Result<RunQuery, SearchOrStoreError> {
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
        let experiment = match given(&self.experiment) {
            Some(e) => {
                let found = store.get_experiment(e).await?;
                if visible.as_ref().is_some_and(|v| !v.contains(&found.id)) {
                    // Named back as the client wrote it, as for a missing one.
                    return Err(StoreError::NotFound {
                        entity: "experiment",
                        id: e.to_string(),
                    }
                    .into());
                }
                Some(found)
            }
            None => None,
        };
        let scope = match &experiment {
            Some(e) => Some(vec![e.id.clone()]),
            None => visible.clone(),
        };
        check_keys(store, filter.as_ref(), &sort, experiment.as_ref(), scope).await?;
        Ok(RunQuery {
            experiment_id: experiment.map(|e| e.id),
            status,
            tag: given(&self.tag).map(str::to_string),
            filter,
            sort,
            dir,
            limit,
            cursor: given(&self.cursor).map(str::to_string),
            visible_experiments: visible,
            lifecycle: Default::default(),
        })
    }
}

/// [`SearchParams::to_query`] for a caller: only runs of experiments it may read (filtered in
/// the query, so pages are full), an experiment it may not read is "not found", and a key only
/// runs it may not read have is unknown.
pub async fn visible_query(
    state: &crate::state::AppState,
    principal: &crate::access::Principal,
    params: &SearchParams,
) -> Result<RunQuery, crate::error::Error> {
    let visible = principal.readable_experiments(state.store.as_ref()).await?;
    Ok(params.to_query(&state.store, visible).await?)
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

impl From<SearchOrStoreError> for crate::error::Error {
    fn from(e: SearchOrStoreError) -> Self {
        match e {
            SearchOrStoreError::Search(e) => e.into(),
            // A value the store refuses during a search (a cursor) came from the query string.
            SearchOrStoreError::Store(StoreError::Invalid { field, message }) => {
                crate::error::Error::Malformed {
                    field: Some(field.to_string()),
                    message: format!("{field}: {message}"),
                }
            }
            SearchOrStoreError::Store(e) => e.into(),
        }
    }
}

/// Refuses a search naming a param or metric key that no run (of the experiment searched) has:
/// it would quietly find no run, or sort by nothing, where the user most likely mistyped a key.
/// The message offers the nearest keys runs do have. Only runs of the experiments in `scope`
/// count (`None`: every run), for the presence check and the suggestions alike, so a key that
/// only runs the caller may not read have answers exactly like one no run has. Each named key
/// costs one index probe; the known keys are read only for a key that is missing.
async fn check_keys(
    store: &DynStore,
    filter: Option<&Filter>,
    sort: &SortKey,
    experiment: Option<&Experiment>,
    scope: Option<Vec<String>>,
) -> Result<(), SearchOrStoreError> {
    let mut named: Vec<(&'static str, KeyKind, &str)> = filter
        .map(|f| f.keys().into_iter().map(|(kind, key)| ("q", kind, key)))
        .into_iter()
        .flatten()
        .collect();
    match sort {
        SortKey::Param(key) => named.push(("sort", KeyKind::Param, key)),
        SortKey::Metric(key) => named.push(("sort", KeyKind::Metric, key)),
        SortKey::CreatedAt | SortKey::Name | SortKey::Status => {}
    }
    let scope = scope.as_deref();
    for (field, kind, key) in named {
        if store.has_key(kind, key, scope).await? {
            continue;
        }
        let known = store.known_keys(kind, scope).await?;
        // `sort` takes the key as written after the prefix; `q` needs backquotes around odd keys.
        let write = |k: &str| match field {
            "q" => format!("`{}`", written_key(kind, k)),
            _ => format!("`{}.{k}`", kind.prefix()),
        };
        let runs = match experiment {
            Some(e) => format!("no run in experiment `{}`", e.name),
            None => "no run".to_string(),
        };
        let near: Vec<String> = nearest_keys(key, &known, MAX_SUGGESTIONS)
            .into_iter()
            .map(write)
            .collect();
        let message = match near.split_last() {
            _ if known.is_empty() => format!(
                "{runs} has {}: none has any {} yet",
                write(key),
                kind.prefix()
            ),
            None => format!(
                "{runs} has {}, and no {} key they have is close to it",
                write(key),
                kind.prefix()
            ),
            Some((only, [])) => format!("{runs} has {}; did you mean {only}?", write(key)),
            Some((last, rest)) => format!(
                "{runs} has {}; did you mean {} or {last}?",
                write(key),
                rest.join(", ")
            ),
        };
        return Err(SearchError {
            field,
            message,
            position: None,
        }
        .into());
    }
    Ok(())
}

/// Most keys an unknown-key message suggests.
const MAX_SUGGESTIONS: usize = 5;

/// The known keys nearest to `unknown`, nearest first (ties in key order), at most `n`, and only
/// those close enough to be a likely meaning.
pub fn nearest_keys<'a>(unknown: &str, known: &'a [String], n: usize) -> Vec<&'a str> {
    let mut ranked: Vec<(usize, &str)> = known
        .iter()
        .filter_map(|k| key_distance(unknown, k).map(|d| (d, k.as_str())))
        .collect();
    ranked.sort();
    ranked.into_iter().take(n).map(|(_, k)| k).collect()
}

/// How far a known key is from what was written (0 = only the letter case differs); None when
/// too far to suggest. Besides typos (edit distance, at most a third of the key), two mistakes
/// are common enough to rank high: an abbreviated last part (`training.lr` for
/// `training.learning_rate`, `model.n` for `model.n_layer`) and the right last part in another
/// section or none (`learning_rate`, `loss` for `val/loss`).
fn key_distance(unknown: &str, known: &str) -> Option<usize> {
    let (u, k) = (unknown.to_lowercase(), known.to_lowercase());
    let limit = (u.chars().count() / 3).max(2);
    let (u_section, u_leaf) = split_leaf(&u);
    let (k_section, k_leaf) = split_leaf(&k);
    let abbreviated = u_section == k_section && abbreviates(u_leaf, k_leaf);
    let moved = u_leaf == k_leaf && u_section != k_section;
    [
        edit_distance_within(&u, &k, limit),
        abbreviated.then_some(1),
        moved.then_some(2),
    ]
    .into_iter()
    .flatten()
    .min()
}

/// A key's section (before its last `.` or `/`) and its last part.
fn split_leaf(key: &str) -> (&str, &str) {
    match key.rfind(['.', '/']) {
        Some(i) => (&key[..i], &key[i + 1..]),
        None => ("", key),
    }
}

/// `short` is the start of `long`, or the initials of its words (`lr` for `learning_rate`).
fn abbreviates(short: &str, long: &str) -> bool {
    if short.is_empty() || short == long {
        return false;
    }
    let initials: String = long
        .split(['_', '-'])
        .filter_map(|word| word.chars().next())
        .collect();
    long.starts_with(short) || initials == short
}

/// The edit distance (insertions, deletions, substitutions, in characters) of `a` and `b`, or
/// None when it exceeds `limit`; stops as soon as it must.
fn edit_distance_within(a: &str, b: &str, limit: usize) -> Option<usize> {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.len().abs_diff(b.len()) > limit {
        return None;
    }
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut next = Vec::with_capacity(row.len());
        next.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let substitute = row[j] + usize::from(ca != cb);
            next.push(substitute.min(row[j + 1] + 1).min(next[j] + 1));
        }
        if next.iter().min().is_some_and(|&m| m > limit) {
            return None;
        }
        row = next;
    }
    row.last().copied().filter(|&d| d <= limit)
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
    fn the_nearest_known_keys_come_first_and_far_ones_are_left_out() {
        let known: Vec<String> = [
            "data.dataset",
            "model.n_layer",
            "model.n_heads",
            "training.learning_rate",
            "training.lr_schedule",
            "training.max_steps",
            "training.seed",
            "train/loss",
            "val/loss",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let cases: &[(&str, &[&str])] = &[
            // Initials of the last part, then its start.
            (
                "training.lr",
                &["training.learning_rate", "training.lr_schedule"],
            ),
            // A typo, and the letter case.
            ("training.max_step", &["training.max_steps"]),
            ("Training.Seed", &["training.seed"]),
            ("model.n_layers", &["model.n_layer"]),
            // The right last part without its section.
            ("loss", &["train/loss", "val/loss"]),
            ("learning_rate", &["training.learning_rate"]),
            ("val/los", &["val/loss"]),
            // Nothing near.
            ("optimizer.betas", &[]),
        ];
        for (unknown, expected) in cases {
            assert_eq!(&nearest_keys(unknown, &known, 5), expected, "{unknown}");
        }
        assert_eq!(nearest_keys("training.lr", &known, 1).len(), 1);
    }

    #[test]
    fn edit_distances_count_characters_and_give_up_past_the_limit() {
        assert_eq!(edit_distance_within("kitten", "sitting", 3), Some(3));
        assert_eq!(edit_distance_within("kitten", "sitting", 2), None);
        assert_eq!(edit_distance_within("é", "e", 1), Some(1));
        assert_eq!(edit_distance_within("a", &"a".repeat(100), 5), None);
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
