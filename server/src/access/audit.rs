//! Writing the audit log: one call per event a lab would want to trace (sign-ins, tokens, run
//! creation, launch, stop, grants, user and team changes), with the time, the actor, the
//! client address and the target. The log is append-only: the store offers no way to change
//! or delete an entry.

use crate::app::AppState;
use crate::store::accounts::AuditNew;
use crate::store::now_ms;

use super::Principal;

/// Records an event. A failure to record is logged, not returned: the action itself already
/// happened and was committed.
pub async fn record(
    state: &AppState,
    actor: Option<String>,
    client: Option<&str>,
    action: &str,
    target: Option<&str>,
    detail: Option<String>,
) {
    let entry = AuditNew {
        time: now_ms(),
        actor,
        client: client.map(str::to_owned),
        action: action.to_owned(),
        target: target.map(str::to_owned),
        detail,
    };
    if let Err(error) = state.store.append_audit(entry).await {
        tracing::error!(%error, action, "could not write the audit log");
    }
}

/// [`record`] for an action a principal took.
pub async fn by(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    action: &str,
    target: Option<&str>,
    detail: Option<String>,
) {
    record(state, principal.actor(), client, action, target, detail).await;
}
