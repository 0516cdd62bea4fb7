//! Users, teams and the audit log, as administrators change and read them: the API
//! (`/api/v1/users`, `/api/v1/teams`, `/api/v1/audit`) and the admin pages alike.

use serde::{Deserialize, Serialize};

use crate::access::audit::Actor;
use crate::access::audit::AuditAction;
use crate::access::{audit, password, Principal};
use crate::error::Error;
use crate::state::AppState;
use crate::store::accounts::{AuditEntry, AuditQuery, Team, User};
use crate::store::now_ms;
use crate::validate::{Invalid, Name};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewUserBody {
    pub name: String,
    /// At least 8 characters.
    pub password: String,
    #[serde(default)]
    pub admin: bool,
}

/// Hashes a password off the async threads (argon2 takes tens of milliseconds on purpose).
pub async fn hash(password_text: &str) -> Result<String, Error> {
    password::check_strength(password_text).map_err(|reason| Invalid::new("password", reason))?;
    let text = password_text.to_owned();
    tokio::task::spawn_blocking(move || password::hash_password(&text))
        .await
        .map_err(Error::internal)?
        .map_err(|e| Error::Internal(anyhow::anyhow!("hashing a password: {e}")))
}

/// Adds a user (shared by the API and the users page).
pub async fn create_user(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    body: &NewUserBody,
) -> Result<User, Error> {
    let name = Name::parse("name", &body.name)?;
    let hash = hash(&body.password).await?;
    let user = state
        .store
        .create_user(name.as_str(), Some(&hash), body.admin)
        .await?;
    let detail = body.admin.then(|| "admin".to_owned());
    audit::by(
        state.store.as_ref(),
        principal,
        client,
        AuditAction::UserAdd,
        Some(&user.name),
        detail,
    )
    .await;
    Ok(user)
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserChange {
    /// A disabled user cannot sign in; their sessions, tokens and open event streams end, and
    /// their running sweeps are paused.
    #[serde(default)]
    pub disabled: Option<bool>,
    #[serde(default)]
    pub admin: Option<bool>,
    /// A new password; every session of the user ends.
    #[serde(default)]
    pub password: Option<String>,
}

/// Applies a [`UserChange`] (shared by the API and the users page).
pub async fn change(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    name: &str,
    body: &UserChange,
) -> Result<User, Error> {
    let user = state
        .store
        .user_by_name(name)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no user named `{name}`")))?;
    let who = Some(user.name.as_str());
    if let Some(text) = &body.password {
        let hash = hash(text).await?;
        state.store.set_password(&user.id, &hash, now_ms()).await?;
        // Their sessions ended: so do the streams those sessions opened.
        state.access_epoch.bump();
        audit::by(
            state.store.as_ref(),
            principal,
            client,
            AuditAction::UserPassword,
            who,
            None,
        )
        .await;
    }
    if let Some(disabled) = body.disabled {
        if disabled && principal.user_id() == Some(user.id.as_str()) {
            return Err(Invalid::new(
                "disabled",
                "you cannot disable yourself (another administrator can)",
            )
            .into());
        }
        state.store.set_user_disabled(&user.id, disabled).await?;
        let action = if disabled {
            AuditAction::UserDisable
        } else {
            AuditAction::UserEnable
        };
        audit::by(state.store.as_ref(), principal, client, action, who, None).await;
        if disabled {
            state.access_epoch.bump();
            let reason = format!("paused: its creator {} was disabled", user.name);
            for id in crate::sweeps::change::pause_sweeps_of(state, &user.id, &reason).await? {
                let detail = Some(reason.clone());
                audit::by(
                    state.store.as_ref(),
                    principal,
                    client,
                    AuditAction::SweepPause,
                    Some(&id),
                    detail,
                )
                .await;
            }
        }
    }
    if let Some(admin) = body.admin {
        state.store.set_user_admin(&user.id, admin).await?;
        state.access_epoch.bump();
        let detail = Some(if admin { "admin" } else { "not admin" }.to_owned());
        audit::by(
            state.store.as_ref(),
            principal,
            client,
            AuditAction::UserAdmin,
            who,
            detail,
        )
        .await;
    }
    Ok(state.store.get_user(&user.id).await?)
}

/// Creates a team (shared by the API and the users page).
pub async fn create_team(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    name: &str,
) -> Result<Team, Error> {
    let name = Name::parse("name", name)?;
    let team = state.store.create_team(name.as_str()).await?;
    audit::by(
        state.store.as_ref(),
        principal,
        client,
        AuditAction::TeamAdd,
        Some(&team.name),
        None,
    )
    .await;
    Ok(team)
}

async fn team_and_user(state: &AppState, team: &str, user: &str) -> Result<(Team, User), Error> {
    let team = state
        .store
        .get_team(team)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no team `{team}`")))?;
    let user = state
        .store
        .user_by_name(user)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no user named `{user}`")))?;
    Ok((team, user))
}

/// Adds a user to a team or removes them (shared by the API and the users page).
pub async fn set_membership(
    state: &AppState,
    actor: &Actor,
    team: &str,
    user: &str,
    member: bool,
) -> Result<(), Error> {
    let (team, user) = team_and_user(state, team, user).await?;
    let detail = if member {
        state.store.add_team_member(&team.id, &user.id).await?;
        format!("added {}", user.name)
    } else {
        state.store.remove_team_member(&team.id, &user.id).await?;
        state.access_epoch.bump();
        format!("removed {}", user.name)
    };
    actor
        .record(
            state.store.as_ref(),
            AuditAction::TeamMember,
            Some(&team.name),
            Some(detail),
        )
        .await;
    Ok(())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Only entries by this actor (a user name, `admin-token`, `run:<id>`, `cli`).
    pub actor: Option<String>,
    /// Only this action, e.g. `sign_in_failed`, `run_stop`, `grant_set`.
    pub action: Option<String>,
    /// Only entries about this target (a run id, user or experiment name).
    pub target: Option<String>,
    /// Unix milliseconds, inclusive.
    pub since: Option<i64>,
    /// Unix milliseconds, exclusive.
    pub until: Option<i64>,
    /// Entries older than this seq (the previous page's `next_before`).
    pub before: Option<i64>,
    /// 1..=1000, default 100.
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    /// Newest first.
    pub entries: Vec<AuditEntry>,
    /// Pass as `before` for the next (older) page; null on the last page.
    pub next_before: Option<i64>,
}

/// One page of the audit log (shared by the API and the audit page).
pub async fn audit_page(state: &AppState, params: AuditParams) -> Result<AuditPage, Error> {
    let limit = params.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(Error::Malformed {
            field: Some("limit".into()),
            message: "limit must be between 1 and 1000".into(),
        });
    }
    let query = AuditQuery {
        actor: params.actor.filter(|s| !s.is_empty()),
        action: params.action.filter(|s| !s.is_empty()),
        target: params.target.filter(|s| !s.is_empty()),
        since: params.since,
        until: params.until,
        before_seq: params.before,
        limit: limit + 1,
    };
    let mut entries = state.store.list_audit(&query).await?;
    let next_before = if entries.len() > limit {
        entries.truncate(limit);
        entries.last().map(|e| e.seq)
    } else {
        None
    };
    Ok(AuditPage {
        entries,
        next_before,
    })
}
