//! Users, teams and the audit log: `/api/v1/users` and `/api/v1/audit` for administrators,
//! `/api/v1/teams` readable by every signed-in user (to grant to a team, one must see it).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, patch, put};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

use crate::access::audit::Actor;
use crate::access::{audit, password, Principal};
use crate::app::AppState;
use crate::http::access::Client;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::store::accounts::{AuditEntry, AuditQuery, Team, User};
use crate::store::now_ms;
use crate::validate::Name;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/users", get(list_users).post(add_user))
        .route("/users/{name}", patch(change_user))
        .route("/teams", get(list_teams).post(add_team))
        .route(
            "/teams/{id}/members/{user}",
            put(add_member).delete(remove_member),
        )
        .route("/audit", get(list_audit))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UserList {
    pub users: Vec<User>,
}

/// Every user.
#[utoipa::path(get, path = "/api/v1/users", tag = "admin",
    responses((status = 200, body = UserList)))]
pub async fn list_users(State(state): State<AppState>) -> Result<Json<UserList>, ApiError> {
    Ok(Json(UserList {
        users: state.store.list_users().await?,
    }))
}

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
pub async fn hash(password_text: &str) -> Result<String, ApiError> {
    password::check_strength(password_text)
        .map_err(|reason| ApiError::unprocessable("password", reason))?;
    let text = password_text.to_owned();
    tokio::task::spawn_blocking(move || password::hash_password(&text))
        .await
        .map_err(|e| ApiError::Internal(e.into()))?
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("hashing a password: {e}")))
}

/// Adds a user.
#[utoipa::path(post, path = "/api/v1/users", tag = "admin",
    request_body = NewUserBody,
    responses(
        (status = 201, body = User),
        (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, description = "Invalid name or too short a password", body = ErrorBody),
    ))]
pub async fn add_user(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    ApiJson(body): ApiJson<NewUserBody>,
) -> Result<(StatusCode, Json<User>), ApiError> {
    let user = create_user(&state, &principal, client.as_deref(), &body).await?;
    Ok((StatusCode::CREATED, Json(user)))
}

/// Adds a user (shared by the API and the users page).
pub async fn create_user(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    body: &NewUserBody,
) -> Result<User, ApiError> {
    let name = Name::parse("name", &body.name)?;
    let hash = hash(&body.password).await?;
    let user = state
        .store
        .create_user(name.as_str(), Some(&hash), body.admin)
        .await?;
    let detail = body.admin.then(|| "admin".to_owned());
    audit::by(
        state,
        principal,
        client,
        "user_add",
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

/// Disables or enables a user, makes them an administrator or not, or sets their password.
#[utoipa::path(patch, path = "/api/v1/users/{name}", tag = "admin",
    params(("name" = String, Path, description = "User name")),
    request_body = UserChange,
    responses(
        (status = 200, body = User),
        (status = 404, description = "No such user", body = ErrorBody),
        (status = 422, description = "Too short a password", body = ErrorBody),
    ))]
pub async fn change_user(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<UserChange>,
) -> Result<Json<User>, ApiError> {
    let user = change(&state, &principal, client.as_deref(), &name, &body).await?;
    Ok(Json(user))
}

/// Applies a [`UserChange`] (shared by the API and the users page).
pub async fn change(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    name: &str,
    body: &UserChange,
) -> Result<User, ApiError> {
    let user = state
        .store
        .user_by_name(name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no user named `{name}`")))?;
    let who = Some(user.name.as_str());
    if let Some(text) = &body.password {
        let hash = hash(text).await?;
        state.store.set_password(&user.id, &hash, now_ms()).await?;
        // Their sessions ended: so do the streams those sessions opened.
        state.access_epoch.bump();
        audit::by(state, principal, client, "user_password", who, None).await;
    }
    if let Some(disabled) = body.disabled {
        if disabled && principal.user_id() == Some(user.id.as_str()) {
            return Err(ApiError::unprocessable(
                "disabled",
                "you cannot disable yourself (another administrator can)",
            ));
        }
        state.store.set_user_disabled(&user.id, disabled).await?;
        let action = if disabled {
            "user_disable"
        } else {
            "user_enable"
        };
        audit::by(state, principal, client, action, who, None).await;
        if disabled {
            state.access_epoch.bump();
            let reason = format!("paused: its creator {} was disabled", user.name);
            for id in crate::sweeps::change::pause_sweeps_of(state, &user.id, &reason).await? {
                let detail = Some(reason.clone());
                audit::by(state, principal, client, "sweep_pause", Some(&id), detail).await;
            }
        }
    }
    if let Some(admin) = body.admin {
        state.store.set_user_admin(&user.id, admin).await?;
        state.access_epoch.bump();
        let detail = Some(if admin { "admin" } else { "not admin" }.to_owned());
        audit::by(state, principal, client, "user_admin", who, detail).await;
    }
    Ok(state.store.get_user(&user.id).await?)
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TeamList {
    pub teams: Vec<Team>,
}

/// Every team with its members.
#[utoipa::path(get, path = "/api/v1/teams", tag = "admin",
    responses((status = 200, body = TeamList)))]
