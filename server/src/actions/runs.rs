//! Editing, stopping and resuming a run.

use tracing::instrument;

use crate::access::audit;
use crate::access::audit::AuditAction;
use crate::checkpoints::{self, ResumePoint};
use crate::error::Error;
use crate::launcher::StopOutcome;
use crate::state::AppState;
use crate::status::{change_status, illegal_transition, transition_allowed, Actor};
use crate::store::{Run, RunStatus, RunUpdate};
use crate::validate::{Name, RunEdit};

/// Applies an edit (name, tags merged, notes, the write-once config, a status change with its
/// reason) and returns the run as stored. A refused edit changes nothing.
#[instrument(skip(state, edit))]
pub async fn edit_run(state: &AppState, id: &str, mut edit: RunEdit) -> Result<Run, Error> {
    let current = state.store.get_run(id).await?;
    if pruned_trial_reports_its_end(current.status, edit.status) {
        // The sweep pruned the trial and then stopped its process, which reports how it ended:
        // acknowledged, and the prune stands (the report is not a mistake to warn about).
        edit.status = None;
        edit.reason = None;
    }
    // Refuse an illegal status change before anything else is written, so a refused request
    // changes nothing (`change_status` checks again under the run's lock).
    if let Some(status) = edit.status {
        if status != current.status && !transition_allowed(current.status, status, Actor::Client) {
            return Err(illegal_transition(current.status, status).into());
        }
    }
    if let Some(tags) = &edit.tags {
        tags.check_merge(&current.tags)?;
    }
    let (status, reason) = (edit.status, edit.reason.clone());
    let mut run = if edit.has_fields() {
        let update = RunUpdate {
            name: edit.name.map(Name::into_string),
            tags: edit.tags.map(|t| t.into_inner()),
            notes: edit.notes,
            config: edit.config,
        };
        state.store.update_run(id, update).await?
    } else {
        current
    };
    if let Some(status) = status {
        if status != run.status {
            change_status(
                state.store.as_ref(),
                &state.live,
                id,
                status,
                reason.as_deref(),
                None,
                Actor::Client,
            )
            .await?;
            run = state.store.get_run(id).await?;
        }
    }
    Ok(run)
}

/// Whether a status report is a pruned trial's process telling how it ended after the sweep
/// stopped it.
fn pruned_trial_reports_its_end(current: RunStatus, reported: Option<RunStatus>) -> bool {
    current == RunStatus::Pruned
        && matches!(
            reported,
            Some(RunStatus::Stopped | RunStatus::Failed | RunStatus::Finished)
        )
}

/// Deletes a run that is not queued or running: its stored data and, for a run this server
/// launched, its directory (logs, checkpoints).
#[instrument(skip(state, actor))]
pub async fn delete_run(state: &AppState, actor: &audit::Actor, id: &str) -> Result<(), Error> {
    let run = state.store.get_run(id).await?;
    if matches!(run.status, RunStatus::Queued | RunStatus::Running) {
        return Err(Error::Conflict {
            field: None,
            message: format!(
                "run `{id}` is {}: stop it before deleting it",
                run.status.as_str()
            ),
        });
    }
    let launched = state.launcher.is_launched(id);
    state.store.delete_run(id).await?;
    if launched {
        let dir = state.launcher.run_dir(id);
        let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        if let Err(error) = removed {
            tracing::warn!(run = %id, %error, "the deleted run's directory was not removed");
        }
    }
    actor
        .record(state.store.as_ref(), AuditAction::RunDelete, Some(id), None)
        .await;
    Ok(())
}

/// Stops a launched run: a queued one leaves the queue, a running one gets SIGTERM (it
/// checkpoints and exits) and SIGKILL after the grace period.
#[instrument(skip(state, actor))]
pub async fn stop_run(
    state: &AppState,
    actor: &audit::Actor,
    id: &str,
) -> Result<StopOutcome, Error> {
    state.store.get_run(id).await?;
    if !state.launcher.is_launched(id) {
        return Err(not_launched_here(id));
    }
    let outcome = state.launcher.stop(id).await?;
    actor
        .record(state.store.as_ref(), AuditAction::RunStop, Some(id), None)
        .await;
    Ok(outcome)
}

