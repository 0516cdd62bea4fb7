//! One run's page and the actions it offers (tags, notes, stop, relaunch), done by the same
//! `crate::actions` functions the API calls.

use super::launch;
use super::views::*;
use super::{check_run_id, html, PageResult};
use crate::access::audit::Actor;
use crate::access::Principal;
use crate::actions::{self, LaunchRequest};
use crate::app::AppState;
use crate::store::accounts::Level;
use crate::store::RunStatus;
use crate::validate::RunEdit;
use axum::extract::{Form, Path, State};
use axum::response::{IntoResponse, Redirect};
use axum::Extension;
use serde::Deserialize;
use std::collections::BTreeMap;
use trainer::wire::RunPatch;

#[tracing::instrument(skip(state))]
pub(super) async fn run_page(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> PageResult {
    check_run_id(&id)?;
    let run = state.store.get_run(&id).await?;
    let level = match principal.may_write() {
        true => principal.level_on(&state, &run.experiment_id).await?,
        false => Level::Read,
    };
    let (can_edit, can_manage) = (level >= Level::Edit, level >= Level::Manage);
    let experiment = state.store.get_experiment(&run.experiment_id).await?;
    let keys: Vec<String> = state
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
    let checkpoints = super::checkpoints::rows(&state, &run.id).await;
    let config_yaml = run
        .config
        .as_ref()
        .and_then(|c| serde_yaml_ng::to_string(c).ok());
    let events = state.store.run_events(&id, None).await?;
    let status_reason = status_reason(&events, run.status);
    let history = history_rows(&events);
    let exit = run.exit.as_ref().and_then(|e| exit_view(e, run.status));
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
            resumable: super::checkpoints::resumable(run.status, &checkpoints),
            status_reason,
            exit,
            tags: tag_labels(&run.tags),
            notes: run.notes.clone(),
            executor: executor_label(&run.tags),
        },
        heatmaps: heatmap_cards(&keys),
        charts,
        checkpoints,
        history,
        params: run.params.clone().into_iter().collect(),
        config_yaml,
        artifacts: crate::http::mlflow::list_files(&state, &run.id)
            .await
            .into_iter()
            .map(|(path, size)| {
                let href = format!("/runs/{}/artifacts/{}", run.id, enc_path(&path));
                (path, href, fmt_bytes(size))
            })
            .collect(),
        log_placeholder: "Log output appears here while the run is live.".to_string(),
        after_step: run
            .latest_metrics
            .values()
            .map(|m| m.step)
            .max()
            .map(|s| s.to_string())
            .unwrap_or_default(),
        can_edit,
        can_manage,
    };
    html(view)
}

/// Why the run is in `status`: the reason of the change that put it there.
pub(super) fn status_reason(events: &[crate::store::RunEvent], status: RunStatus) -> String {
    events
        .iter()
        .rev()
        .find(|e| e.to_status == status)
        .and_then(|e| e.reason.clone())
        // "created: created" says nothing.
        .filter(|reason| reason != status.as_str())
        .unwrap_or_default()
}

/// The run's status changes, newest first.
pub(super) fn history_rows(events: &[crate::store::RunEvent]) -> Vec<HistoryRow> {
    events
        .iter()
        .rev()
        .map(|e| HistoryRow {
            time: fmt_time(e.time),
            to: e.to_status.as_str(),
            reason: e.reason.clone().unwrap_or_default(),
        })
        .collect()
}

/// The exit banner: red only for a failure; the log tail keeps its lines; none for a clean
/// exit (the status says it all).
fn exit_view(e: &crate::store::ExitInfo, status: RunStatus) -> Option<ExitView> {
    if e.exit_code == Some(0) && e.signal.is_none() && e.message.is_none() {
        return None;
    }
    let mut parts = vec![];
    if let Some(c) = e.exit_code {
        parts.push(format!("exit code {c}"));
    }
    if let Some(s) = e.signal {
        parts.push(format!("signal {s}"));
    }
    let (first, tail) = match &e.message {
        Some(m) => match m.split_once('\n') {
            Some((first, rest)) => (first.to_string(), rest.to_string()),
            None => (m.clone(), String::new()),
        },
        None => (String::new(), String::new()),
    };
    if !first.is_empty() {
        parts.push(first);
    }
    Some(ExitView {
        summary: format!("The process ended: {}", parts.join(" · ")),
        tail,
        failed: matches!(status, RunStatus::Failed | RunStatus::Lost),
    })
}