pub async fn list_teams(State(state): State<AppState>) -> Result<Json<TeamList>, ApiError> {
    Ok(Json(TeamList {
        teams: state.store.list_teams().await?,
    }))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTeam {
    pub name: String,
}

/// Creates a team.
#[utoipa::path(post, path = "/api/v1/teams", tag = "admin",
    request_body = NewTeam,
    responses(
        (status = 201, body = Team),
        (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, description = "Invalid name", body = ErrorBody),
    ))]
pub async fn add_team(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    ApiJson(body): ApiJson<NewTeam>,
) -> Result<(StatusCode, Json<Team>), ApiError> {
    let team = create_team(&state, &principal, client.as_deref(), &body.name).await?;
    Ok((StatusCode::CREATED, Json(team)))
}

/// Creates a team (shared by the API and the users page).
pub async fn create_team(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    name: &str,
) -> Result<Team, ApiError> {
    let name = Name::parse("name", name)?;
    let team = state.store.create_team(name.as_str()).await?;
    audit::by(state, principal, client, "team_add", Some(&team.name), None).await;
    Ok(team)
}

async fn team_and_user(state: &AppState, team: &str, user: &str) -> Result<(Team, User), ApiError> {
    let team = state
        .store
        .get_team(team)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no team `{team}`")))?;
    let user = state
        .store
        .user_by_name(user)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no user named `{user}`")))?;
    Ok((team, user))
}

/// Adds a user to a team.
#[utoipa::path(put, path = "/api/v1/teams/{id}/members/{user}", tag = "admin",
    params(("id" = String, Path, description = "Team id or name"),
           ("user" = String, Path, description = "User name")),
    responses(
        (status = 204, description = "Added (or already a member)"),
        (status = 404, description = "No such team or user", body = ErrorBody),
    ))]
pub async fn add_member(
    State(state): State<AppState>,
    actor: Actor,
    Path((team, user)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    set_membership(&state, &actor, &team, &user, true).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Removes a user from a team.
#[utoipa::path(delete, path = "/api/v1/teams/{id}/members/{user}", tag = "admin",
    params(("id" = String, Path, description = "Team id or name"),
           ("user" = String, Path, description = "User name")),
    responses(
        (status = 204, description = "Removed (or was not a member)"),
        (status = 404, description = "No such team or user", body = ErrorBody),
    ))]
pub async fn remove_member(
    State(state): State<AppState>,
    actor: Actor,
    Path((team, user)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    set_membership(&state, &actor, &team, &user, false).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Adds a user to a team or removes them (shared by the API and the users page).
pub async fn set_membership(
    state: &AppState,
    actor: &Actor,
    team: &str,
    user: &str,
    member: bool,
) -> Result<(), ApiError> {
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
        .record(state, "team_member", Some(&team.name), Some(detail))
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

/// The audit log, newest first, filterable.
#[utoipa::path(get, path = "/api/v1/audit", tag = "admin",
    params(AuditParams),
    responses(
        (status = 200, body = AuditPage),
        (status = 400, description = "A parameter out of range", body = ErrorBody),
    ))]
pub async fn list_audit(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<AuditParams>,
) -> Result<Json<AuditPage>, ApiError> {
    Ok(Json(audit_page(&state, params).await?))
}

/// One page of the audit log (shared by the API and the audit page).
pub async fn audit_page(state: &AppState, params: AuditParams) -> Result<AuditPage, ApiError> {
    let limit = params.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request(
            "limit",
            "limit must be between 1 and 1000",
        ));
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
