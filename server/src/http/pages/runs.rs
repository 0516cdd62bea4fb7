//! The runs table: the home page and one experiment's runs, filtered, sorted and paged on the
//! server (the same search as `GET /api/v1/runs`).

use super::views::*;
use super::{html, PageResult};
use crate::access::Principal;
use crate::app::AppState;
use crate::search::{SearchOrStoreError, SearchParams};
use crate::store::{Run, RunStatus, StoreError};
use axum::extract::{Path, Query, State};
use axum::Extension;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The runs table's query string: a run search (parsed exactly as `GET /api/v1/runs` parses
/// it) plus the page's own column choice.
#[derive(Debug, Default, Deserialize)]
pub struct RunsParams {
    #[serde(flatten)]
    pub search: SearchParams,
    pub cols: Option<String>,
}

pub(super) async fn runs_home(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Query(p): Query<RunsParams>,
) -> PageResult {
    runs_table(&state, &principal, p).await
}

pub(super) async fn runs_of_experiment(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Query(mut p): Query<RunsParams>,
) -> PageResult {
    if p.search.value("experiment").is_empty() {
        p.search.experiment = Some(id);
    }
    runs_table(&state, &principal, p).await
}

#[tracing::instrument(skip(state, principal))]
pub async fn runs_table(state: &AppState, principal: &Principal, p: RunsParams) -> PageResult {
    // Only what the caller may read: experiments in the picker, runs in the table (filtered
    // in the query, before pagination).
    let visible = principal.readable_experiments(state.store.as_ref()).await?;
    let mut experiments = state
        .store
        .list_experiments(crate::store::Lifecycle::Active)
        .await?;
    if let Some(visible) = &visible {
        experiments.retain(|e| visible.contains(&e.id));
    }
    let search = &p.search;
    let experiment = match search.value("experiment") {
        "" => None,
        e => {
            let found = state.store.get_experiment(e).await?;
            if visible.as_ref().is_some_and(|v| !v.contains(&found.id)) {
                return Err(super::PageError::NotFound(format!(
                    "experiment `{e}` not found"
                )));
            }
            Some(found)
        }
    };
    let filters = Filters {
        experiment: experiment
            .as_ref()
            .map(|e| e.id.clone())
            .unwrap_or_default(),
        status: search.value("status").to_string(),
        tag: search.value("tag").to_string(),
        q: search.value("q").to_string(),
        cols: p.cols.as_deref().map(str::trim).unwrap_or("").to_string(),
        sort: search.value("sort").to_string(),
    };
    let mut error = None;
    // Keys the filter or sort names are checked, and suggested, from readable runs only.
    let query = match search.to_query(&state.store, visible).await {
        Ok(query) => Some(query),
        Err(SearchOrStoreError::Search(e)) => {
            error = Some(e.to_string());
            None
        }
        Err(SearchOrStoreError::Store(e)) => return Err(e.into()),
    };
    let empty = || crate::store::RunPage {
        runs: Vec::new(),
        next_cursor: None,
    };
    let page = match &query {
        None => empty(),
        Some(query) => match state.store.search_runs(query).await {
            Ok(page) => page,
            Err(StoreError::Invalid { field, message }) => {
                error = Some(format!("{field}: {message}"));
                empty()
            }
            Err(e) => return Err(e.into()),
        },
    };
    let names: BTreeMap<&str, &str> = experiments
        .iter()
        .map(|e| (e.id.as_str(), e.name.as_str()))
        .collect();
    let (param_cols, metric_cols) = super::columns::table_columns(&filters.cols, &page.runs);
    // Evaluation metrics show their best value beside the last.
    let eval_cols: Vec<String> = metric_cols
        .iter()
        .filter(|k| super::columns::is_eval_key(k))
        .cloned()
        .collect();
    let ids: Vec<String> = page.runs.iter().map(|r| r.id.clone()).collect();
    let best = super::columns::best_values(&state.store.metric_extremes(&ids, &eval_cols).await?);
    let now = crate::store::now_ms();
    let rows = page
        .runs
        .iter()
        .map(|r| run_row(r, &names, &param_cols, &metric_cols, &best, now))
        .collect();
    let link = |sort: &str, cursor: Option<&str>| {
        let mut q = vec![];
        for (k, v) in [
            ("experiment", filters.experiment.as_str()),
            ("status", filters.status.as_str()),
            ("tag", filters.tag.as_str()),
            ("q", filters.q.as_str()),
            ("cols", filters.cols.as_str()),
            ("sort", sort),
            ("cursor", cursor.unwrap_or("")),
        ] {
            if !v.is_empty() {
                q.push(format!("{k}={}", enc(v)));
            }
        }
        format!("/?{}", q.join("&"))
    };
    let header = |label: String, field: Option<String>, numeric: bool| {
        let (sorted, desc) = match &field {
            Some(f) => {
                let current = if filters.sort.is_empty() {
                    "-created_at"
                } else {
                    filters.sort.as_str()
                };
                (
                    current.trim_start_matches(['-', '+']) == f,
                    current.starts_with('-'),
                )
            }
            None => (false, false),
        };
        let sort_href = field.map(|f| {
            // A click on the sorted column flips its direction; a new column starts ascending.
            let next = if sorted && !desc { format!("-{f}") } else { f };
            link(&next, None)
        });
        Header {
            label,
            numeric,
            sort_href,
            sorted,
            aria_sort: if desc { "descending" } else { "ascending" },
            arrow: match (sorted, desc) {
                (true, true) => " ↓",
                (true, false) => " ↑",
                _ => "",
            },
        }
    };
    let mut headers = vec![
        header("Status".into(), Some("status".into()), false),
        header("Name".into(), Some("name".into()), false),
        header("Experiment".into(), None, false),
    ];
    headers.extend(
        param_cols
            .iter()
            .map(|c| header(c.clone(), Some(format!("params.{c}")), true)),
    );
    headers.extend(
        metric_cols
            .iter()
            .map(|c| header(c.clone(), Some(format!("metrics.{c}")), true)),
    );
    headers.push(header("Duration".into(), None, true));
    headers.push(header("Tags".into(), None, false));
    headers.push(header("Created".into(), Some("created_at".into()), false));
    let shown: std::collections::BTreeSet<String> = param_cols
        .iter()
        .map(|c| format!("params.{c}"))
        .chain(metric_cols.iter().map(|c| format!("metrics.{c}")))
        .collect();
    let chooser = super::columns::chooser_keys(&page.runs)
        .into_iter()
        .map(|k| {
            let on = shown.contains(&k);
            (k, on)
        })
        .collect();
    let paged = query.as_ref().is_some_and(|q| q.cursor.is_some());
    let view = RunsPage {
        nav: "runs",
        heading: match &experiment {
            Some(e) => e.name.clone(),
            None => "Runs".to_string(),
        },
        subtitle: match &experiment {
            Some(_) => "Runs of this experiment. Status updates live.".to_string(),
            None => "All runs across experiments. Status updates live.".to_string(),
        },
        experiments: experiments
            .iter()
            .map(|e| ExperimentChoice {
                id: e.id.clone(),
                name: e.name.clone(),
                selected: e.id == filters.experiment,
            })
            .collect(),
        statuses: RunStatus::ALL
            .iter()
            .map(|s| Choice {
                value: s.as_str().to_string(),
                selected: s.as_str() == filters.status,
            })
            .collect(),
        count_label: format!(
            "{} run{}{}",
            page.runs.len(),
            if page.runs.len() == 1 { "" } else { "s" },
            if page.next_cursor.is_some() || paged {
                " on this page"
            } else {
                ""
            }
        ),
        first_href: paged.then(|| link(&filters.sort, None)),
        next_href: page
            .next_cursor
            .as_deref()
            .map(|c| link(&filters.sort, Some(c))),
        filters,
        error,
        headers,
        rows,
        chooser,
    };
    html(view)
}

