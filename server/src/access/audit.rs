//! Writing the audit log: one call per event a lab would want to trace (sign-ins, tokens, run
//! creation, launch, stop, resume and deletion, grants, user and team changes), with the time,
//! the actor, the client address and the target. The log is append-only: the store offers no
//! way to change or delete an entry.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::Principal;
use crate::app::AppState;
use crate::http::access::Client;
use crate::http::ApiError;
use crate::store::accounts::AuditNew;
use crate::store::now_ms;

/// Who does something, and from which address: the caller the access check resolved, as a
/// handler's extractor. Behind a reverse proxy the address is the proxy's.
#[derive(Debug, Clone)]
pub struct Actor {
    pub principal: Principal,
    pub client: Option<String>,
}

impl Actor {
    /// Records an event done by this actor.
    pub async fn record(
        &self,
        state: &AppState,
        action: &str,
        target: Option<&str>,
        detail: Option<String>,
    ) {
        let name = self.principal.actor();
        record(state, name, self.client.as_deref(), action, target, detail).await;
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let principal = parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or_else(|| {
                ApiError::Internal(anyhow::anyhow!("a handler ran without the access check"))
            })?;
        let Ok(Client(client)) = Client::from_request_parts(parts, state).await;
        Ok(Actor { principal, client })
    }
}

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

/// [`record`] for an action a principal took from `client`.
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
