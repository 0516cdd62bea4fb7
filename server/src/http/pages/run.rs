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
    // The actions offered are those the access check would let through for this run (in the
    // shared experiment, others' runs are read-only).
    let level = match principal.may_write() {
        true => {
            let access = state.store.run_access(&id).await?;
            crate::access::level_on_run(&state, &principal, &access).await?
        }
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
    // The first charts only: a run may have any number of keys, the rest load on demand.
    let layout = crate::http::api::charts::layout::first_page(
        &keys,
        crate::http::api::charts::layout::DEFAULT_CHART_PAGE,
    );
    let (charts_next, charts_total) = (layout.next_cursor.unwrap_or_default(), layout.total_charts);
    let charts = layout
        .charts
        .into_iter()
        .map(|group| (group.title, group.keys, group.section))
        .map(|(title, keys, section)| ChartCard {
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
            section,
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
    let guard_events = super::guard::guard_events(state.store.as_ref(), &id).await?;
    let exit = run.exit.as_ref().and_then(|e| exit_view(e, run.status));
    let (export_href, export_unavailable) = export_offer(&state, &run, &checkpoints).await;
    let launched = state.launcher.is_launched(&run.id);
    let view = RunPage {
        nav: "runs",
        run: RunHeader {
            id: run.id.clone(),
            name: run.name.clone(),
            status: run.status.as_str(),
            experiment_id: experiment.id.clone(),
            experiment: experiment.name.clone(),
            duration: run_duration(&run, crate::store::now_ms()),
            started_at: run.started_at.map(|t| t.to_string()).unwrap_or_default(),
            now: crate::store::now_ms(),
            stoppable: launched && matches!(run.status, RunStatus::Queued | RunStatus::Running),
            active: matches!(run.status, RunStatus::Queued | RunStatus::Running),
            launched,
            markable: actions::runs::markable(run.status, launched),
            relaunchable: run.config.is_some(),
            resumable: super::checkpoints::resumable(run.status, &checkpoints),
            status_reason,
            exit,
            tags: tag_labels(&run.tags),
            notes: run.notes.clone(),
            executor: executor_label(&run.tags),
            parameters: parameters_label(&run.latest_metrics),
            export_href,
            export_unavailable,
        },
        summary: keys
            .iter()
            .filter(|k| crate::http::api::charts::layout::is_summary_key(k))
            .filter_map(|k| {
                let m = run.latest_metrics.get(k)?;
                Some((k.clone(), fmt_value(m.value), m.step))
            })
            .collect(),
        heatmaps: heatmap_cards(&keys),
        charts,
        charts_next,
        charts_total,
        checkpoints,
        history,
        guard_events,
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

/// The Hugging Face download of a finished run with a checkpoint, or why it cannot work (a
/// model no `transformers` architecture fits): the API's own check
/// (`http::api::export::unavailable`), so the page offers only what the API serves.
pub(super) async fn export_offer(
    state: &AppState,
    run: &crate::store::Run,
    checkpoints: &[CheckpointRow],
) -> (Option<String>, Option<String>) {
    if run.status != RunStatus::Finished || checkpoints.is_empty() {
        return (None, None);
    }
    let (id, status, dir) = (run.id.clone(), run.status, state.launcher.run_dir(&run.id));
    let refused = tokio::task::spawn_blocking(move || {
        crate::http::api::export::unavailable(&id, status, &dir)
    })
    .await
    .unwrap_or(None);
    match refused {
        Some(why) => (None, Some(why)),
        None => (Some(format!("/api/v1/runs/{}/export/hf", run.id)), None),
    }
}

/// The parameter count a run reported at its first step, with how many of them train (fewer
/// with LoRA): "1.2M parameters (4.1k trainable)".
pub(super) fn parameters_label(
    latest: &std::collections::BTreeMap<String, crate::store::LatestMetric>,
) -> Option<String> {
    let count = |key: &str| {
        latest
            .get(key)
            .map(|m| m.value)
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    let total = count("model/params")?;
    let mut label = format!("{} parameters", fmt_count(total));
    if let Some(trainable) = count("model/trainable_params") {
        label.push_str(&format!(" ({} trainable)", fmt_count(trainable)));
    }
    Some(label)
}

/// A count in three significant figures at most: 4096 → "4.1k", 1234567 → "1.2M", 999999 →
/// "1.0M", 42 → "42".
fn fmt_count(n: f64) -> String {
    const UNITS: [(f64, &str); 4] = [(1e3, "k"), (1e6, "M"), (1e9, "B"), (1e12, "T")];
    let n = n.round();
    let Some(mut unit) = UNITS.iter().rposition(|(scale, _)| n >= *scale) else {
        return format!("{n:.0}");
    };
    // 999_999 would round to "1000.0k": the next unit says it ("1.0M").
    if unit + 1 < UNITS.len() && (n / UNITS[unit].0 * 10.0).round() >= 10_000.0 {
        unit += 1;
    }
    let (scale, suffix) = UNITS[unit];
    format!("{:.1}{suffix}", n / scale)
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

#[derive(Deserialize)]
pub(super) struct EndForm {
    #[serde(default)]
    status: String,
    #[serde(default)]
    reason: String,
}

/// "Mark as ended" for a run this server did not launch (without JavaScript; the page's script
/// posts to the API and shows a refusal beside the form).
pub(super) async fn mark_ended(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
    Form(f): Form<EndForm>,
) -> PageResult {
    check_run_id(&id)?;
    let status = f
        .status
        .parse::<RunStatus>()
        .map_err(|_| crate::validate::Invalid::new("status", "choose stopped or failed"))?;
    actions::mark_ended(&state, &actor, &id, status, &f.reason).await?;
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

#[cfg(test)]
mod parameter_tests {
    use super::*;
    use crate::store::LatestMetric;

    fn metrics(pairs: &[(&str, f64)]) -> std::collections::BTreeMap<String, LatestMetric> {
        pairs
            .iter()
            .map(|(k, v)| {
                let m = LatestMetric {
                    step: 1,
                    value: *v,
                    time: 0,
                };
                (k.to_string(), m)
            })
            .collect()
    }

    #[test]
    fn the_parameter_label_says_how_many_parameters_train() {
        type Case<'a> = (&'a [(&'a str, f64)], Option<&'a str>);
        let cases: [Case; 6] = [
            (
                &[
                    ("model/params", 1_234_567.0),
                    ("model/trainable_params", 4096.0),
                ],
                Some("1.2M parameters (4.1k trainable)"),
            ),
            (
                &[
                    ("model/params", 51_000.0),
                    ("model/trainable_params", 51_000.0),
                ],
                Some("51.0k parameters (51.0k trainable)"),
            ),
            (&[("model/params", 999_999.0)], Some("1.0M parameters")),
            (&[("model/params", 7.0e9)], Some("7.0B parameters")),
            (&[("model/trainable_params", 10.0)], None),
            (&[("model/params", f64::NAN)], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(
                parameters_label(&metrics(pairs)).as_deref(),
                want,
                "{pairs:?}"
            );
        }
        assert_eq!(fmt_count(42.0), "42");
        assert_eq!(fmt_count(999.0), "999");
    }
}
