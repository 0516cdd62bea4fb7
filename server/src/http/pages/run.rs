//! One run's page and the actions it offers (tags, notes, stop, relaunch), which go through
//! the API in-process.

use super::launch;
use super::views::*;
use super::{api_patch, api_result, check_run_id, html, Dashboard, PageError, PageResult};
use crate::store::RunStatus;
use axum::extract::{Form, Path, State};
use axum::http::Method;
use axum::response::{IntoResponse, Redirect};
use serde::Deserialize;
use std::collections::BTreeMap;

#[tracing::instrument(skip(d))]
pub(super) async fn run_page(State(d): State<Dashboard>, Path(id): Path<String>) -> PageResult {
    check_run_id(&id)?;
    let run = d.store.get_run(&id).await?;
    let experiment = d.store.get_experiment(&run.experiment_id).await?;
    let keys: Vec<String> = d
        .store
        .metric_keys(&id)
        .await?
        .into_iter()
        .map(|k| k.key)
        .collect();
    let charts = chart_groups(&keys)
        .into_iter()
        .map(|(title, keys)| ChartCard {
            latest: keys
                .first()
                .and_then(|k| run.latest_metrics.get(k))
                .map(|m| format!("{} @ {}", fmt_value(m.value), m.step))
                .unwrap_or_default(),
            svg_href: format!(
                "/api/v1/runs/{}/charts/{}.svg?width=640&height=300",
                run.id,
                enc_path(&keys[0])
            ),
            keys_csv: keys.join(","),
            title,
        })
        .collect();
    let checkpoints = super::checkpoints::list(&d, &run.id).await;
    let config_yaml = run
        .config
        .as_ref()
        .and_then(|c| serde_yaml_ng::to_string(c).ok());
    let exit = run.exit.as_ref().map(|e| {
        let mut parts = vec![];
        if let Some(c) = e.exit_code {
            parts.push(format!("exit code {c}"));
        }
        if let Some(s) = e.signal {
            parts.push(format!("signal {s}"));
        }
        if let Some(m) = &e.message {
            parts.push(m.clone());
        }
        parts.join(" · ")
    });
    let view = RunPage {
        nav: "runs",
        run: RunHeader {
            id: run.id.clone(),
            name: run.name.clone(),
            status: run.status.as_str(),
            experiment_id: experiment.id.clone(),
            experiment: experiment.name.clone(),
            duration: run_duration(&run, crate::store::now_ms()),
            stoppable: matches!(run.status, RunStatus::Queued | RunStatus::Running),
            relaunchable: run.config.is_some(),
            exit: exit.filter(|e| !e.is_empty()),
            tags: tag_labels(&run.tags),
            notes: run.notes.clone(),
        },
        heatmaps: heatmap_cards(&keys),
        charts,
        checkpoints,
        params: run.params.clone().into_iter().collect(),
        config_yaml,
        log_placeholder: "Log output appears here while the run is live.".to_string(),
        after_step: run
            .latest_metrics
            .values()
            .map(|m| m.step)
            .max()
            .map(|s| s.to_string())
            .unwrap_or_default(),
    };
    html(view)
}

#[derive(Deserialize)]
pub(super) struct TagForm {
    key: String,
    #[serde(default)]
    value: String,
}

pub(super) async fn set_tag(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<TagForm>,
) -> PageResult {
    check_run_id(&id)?;
    let key = f.key.trim();
    if key.is_empty() {
        return Err(PageError::BadRequest("key: a tag needs a key".into()));
    }
    let tags = BTreeMap::from([(key.to_string(), f.value)]);
    let body = serde_json::json!({ "tags": tags });
    api_patch(&d, &id, body).await?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

#[derive(Deserialize)]
pub(super) struct NotesForm {
    notes: String,
}

pub(super) async fn set_notes(
    State(d): State<Dashboard>,
    Path(id): Path<String>,
    Form(f): Form<NotesForm>,
) -> PageResult {
    check_run_id(&id)?;
    api_patch(&d, &id, serde_json::json!({ "notes": f.notes })).await?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

pub(super) async fn stop_run(State(d): State<Dashboard>, Path(id): Path<String>) -> PageResult {
    check_run_id(&id)?;
    let (status, json) = d
        .call_api(Method::POST, &format!("/api/v1/runs/{id}/stop"), None)
        .await?;
    api_result(status, &json)?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

pub(super) async fn relaunch_run(State(d): State<Dashboard>, Path(id): Path<String>) -> PageResult {
    check_run_id(&id)?;
    let run = d.store.get_run(&id).await?;
    let Some(config) = run.config.clone() else {
        return Err(PageError::BadRequest(
            "config: this run has no recorded config to relaunch".into(),
        ));
    };
    let gpus = run
        .tags
        .get("gpus")
        .and_then(|g| g.parse::<u32>().ok())
        .unwrap_or(0);
    let body = launch::launch_body(
        &run.experiment_id,
        Some(&format!("{}-relaunch", run.name)),
        config,
        gpus,
        Some(&run.id),
    );
    let (status, json) = d.call_api(Method::POST, "/api/v1/runs", Some(body)).await?;
    api_result(status, &json)?;
    let new_id = json.get("id").and_then(|v| v.as_str()).unwrap_or(&id);
    Ok(Redirect::to(&format!("/runs/{new_id}")).into_response())
}
