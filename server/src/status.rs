//! The one function through which a run's status changes: the store records it (run row and
//! event, atomically) and the live hub tells every watcher. The API and the launcher both call it.

use tracing::instrument;

use crate::live::LiveHub;
use crate::store::{ExitInfo, RunEvent, RunStatus, Store, StoreResult};

/// Records a status change and notifies the live hub. Returns the recorded event.
#[instrument(skip(store, live, exit))]
pub async fn change_status(
    store: &dyn Store,
    live: &LiveHub,
    run_id: &str,
    status: RunStatus,
    reason: Option<&str>,
    exit: Option<ExitInfo>,
) -> StoreResult<RunEvent> {
    let event = store.set_status(run_id, status, reason, exit).await?;
    tracing::info!(from = ?event.from_status, to = %event.to_status, "run status changed");
    live.publish_status(event.clone());
    Ok(event)
}