fn run_row(
    r: &Run,
    names: &BTreeMap<&str, &str>,
    params: &[String],
    metrics: &[String],
    best: &BTreeMap<(String, String), f64>,
    now: i64,
) -> RunsTableRow {
    RunsTableRow {
        id: r.id.clone(),
        short_id: r.id.chars().take(8).collect(),
        name: r.name.clone(),
        status: r.status.as_str(),
        user: r.created_by.clone().unwrap_or_default(),
        experiment: names
            .get(r.experiment_id.as_str())
            .unwrap_or(&"?")
            .to_string(),
        params: params
            .iter()
            .map(|k| {
                let stored = r.params.get(k).cloned().unwrap_or_default();
                (super::columns::shown_param(&stored), stored)
            })
            .collect(),
        metrics: metrics
            .iter()
            .map(|k| {
                let last = r.latest_metrics.get(k).map(|m| fmt_value(m.value));
                match (last, best.get(&(r.id.clone(), k.clone()))) {
                    (Some(last), Some(b)) if fmt_value(*b) != last => {
                        format!("{last} (best {})", fmt_value(*b))
                    }
                    (last, _) => last.unwrap_or_default(),
                }
            })
            .collect(),
        duration: run_duration(r, now),
        tags: tag_labels(&r.tags),
        created: fmt_time(r.created_at),
    }
}
