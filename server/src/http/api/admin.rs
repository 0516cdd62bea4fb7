//! Users, teams and the audit log: `/api/v1/users` and `/api/v1/audit` for administrators,
//! `/api/v1/teams` readable by every signed-in user (to grant to a team, one must see it).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, patch, put};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

use crate::access::audit::Actor;
use crate::access::Principal;
pub use crate::actions::admin::{
    audit_page, change, create_team, create_user, hash, set_membership, AuditPage, AuditParams,
    NewUserBody, UserChange,
};
use crate::app::AppState;
use crate::http::access::Client;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::store::accounts::{Team, User};

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