/// The refusal of a stop for a run whose process this server does not hold.
fn not_launched_here(id: &str) -> Error {
    Error::Conflict {
        field: None,
        message: format!(
            "run `{id}` was not launched by this server, so there is no process here to stop; \
             stop it where it runs, or mark it as stopped or failed with a reason \
             (POST /api/v1/runs/{id}/end)"
        ),
    }
}

/// The statuses a person may mark a run this server did not launch with.
pub const MARKED_ENDINGS: [RunStatus; 2] = [RunStatus::Stopped, RunStatus::Failed];

/// Whether a run in `status` may be marked ended by hand: one this server did not launch (its
/// process, if any, is out of reach) that has not ended yet.
pub fn markable(status: RunStatus, launched: bool) -> bool {
    !launched
        && matches!(
            status,
            RunStatus::Created | RunStatus::Running | RunStatus::Lost
        )
}

/// Marks a run this server did not launch (created over the API, by MLflow, by `trainyard
/// train --server`) as `stopped` or `failed`, with the reason a person gives; afterwards it can
/// be deleted. A launched run is stopped with [`stop_run`] instead: its process is this
/// server's to end. The change goes through `status::change_status` like every other.
#[instrument(skip(state, actor))]
pub async fn mark_ended(
    state: &AppState,
    actor: &audit::Actor,
    id: &str,
    status: RunStatus,
    reason: &str,
) -> Result<Run, Error> {
    let run = state.store.get_run(id).await?;
    if !MARKED_ENDINGS.contains(&status) {
        return Err(crate::validate::Invalid::new(
            "status",
            format!("a run is marked `stopped` or `failed`, not `{status}`"),
        )
        .into());
    }
    let edit = RunEdit::parse(trainer::wire::RunPatch {
        status: Some(status),
        reason: Some(reason.trim().to_string()),
        ..Default::default()
    })?;
    if edit.reason.as_deref().unwrap_or_default().is_empty() {
        return Err(crate::validate::Invalid::new(
            "reason",
            "say why the run ended (it is recorded in the run's history)",
        )
        .into());
    }
    let launched = state.launcher.is_launched(id);
    if !markable(run.status, launched) {
        let message = if launched {
            format!(
                "run `{id}` was launched by this server: stop it with Stop (POST \
                 /api/v1/runs/{id}/stop), which ends its process"
            )
        } else {
            format!(
                "run `{id}` has already ended (it is {})",
                run.status.as_str()
            )
        };
        return Err(Error::Conflict {
            field: Some("status".to_string()),
            message,
        });
    }
    change_status(
        state.store.as_ref(),
        &state.live,
        id,
        status,
        edit.reason.as_deref(),
        None,
        Actor::Client,
    )
    .await?;
    let detail = Some(format!("marked {status}"));
    actor
        .record(
            state.store.as_ref(),
            AuditAction::RunMarkEnded,
            Some(id),
            detail,
        )
        .await;
    Ok(state.store.get_run(id).await?)
}

/// Continues an ended run that this server launched from one of its checkpoints, as a new
/// attempt of the same run: its metrics go on in the same series (a step already stored keeps
/// its first value), and the attempt is recorded in its events and its `trainyard.attempts`
/// tag.
#[instrument(skip(state, actor))]
pub async fn resume_run(
    state: &AppState,
    actor: &audit::Actor,
    id: &str,
    from: ResumePoint,
    gpus: Option<usize>,
) -> Result<Run, Error> {
    state.store.get_run(id).await?;
    if !state.launcher.is_launched(id) {
        // Before resolving a checkpoint: "not launched here" says more than "no checkpoint".
        return Err(crate::launcher::LaunchError::NotLaunched(id.to_string()).into());
    }
    let dir = state.launcher.run_dir(id);
    let (checkpoint, path) = tokio::task::spawn_blocking(move || checkpoints::resolve(&dir, &from))
        .await
        .map_err(Error::internal)??;
    let run = state
        .launcher
        .resume(id, path, checkpoint.step, gpus)
        .await?;
    let detail = Some(format!("from step {}", checkpoint.step));
    actor
        .record(
            state.store.as_ref(),
            AuditAction::RunResume,
            Some(id),
            detail,
        )
        .await;
    Ok(run)
}
