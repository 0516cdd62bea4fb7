//! The runs table: the home page and one experiment's runs, filtered, sorted and paged on the
//! server (the same search as `GET /api/v1/runs`).

use super::views::*;
use super::{html, Dashboard, PageResult};
use crate::store::{Run, RunQuery, RunStatus, StoreError};
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Default, Deserialize)]
pub struct RunsParams {
    pub experiment: Option<String>,
    pub status: Option<String>,
    pub tag: Option<String>,
    pub q: Option<String>,
    pub cols: Option<String>,
    pub sort: Option<String>,
    pub cursor: Option<String>,
    pub limit: Option<usize>,
}

pub(super) async fn runs_home(
    State(d): State<Dashboard>,
    Query(p): Query<RunsParams>,
) -> PageResult {
    runs_table(&d, p).await
}

pub(super) async fn runs_of_experiment(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Query(mut p): Query<RunsParams>,
) -> PageResult {
    if p.experiment.as_deref().unwrap_or("").is_empty() {
        p.experiment = Some(id);
    }
    runs_table(&d, p).await
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

#[tracing::instrument(skip(d))]
pub async fn runs_table(d: &Dashboard, p: RunsParams) -> PageResult {
    let experiments = d.store.list_experiments().await?;
    let experiment = match non_empty(&p.experiment) {
        Some(e) => Some(d.store.get_experiment(e).await?),
        None => None,
    };
    let filters = Filters {
        experiment: experiment
            .as_ref()
            .map(|e| e.id.clone())
            .unwrap_or_default(),
        status: non_empty(&p.status).unwrap_or("").to_string(),
        tag: non_empty(&p.tag).unwrap_or("").to_string(),
        q: non_empty(&p.q).unwrap_or("").to_string(),
        cols: non_empty(&p.cols).unwrap_or("").to_string(),
        sort: non_empty(&p.sort).unwrap_or("").to_string(),
    };
    let mut error = None;
    let status = match non_empty(&p.status) {
        Some(s) => match s.parse::<RunStatus>() {
            Ok(s) => Some(s),
            Err(e) => {
                error = Some(format!("status: {e}"));
                None
            }
        },
        None => None,
    };
    let filter = match non_empty(&p.q) {
        Some(q) => match parse_q(q) {
            Ok(f) => Some(f),
            Err(e) => {
                error = Some(format!("q: {e}"));
                None
            }
        },
        None => None,
    };
    let (sort, dir) = parse_sort(&filters.sort);
    let query = RunQuery {
        experiment_id: experiment.as_ref().map(|e| e.id.clone()),
        status,
        tag: non_empty(&p.tag).map(str::to_string),
        filter,
        sort,
        dir,
        limit: p.limit.unwrap_or(50).clamp(1, 500),
        cursor: non_empty(&p.cursor).map(str::to_string),
    };
    let page = if error.is_some() {
        crate::store::RunPage {
            runs: Vec::new(),
            next_cursor: None,
        }
    } else {
        match d.store.search_runs(&query).await {
            Ok(page) => page,
            Err(StoreError::Invalid { field, message }) => {
                error = Some(format!("{field}: {message}"));
                crate::store::RunPage {
                    runs: Vec::new(),
                    next_cursor: None,
                }
            }
            Err(e) => return Err(e.into()),
        }
    };
    let names: BTreeMap<&str, &str> = experiments
        .iter()
        .map(|e| (e.id.as_str(), e.name.as_str()))
        .collect();
    let (param_cols, metric_cols) = table_columns(&filters.cols, &page.runs);
    let now = crate::store::now_ms();
    let rows = page
        .runs
        .iter()
        .map(|r| run_row(r, &names, &param_cols, &metric_cols, now))
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
                    current.trim_start_matches('-') == f,
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
    let paged = query.cursor.is_some();
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
    };
    html(view)
}

fn run_row(
    r: &Run,
    names: &BTreeMap<&str, &str>,
    params: &[String],
    metrics: &[String],
    now: i64,
) -> RunRow {
    RunRow {
        id: r.id.clone(),
        short_id: r.id.chars().take(8).collect(),
        name: r.name.clone(),
        status: r.status.as_str(),
        experiment: names
            .get(r.experiment_id.as_str())
            .unwrap_or(&"?")
            .to_string(),
        params: params
            .iter()
            .map(|k| r.params.get(k).cloned().unwrap_or_default())
            .collect(),
        metrics: metrics
            .iter()
            .map(|k| {
                r.latest_metrics
                    .get(k)
                    .map(|m| fmt_value(m.value))
                    .unwrap_or_default()
            })
            .collect(),
        duration: run_duration(r, now),
        tags: tag_labels(&r.tags),
        created: fmt_time(r.created_at),
    }
}
