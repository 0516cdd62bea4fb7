//! The one function through which a run's status changes, and the one table of which changes
//! are allowed. The store records a change (run row and event, atomically) and the live hub
//! tells every watcher. The API and the launcher both call it.
//!
//! The lifecycle:
//!
//! ```text
//! created ──► running ──► finished | failed | stopped
//!    │           ▲   │
//!    │           │   └──► queued            (launcher: a failed attempt is relaunched)
//!    │        queued ───► failed | stopped  (never started)
//!    └──► finished | failed | stopped       (a client that reports only its end)
//!
//! finished | failed | stopped ──► running   (resume: a trainer continues from a checkpoint)
//! finished | failed | stopped ──► queued    (launcher: relaunch after the trainer reported)
//! running ──► lost                          (watchdog: no sign of life for --lost-after-secs)
//! lost ──► running | finished | failed | stopped   (the client spoke again)
//! queued | running | lost ──► pruned              (a sweep's early-stopping rule)
//! ```
//!
//! Everything else (a terminal status replaced by another terminal one, anything back to
//! `created`, a queued run reported `finished` without ever running) is refused with a
//! conflict naming both statuses.

use tracing::instrument;

use crate::live::LiveHub;
use crate::store::{ExitInfo, RunEvent, RunStatus, Store, StoreError, StoreResult};

/// Who asks for a status change: some transitions belong to the launcher alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    /// A reporting client through the API (the trainer, a script, the dashboard).
    Client,
    /// This server's launcher, which owns the queue: only it may put a run (back) in line.
    Launcher,
    /// This server's watchdog (`crate::liveness`): only it declares a silent run `lost`.
    Watchdog,
    /// This server's sweep controller (`crate::sweeps`): only it prunes a trial.
    Sweep,
}

/// Whether `actor` may move a run from `from` to `to`.
pub fn transition_allowed(from: RunStatus, to: RunStatus, actor: Actor) -> bool {
    use RunStatus::*;
    match (from, to) {
        (_, Created) => false,
        (Queued | Running | Lost, Pruned) => actor == Actor::Sweep,
        (_, Pruned) => false,
        (Running, Lost) => actor == Actor::Watchdog,
        (_, Lost) => false,
        (Lost, Running | Finished | Failed | Stopped) => true,
        (_, Queued) => actor == Actor::Launcher && from != Queued,
        (Created, Running | Finished | Failed | Stopped) => true,
        (Queued, Running | Failed | Stopped) => true,
        (Running, Finished | Failed | Stopped) => true,
        // Resume: `trainyard train --resume` of an ended run reports `running` again.
        (Finished | Failed | Stopped | Pruned, Running) => true,
        _ => false,
    }
}

/// The refusal of an illegal change, as the API shows it (409, field `status`).
pub fn illegal_transition(from: RunStatus, to: RunStatus) -> StoreError {
    let why = if to == RunStatus::Created {
        "no run goes back to `created`".to_string()
    } else if to == RunStatus::Queued {
        "only this server's launcher puts a run in its queue".to_string()
    } else if to == RunStatus::Lost {
        "only this server declares a silent running run `lost`".to_string()
    } else if to == RunStatus::Pruned {
        "only this server's sweep controller prunes a queued or running run".to_string()
    } else if from.is_terminal() {
        format!("`{from}` is final (a resumed run reports `running` first)")
    } else {
        format!("a `{from}` run cannot become `{to}`")
    };
    StoreError::Conflict {
        field: Some("status"),
        message: format!("cannot change the status from `{from}` to `{to}`: {why}"),
    }
}

