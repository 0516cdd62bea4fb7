//! The compare page: one metric overlaid across the selected runs, and their params side by
//! side with the differing keys highlighted.

use super::views::*;
use super::{check_run_id, html, Dashboard, PageError, PageResult};
use axum::extract::{Query, State};
use trainer::wire::moe_keys;

// ---------------------------------------------------------------------------------------------
// Compare

pub async fn compare_page(
    State(d): State<Dashboard>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> PageResult {
    let mut ids: Vec<String> = Vec::new();
    let mut key = None;
    for (k, v) in pairs {
        match k.as_str() {
            // Both `runs=a&runs=b` (checkboxes) and `runs=a,b` (links) select runs.
            "runs" => ids.extend(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            ),
            "key" if !v.is_empty() => key = Some(v),
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
        runs.push(d.store.get_run(id).await?);
    }
    let mut all_keys: Vec<String> = runs
        .iter()
        .flat_map(|r| r.latest_metrics.keys().cloned())
        .filter(|k| moe_keys::parse_expert(k).is_none())
        .collect();
    all_keys.sort();
    all_keys.dedup();
    let key = key
        .or_else(|| {
            ["val/loss", "train/loss"]
                .iter()
                .find(|k| all_keys.iter().any(|a| a == *k))
                .map(|k| k.to_string())
        })
        .or_else(|| all_keys.first().cloned())
        .unwrap_or_else(|| "train/loss".to_string());
    let param_keys: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|r| r.params.keys()).collect();
    let params: Vec<ParamRow> = param_keys
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
    let runs_json = serde_json::to_string(
        &runs
            .iter()
            .map(|r| serde_json::json!({"id": r.id, "name": r.name}))
            .collect::<Vec<_>>(),
    )
    .map_err(|e| PageError::Internal(e.to_string()))?;
    let view = ComparePage {
        nav: "runs",
        svg_href: format!(
            "/api/v1/charts/compare.svg?runs={}&key={}&width=900&height=380",
            ids.join(","),
            enc(&key)
        ),
        keys: all_keys
            .iter()
            .map(|k| Choice {
                value: k.clone(),
                selected: *k == key,
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
        key,
        params,
    };
    html(view)
}
