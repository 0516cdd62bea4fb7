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
pub async fn edit_run(state: &AppState, id: &str, edit: RunEdit) -> Result<Run, Error> {
    let current = state.store.get_run(id).await?;
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
    let outcome = state.launcher.stop(id).await?;
    actor
        .record(state.store.as_ref(), AuditAction::RunStop, Some(id), None)
        .await;
    Ok(outcome)
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