#[derive(Deserialize)]
pub(super) struct ResumeForm {
    #[serde(default)]
    from: String,
}

/// "Resume" (from the header: latest; from a checkpoint row: that step).
pub(super) async fn resume_run(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
    Form(f): Form<ResumeForm>,
) -> PageResult {
    check_run_id(&id)?;
    let from = crate::checkpoints::ResumePoint::parse("from", &f.from)?;
    actions::resume_run(&state, &actor, &id, from, None).await?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

#[derive(Deserialize)]
pub(super) struct TagForm {
    key: String,
    #[serde(default)]
    value: String,
}

pub(super) async fn set_tag(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Form(f): Form<TagForm>,
) -> PageResult {
    check_run_id(&id)?;
    let edit = RunEdit::parse(RunPatch {
        tags: Some(BTreeMap::from([(f.key, f.value)])),
        ..Default::default()
    })?;
    actions::edit_run(&state, &id, edit).await?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

#[derive(Deserialize)]
pub(super) struct NotesForm {
    notes: String,
}

pub(super) async fn set_notes(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Form(f): Form<NotesForm>,
) -> PageResult {
    check_run_id(&id)?;
    let edit = RunEdit::parse(RunPatch {
        notes: Some(f.notes),
        ..Default::default()
    })?;
    actions::edit_run(&state, &id, edit).await?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

pub(super) async fn delete_run(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
) -> PageResult {
    check_run_id(&id)?;
    let experiment = state.store.get_run(&id).await?.experiment_id;
    actions::delete_run(&state, &actor, &id).await?;
    Ok(Redirect::to(&format!("/experiments/{experiment}")).into_response())
}

pub(super) async fn stop_run(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
) -> PageResult {
    check_run_id(&id)?;
    actions::stop_run(&state, &actor, &id).await?;
    Ok(Redirect::to(&format!("/runs/{id}")).into_response())
}

pub(super) async fn relaunch_run(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
) -> PageResult {
    check_run_id(&id)?;
    let run = state.store.get_run(&id).await?;
    let Some(config) = run.config.clone() else {
        return Err(crate::validate::Invalid::new(
            "config",
            "config: this run has no recorded config to relaunch",
        )
        .into());
    };
    let gpus = run
        .tags
        .get("gpus")
        .and_then(|g| g.parse::<usize>().ok())
        .unwrap_or(0);
    let request = LaunchRequest {
        tags: BTreeMap::from([("relaunch_of".to_string(), run.id.clone())]),
        ..launch::launch_request(
            &run.experiment_id,
            &format!("{}-relaunch", run.name),
            config,
            gpus,
        )
    };
    let new = actions::launch_run(&state, &actor, request).await?;
    Ok(Redirect::to(&format!("/runs/{}", new.id)).into_response())
}

/// One of the run's artifact files, as a download.
#[tracing::instrument(skip(state))]
pub(super) async fn artifact(
    State(state): State<AppState>,
    Path((id, path)): Path<(String, String)>,
) -> Result<axum::response::Response, super::PageError> {
    check_run_id(&id)?;
    state.store.get_run(&id).await?;
    let not_found = || super::PageError::NotFound(format!("artifact `{path}` not found"));
    let rel = crate::http::mlflow::relative_path("path", &path).map_err(|_| not_found())?;
    let root = crate::http::mlflow::artifact_root(&state, &id);
    crate::http::mlflow::serve_file(&root, &rel)
        .await
        .map_err(|_| not_found())
}

/// Where a launched run executes, from the launcher's tags: `local`, or for a Slurm run its job,
/// partition and Slurm state (kept current by the executor while it follows the job).
fn executor_label(tags: &std::collections::BTreeMap<String, String>) -> Option<String> {
    use crate::launcher::slurm::{JOB_TAG, PARTITION_TAG, STATE_TAG};
    match tags.get("trainyard.launcher")?.as_str() {
        "slurm" => {
            let mut parts = vec![match tags.get(JOB_TAG) {
                Some(job) => format!("Slurm job {job}"),
                None => "Slurm (not submitted yet)".to_string(),
            }];
            if let Some(p) = tags.get(PARTITION_TAG) {
                parts.push(format!("partition {p}"));
            }
            if let Some(s) = tags.get(STATE_TAG) {
                parts.push(s.clone());
            }
            Some(parts.join(" · "))
        }
        other => Some(other.to_string()),
    }
}
