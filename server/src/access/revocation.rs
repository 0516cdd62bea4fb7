//! Revocation that reaches open streams. An event stream is checked once, when it opens, by the
//! access check every request passes; it then stays open for hours. So that a revoked token, a
//! disabled user, a signed-out session or a removed grant also ends what is already open:
//!
//! - every change that can take access away bumps the server's [`AccessEpoch`] (a `watch`
//!   channel: revoking a token, signing out, disabling a user or changing their password or
//!   administrator flag, a team membership, a grant or an experiment's default level);
//! - every open stream holds a [`StreamAccess`]: the principal it was opened with and what it
//!   shows. On a bump (and every [`RECHECK_EVERY`] in any case, for changes made by another
//!   process such as `trainyard user disable`) it re-reads the credential and runs the same
//!   access check the routes use (`access::decide`). A stream whose credential no longer holds,
//!   or whose run or sweep the caller may no longer read, ends; the stream of every run's status
//!   keeps going and leaves out the runs the caller may no longer read.
//!
//! Between bumps nothing is read from the store: a stream answers from its last check, and the
//! all-runs stream remembers the answer for each run it saw.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::principal::Via;
use super::{decide, Principal, Rule};
use crate::error::Error;
use crate::state::AppState;
use crate::store::accounts::Level;
use crate::store::{now_ms, StoreError, StoreResult};

pub use super::epoch::AccessEpoch;

/// An open stream re-checks at least this often, bumped or not.
pub const RECHECK_EVERY: Duration = Duration::from_secs(60);
/// Runs whose readability the all-runs stream remembers between two checks.
const REMEMBERED_RUNS: usize = 10_000;

/// What an open stream shows.
#[derive(Debug, Clone)]
pub enum Scope {
    /// The status of every run the caller may read (`/api/v1/events`).
    AllRuns,
    /// One run (its events, its log).
    Run(String),
    /// One sweep.
    Sweep(String),
}

/// The access of one open stream: the principal it was opened with, re-checked on every bump.
pub struct StreamAccess {
    state: AppState,
    principal: Principal,
    scope: Scope,
    epoch: watch::Receiver<u64>,
    next_recheck: Instant,
    /// Whether the caller may read each run seen since the last check (`Scope::AllRuns`).
    readable: HashMap<String, bool>,
    ended: bool,
}

impl StreamAccess {
    /// Starts watching. The first [`allowed`](Self::allowed) checks again, so a change made
    /// between the request's access check and this call is not missed.
    pub fn new(state: &AppState, principal: Principal, scope: Scope) -> StreamAccess {
        let mut epoch = state.access_epoch.subscribe();
        epoch.mark_changed();
        StreamAccess {
            state: state.clone(),
            principal,
            scope,
            epoch,
            next_recheck: Instant::now() + RECHECK_EVERY,
            readable: HashMap::new(),
            ended: false,
        }
    }

    /// Completes when the stream should check again: access changed somewhere, or the periodic
    /// check is due. Then call [`allowed`](Self::allowed).
    pub async fn changed(&mut self) {
        tokio::select! {
            changed = self.epoch.changed() => {
                if changed.is_ok() {
                    // `changed` marked the bump seen; `allowed` must still see it.
                    self.epoch.mark_changed();
                } else {
                    // The epoch lives as long as the server state: only the periodic check.
                    tokio::time::sleep_until(self.next_recheck).await;
                }
            }
            () = tokio::time::sleep_until(self.next_recheck) => {}
        }
    }

    /// Whether the stream may go on. Checks again when access changed since the last look (or
    /// the periodic check is due), else answers from the last check. Once false, always false.
    pub async fn allowed(&mut self) -> bool {
        if self.ended {
            return false;
        }
        let due = self.epoch.has_changed().unwrap_or(false) || Instant::now() >= self.next_recheck;
        if !due {
            return true;
        }
        // Marked before the check, so a change made while it runs leads to another one.
        self.epoch.mark_unchanged();
        self.next_recheck = Instant::now() + RECHECK_EVERY;
        self.readable.clear();
        match self.recheck().await {
            Ok(true) => true,
            Ok(false) => {
                tracing::info!(
                    actor = self.principal.actor().as_deref().unwrap_or("anonymous"),
                    scope = ?self.scope,
                    "an open event stream ends: its access was revoked"
                );
                self.ended = true;
                false
            }
            Err(error) => {
                // Closed, not open: the client reconnects and is checked like any request.
                tracing::warn!(%error, "an open event stream ends: its access could not be checked");
                self.ended = true;
                false
            }
        }
    }

    /// Whether events of run `run_id` may be sent on an all-runs stream (call
    /// [`allowed`](Self::allowed) first). Remembered until the next check.
    pub async fn may_read_run(&mut self, run_id: &str) -> bool {
        if let Some(known) = self.readable.get(run_id) {
            return *known;
        }
        let verdict = match check(&self.state, &self.principal, &Scope::Run(run_id.into())).await {
            Ok(may) => may,
            Err(error) => {
                tracing::warn!(%error, run_id, "cannot check a run's access for an event stream");
                return false;
            }
        };
        if self.readable.len() >= REMEMBERED_RUNS {
            self.readable.clear();
        }
        self.readable.insert(run_id.to_owned(), verdict);
        verdict
    }

    async fn recheck(&mut self) -> StoreResult<bool> {
        let Some(principal) = current(&self.state, &self.principal).await? else {
            return Ok(false);
        };
        self.principal = principal;
        check(&self.state, &self.principal, &self.scope).await
    }
}

/// The access check of the stream's route, for its scope.
async fn check(state: &AppState, principal: &Principal, scope: &Scope) -> StoreResult<bool> {
    let verdict = match scope {
        Scope::AllRuns => return Ok(true),
        Scope::Run(id) => decide(state, principal, Rule::Run(Level::Read), false, Some(id)).await,
        Scope::Sweep(id) => {
            decide(state, principal, Rule::Sweep(Level::Read), false, Some(id)).await
        }
    };
    match verdict {
        Ok(()) => Ok(true),
        Err(Error::Store(e)) => Err(e),
        Err(_) => Ok(false),
    }
}

/// The principal as it is now: `None` when its credential no longer holds (a revoked or
/// expired token, an ended session, a disabled or deleted user, a run that ended).
pub async fn current(state: &AppState, principal: &Principal) -> StoreResult<Option<Principal>> {
    let now = now_ms();
    match principal {
        Principal::Local | Principal::AdminToken | Principal::Anonymous => {
            Ok(Some(principal.clone()))
        }
        Principal::Run { run_id } => match state.store.run_access(run_id).await {
            Ok(run) if !run.status.is_terminal() => Ok(Some(principal.clone())),
            Ok(_) | Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        },
        Principal::User { user, via } => {
            if !state.settings.accounts_on() {
                return Ok(None);
            }
            let holds = match via {
                Via::Token { id, .. } => state.store.get_token(id).await?.is_some_and(|t| {
                    t.revoked_at.is_none() && t.expires_at.is_none_or(|at| at > now)
                }),
                Via::Session { id_hash, .. } => state
                    .store
                    .session(id_hash)
                    .await?
                    .is_some_and(|(session, _)| now < session.expires_at),
            };
            if !holds {
                return Ok(None);
            }
            let user = match state.store.get_user(&user.id).await {
                Ok(user) => user,
                Err(StoreError::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            if user.disabled {
                return Ok(None);
            }
            Ok(Some(Principal::User {
                user: Arc::new(user),
                via: via.clone(),
            }))
        }
    }
}
