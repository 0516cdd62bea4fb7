//! Writing the audit log: one call per event a lab would want to trace (sign-ins, tokens, run
//! creation, launch, stop, resume and deletion, grants, user and team changes), with the time,
//! the actor, the client address and the target. The log is append-only: the store offers no
//! way to change or delete an entry.

use super::principal::Principal;
use crate::store::accounts::AuditNew;
use crate::store::{now_ms, Store};

/// Every action the audit log records, in one place: its stored name (`as_str`) is what the
/// log's `action` column holds and `GET /api/v1/audit?action=` filters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditAction {
    SignIn,
    SignInFailed,
    TokenCreate,
    TokenRevoke,
    UserAdd,
    UserPassword,
    UserDisable,
    UserEnable,
    UserAdmin,
    TeamAdd,
    TeamMember,
    GrantSet,
    ExperimentCreate,
    ExperimentRename,
    ExperimentDelete,
    ExperimentRestore,
    RunCreate,
    RunLaunch,
    RunStop,
    RunMarkEnded,
    ModelCreate,
    ModelRename,
    ModelDelete,
    ModelAlias,
    ModelUnalias,
    ModelVersionCreate,
    ModelVersionDelete,
    RunResume,
    RunDelete,
    RunSoftDelete,
    RunRestore,
    SweepSubmit,
    SweepChange,
    SweepPause,
    SweepResume,
    SweepStop,
    SweepFail,
}

impl AuditAction {
    pub const ALL: [AuditAction; 37] = [
        AuditAction::SignIn,
        AuditAction::SignInFailed,
        AuditAction::TokenCreate,
        AuditAction::TokenRevoke,
        AuditAction::UserAdd,
        AuditAction::UserPassword,
        AuditAction::UserDisable,
        AuditAction::UserEnable,
        AuditAction::UserAdmin,
        AuditAction::TeamAdd,
        AuditAction::TeamMember,
        AuditAction::GrantSet,
        AuditAction::ExperimentCreate,
        AuditAction::ExperimentRename,
        AuditAction::ExperimentDelete,
        AuditAction::ExperimentRestore,
        AuditAction::RunCreate,
        AuditAction::RunLaunch,
        AuditAction::RunStop,
        AuditAction::RunMarkEnded,
        AuditAction::ModelCreate,
        AuditAction::ModelRename,
        AuditAction::ModelDelete,
        AuditAction::ModelAlias,
        AuditAction::ModelUnalias,
        AuditAction::ModelVersionCreate,
        AuditAction::ModelVersionDelete,
        AuditAction::RunResume,
        AuditAction::RunDelete,
        AuditAction::RunSoftDelete,
        AuditAction::RunRestore,
        AuditAction::SweepSubmit,
        AuditAction::SweepChange,
        AuditAction::SweepPause,
        AuditAction::SweepResume,
        AuditAction::SweepStop,
        AuditAction::SweepFail,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::SignIn => "sign_in",
            AuditAction::SignInFailed => "sign_in_failed",
            AuditAction::TokenCreate => "token_create",
            AuditAction::TokenRevoke => "token_revoke",
            AuditAction::UserAdd => "user_add",
            AuditAction::UserPassword => "user_password",
            AuditAction::UserDisable => "user_disable",
            AuditAction::UserEnable => "user_enable",
            AuditAction::UserAdmin => "user_admin",
            AuditAction::TeamAdd => "team_add",
            AuditAction::TeamMember => "team_member",
            AuditAction::GrantSet => "grant_set",
            AuditAction::ExperimentCreate => "experiment_create",
            AuditAction::ExperimentRename => "experiment_rename",
            AuditAction::ExperimentDelete => "experiment_delete",
            AuditAction::ExperimentRestore => "experiment_restore",
            AuditAction::RunCreate => "run_create",
            AuditAction::RunLaunch => "run_launch",
            AuditAction::RunStop => "run_stop",
            AuditAction::RunMarkEnded => "run_mark_ended",
            AuditAction::ModelCreate => "model_create",
            AuditAction::ModelRename => "model_rename",
            AuditAction::ModelDelete => "model_delete",
            AuditAction::ModelAlias => "model_alias",
            AuditAction::ModelUnalias => "model_unalias",
            AuditAction::ModelVersionCreate => "model_version_create",
            AuditAction::ModelVersionDelete => "model_version_delete",
            AuditAction::RunResume => "run_resume",
            AuditAction::RunDelete => "run_delete",
            AuditAction::RunSoftDelete => "run_soft_delete",
            AuditAction::RunRestore => "run_restore",
            AuditAction::SweepSubmit => "sweep_submit",
            AuditAction::SweepChange => "sweep_change",
            AuditAction::SweepPause => "sweep_pause",
            AuditAction::SweepResume => "sweep_resume",
            AuditAction::SweepStop => "sweep_stop",
            AuditAction::SweepFail => "sweep_fail",
        }
    }
}

/// Who does something, and from which address: the caller the access check resolved (a
/// handler's extractor, `http::access`). Behind a reverse proxy the address is the proxy's.
#[derive(Debug, Clone)]
pub struct Actor {
    pub principal: Principal,
    pub client: Option<String>,
}

impl Actor {
    /// Records an event done by this actor.
    pub async fn record(
        &self,
        store: &dyn Store,
        action: AuditAction,
        target: Option<&str>,
        detail: Option<String>,
    ) {
        let name = self.principal.actor();
        record(store, name, self.client.as_deref(), action, target, detail).await;
    }
}

/// Records an event. A failure to record is logged, not returned: the action itself already
/// happened and was committed.
pub async fn record(
    store: &dyn Store,
    actor: Option<String>,
    client: Option<&str>,
    action: AuditAction,
    target: Option<&str>,
    detail: Option<String>,
) {
    let entry = AuditNew {
        time: now_ms(),
        actor,
        client: client.map(str::to_owned),
        action: action.as_str().to_owned(),
        target: target.map(str::to_owned),
        detail,
    };
    if let Err(error) = store.append_audit(entry).await {
        tracing::error!(%error, action = action.as_str(), "could not write the audit log");
    }
}

/// [`record`] for an action a principal took from `client`.
pub async fn by(
    store: &dyn Store,
    principal: &Principal,
    client: Option<&str>,
    action: AuditAction,
    target: Option<&str>,
    detail: Option<String>,
) {
    record(store, principal.actor(), client, action, target, detail).await;
}

#[cfg(test)]
mod tests {
    use super::AuditAction;

    #[test]
    fn every_audit_action_has_its_own_stored_name() {
        let mut names: Vec<&str> = AuditAction::ALL.iter().map(|a| a.as_str()).collect();
        assert!(names
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), AuditAction::ALL.len());
    }
}