/// Checks the change against the lifecycle, records it and notifies the live hub. Returns the
/// recorded event.
///
/// The check and the write happen under the run's write-order lock, which every status change
/// of this server takes, so two concurrent changes cannot both pass the check on the same
/// starting status.
#[instrument(skip(store, live, exit))]
pub async fn change_status(
    store: &dyn Store,
    live: &LiveHub,
    run_id: &str,
    status: RunStatus,
    reason: Option<&str>,
    exit: Option<ExitInfo>,
    actor: Actor,
) -> StoreResult<RunEvent> {
    let _order = live.write_order(run_id).await;
    let from = store.get_run(run_id).await?.status;
    if !transition_allowed(from, status, actor) {
        return Err(illegal_transition(from, status));
    }
    let event = store.set_status(run_id, status, reason, exit).await?;
    if status.is_terminal() {
        // The run's own tokens end with it (a restart or resume issues a new one).
        store
            .revoke_run_tokens(run_id, crate::store::now_ms())
            .await?;
    }
    let from_status = event.from_status.map_or("none", |s| s.as_str());
    tracing::info!(from = from_status, to = %event.to_status, "run status changed");
    live.publish_status(event.clone());
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use RunStatus::*;

    #[test]
    fn the_allowed_transitions_are_exactly_the_lifecycle() {
        // (from, to, client may, launcher may)
        let table = [
            (Created, Running, true, true),
            (Created, Finished, true, true),
            (Created, Failed, true, true),
            (Created, Stopped, true, true),
            (Created, Queued, false, true),
            (Queued, Running, true, true),
            (Queued, Failed, true, true),
            (Queued, Stopped, true, true),
            (Queued, Finished, false, false),
            (Queued, Queued, false, false),
            (Running, Finished, true, true),
            (Running, Failed, true, true),
            (Running, Stopped, true, true),
            (Running, Queued, false, true),
            (Running, Running, false, false),
            (Running, Created, false, false),
            (Finished, Failed, false, false),
            (Finished, Stopped, false, false),
            (Failed, Finished, false, false),
            (Stopped, Finished, false, false),
            (Stopped, Failed, false, false),
            (Finished, Finished, false, false),
            (Failed, Queued, false, true),
            (Stopped, Queued, false, true),
            (Failed, Running, true, true),
            (Stopped, Running, true, true),
            (Finished, Running, true, true),
            (Finished, Created, false, false),
            (Running, Lost, false, false),
            (Lost, Running, true, true),
            (Lost, Finished, true, true),
            (Lost, Failed, true, true),
            (Lost, Stopped, true, true),
            (Lost, Queued, false, true),
            (Created, Lost, false, false),
            (Running, Pruned, false, false),
            (Queued, Pruned, false, false),
            (Pruned, Running, true, true),
            (Pruned, Finished, false, false),
            (Pruned, Stopped, false, false),
        ];
        for (from, to, client, launcher) in table {
            assert_eq!(
                transition_allowed(from, to, Actor::Client),
                client,
                "client {from} → {to}"
            );
            assert_eq!(
                transition_allowed(from, to, Actor::Launcher),
                launcher,
                "launcher {from} → {to}"
            );
        }
        for (from, to, watchdog) in [
            (Running, Lost, true),
            (Created, Lost, false),
            (Queued, Lost, false),
            (Finished, Lost, false),
            (Lost, Lost, false),
        ] {
            assert_eq!(
                transition_allowed(from, to, Actor::Watchdog),
                watchdog,
                "watchdog {from} → {to}"
            );
        }
        for (from, to, sweep) in [
            (Running, Pruned, true),
            (Queued, Pruned, true),
            (Lost, Pruned, true),
            (Created, Pruned, false),
            (Finished, Pruned, false),
            (Pruned, Pruned, false),
        ] {
            assert_eq!(
                transition_allowed(from, to, Actor::Sweep),
                sweep,
                "sweep {from} → {to}"
            );
        }
    }

    #[test]
    fn a_refused_change_names_both_statuses_and_the_status_field() {
        match illegal_transition(Finished, Failed) {
            StoreError::Conflict { field, message } => {
                assert_eq!(field, Some("status"));
                assert!(
                    message.contains("`finished`") && message.contains("`failed`"),
                    "{message}"
                );
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
    }
}
