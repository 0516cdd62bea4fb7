//! The compare page: the chosen metrics overlaid across the selected runs (one chart each), a
//! final/best table per run, and their params side by side, the differing keys first.

use super::views::*;
use super::{check_run_id, html, PageError, PageResult};
use crate::access::Principal;
use crate::app::AppState;
use crate::store::accounts::Level;
use axum::extract::{Query, State};
use axum::Extension;
use trainer::wire::moe_keys;

// ---------------------------------------------------------------------------------------------
// Compare

pub async fn compare_page(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> PageResult {
    let mut ids: Vec<String> = Vec::new();
    let mut chosen: Vec<String> = Vec::new();
    for (k, v) in pairs {
        match k.as_str() {
            // Both `runs=a&runs=b` (checkboxes) and `runs=a,b` (links) select runs.
            "runs" => ids.extend(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            ),
            // `key=a&key=b` (the checkboxes) or `key=a,b`.
            "key" => chosen.extend(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            ),
            _ => {}
        }
    }
    ids.dedup();
    if ids.is_empty() {
        return Err(PageError::BadRequest(
            "runs: select at least one run to compare".into(),
        ));
    }
    if ids.len() > 32 {
        return Err(PageError::BadRequest(
            "runs: compare at most 32 runs".into(),
        ));
    }
    let mut runs = Vec::with_capacity(ids.len());
    for id in &ids {
        check_run_id(id)?;
        crate::access::require_run(&state, &principal, id, Level::Read)
            .await
            .map_err(crate::http::ApiError::from)?;
        runs.push(state.store.get_run(id).await?);
    }
    let mut all_keys: Vec<String> = runs
        .iter()
        .flat_map(|r| r.latest_metrics.keys().cloned())
        .filter(|k| moe_keys::parse_expert(k).is_none())
        .collect();
    all_keys.sort();
    all_keys.dedup();
    chosen.dedup();
    if chosen.len() > 8 {
        return Err(PageError::BadRequest(
            "key: compare at most 8 metrics".into(),
        ));
    }
    if chosen.is_empty() {
        chosen = ["train/loss", "val/loss"]
            .iter()
            .filter(|k| all_keys.iter().any(|a| a == *k))
            .map(|k| k.to_string())
            .collect();
    }
    if chosen.is_empty() {
        chosen.extend(all_keys.first().cloned());
    }
    if chosen.is_empty() {
        chosen.push("train/loss".to_string());
    }
    let summary = summary_rows(&state, &runs, &chosen).await?;
    let param_keys: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|r| r.params.keys()).collect();
    let mut params: Vec<ParamRow> = param_keys
        .into_iter()
        .map(|k| {
            let values: Vec<String> = runs
                .iter()
                .map(|r| r.params.get(k).cloned().unwrap_or_else(|| "—".into()))
                .collect();
            let differs = values.iter().any(|v| v != &values[0]);
            ParamRow {
                key: k.clone(),
                values,
                differs,
            }
        })
        .collect();
    // What differs is what a comparison is about: those rows first (stable within each group).
    params.sort_by_key(|p| !p.differs);
    let runs_json = serde_json::to_string(
        &runs
            .iter()
            .map(|r| serde_json::json!({"id": r.id, "name": r.name}))
            .collect::<Vec<_>>(),
    )
    .map_err(|e| PageError::Internal(e.to_string()))?;
    let view = ComparePage {
        nav: "runs",
        charts: chosen
            .iter()
            .map(|key| CompareChart {
                svg_href: format!(
                    "/api/v1/charts/compare.svg?runs={}&key={}&width=900&height=380",
                    ids.join(","),
                    enc(key)
                ),
                key: key.clone(),
            })
            .collect(),
        keys: all_keys
            .iter()
            .map(|k| Choice {
                value: k.clone(),
                selected: chosen.contains(k),
            })
            .collect(),
        differing: params.iter().filter(|p| p.differs).count(),
        runs: runs
            .iter()
            .enumerate()
            .map(|(i, r)| CompareRun {
                id: r.id.clone(),
                name: r.name.clone(),
                color: PALETTE[i % PALETTE.len()],
            })
            .collect(),
        runs_json,
        summary,
        params,
    };
    html(view)
}

/// Per run, each chosen metric's final value and its best (lowest for losses, highest for
/// accuracies and scores).
async fn summary_rows(
    state: &AppState,
    runs: &[crate::store::Run],
    keys: &[String],
) -> Result<Vec<SummaryRow>, PageError> {
    let ids: Vec<String> = runs.iter().map(|r| r.id.clone()).collect();
    let best = super::columns::best_values(&state.store.metric_extremes(&ids, keys).await?);
    Ok(runs
        .iter()
        .map(|r| SummaryRow {
            id: r.id.clone(),
            name: r.name.clone(),
            cells: keys
                .iter()
                .map(|k| {
                    let last = r.latest_metrics.get(k);
                    (
                        last.map(|m| format!("{} @ {}", fmt_value(m.value), m.step))
                            .unwrap_or_else(|| "—".into()),
                        best.get(&(r.id.clone(), k.clone()))
                            .map(|b| fmt_value(*b))
                            .unwrap_or_else(|| "—".into()),
                    )
                })
                .collect(),
        })
        .collect())
}
