//! What the store keeps for access control: users, browser sessions, API tokens, teams, grants
//! of a level on an experiment, and the audit log. Secrets never come back out: a password is
//! stored as its argon2id hash, a session id and a token secret as their hash, and none of the
//! types here that reach an API answer carries one.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{Experiment, RunStatus, StoreResult};

/// What a caller may do in an experiment, in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    None,
    /// See its runs, charts, logs and checkpoints.
    Read,
    /// Also create, launch, stop, tag and report runs.
    Edit,
    /// Also grant levels, rename it, change its default level.
    Manage,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::Read => "read",
            Level::Edit => "edit",
            Level::Manage => "manage",
        }
    }

    pub fn parse(text: &str) -> Option<Level> {
        Some(match text.trim().to_ascii_lowercase().as_str() {
            "none" => Level::None,
            "read" => Level::Read,
            "edit" => Level::Edit,
            "manage" => Level::Manage,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct User {
    pub id: String,
    pub name: String,
    pub is_admin: bool,
    /// A disabled user cannot sign in, and their sessions and tokens do not work.
    pub disabled: bool,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Whether a password is set (the first administrator of an upgraded database has none
    /// until `trainyard user reset-password admin`).
    pub has_password: bool,
}

/// What a token may do: `read` only reads, `write` does what its user may, `run` reports one
/// launched run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenScope {
    Read,
    Write,
    Run,
}

impl TokenScope {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Read => "read",
            TokenScope::Write => "write",
            TokenScope::Run => "run",
        }
    }

    pub fn parse(text: &str) -> Option<TokenScope> {
        Some(match text {
            "read" => TokenScope::Read,
            "write" => TokenScope::Write,
            "run" => TokenScope::Run,
            _ => return None,
        })
    }
}

/// A token as listed: never its secret or the secret's hash.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ApiToken {
    pub id: String,
    pub name: String,
    /// `read`, `write` or `run`.
    #[schema(value_type = String)]
    #[serde(serialize_with = "scope_str")]
    pub scope: TokenScope,
    #[serde(skip)]
    pub user_id: Option<String>,
    #[serde(skip)]
    pub run_id: Option<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

fn scope_str<S: serde::Serializer>(scope: &TokenScope, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(scope.as_str())
}

pub struct TokenNew {
    pub id: String,
    pub secret_hash: String,
    pub user_id: Option<String>,
    pub run_id: Option<String>,
    pub name: String,
    pub scope: TokenScope,
    pub created_at: i64,
    pub expires_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub user_id: String,
    /// The hash of the session's CSRF token (`access::secret::hash_secret`).
    pub csrf_hash: String,
    pub created_at: i64,
    pub last_seen_at: i64,
    pub expires_at: i64,
}

pub struct SessionNew {
    pub id_hash: String,
    pub user_id: String,
    /// The hash of the session's CSRF token, never the token.
    pub csrf_hash: String,
    pub now: i64,
    pub expires_at: i64,
    pub client: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Team {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    /// Member user names, sorted.
    pub members: Vec<String>,
}

/// Who a grant is for.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Subject {
    User { id: String, name: String },
    Team { id: String, name: String },
}

impl Subject {
    /// `user alice`, `team vision`.
    pub fn label(&self) -> String {
        match self {
            Subject::User { name, .. } => format!("user {name}"),
            Subject::Team { name, .. } => format!("team {name}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Grant {
    pub subject: Subject,
    /// `read`, `edit` or `manage`.
    #[schema(value_type = String)]
    #[serde(serialize_with = "level_str")]
    pub level: Level,
}

fn level_str<S: serde::Serializer>(level: &Level, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(level.as_str())
}

/// An experiment's owner and the level every signed-in user has on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sharing {
    /// The owner's user name.
    pub owner: Option<String>,
    pub default_level: Level,
}

/// A run's experiment and status: what the access check needs of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunAccess {
    pub experiment_id: String,
    pub status: RunStatus,
    /// Whether the run is (soft-)deleted.
    pub deleted: bool,
    /// The id of the user who created it (none for the admin token or the local user).
    pub created_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AuditEntry {
    /// Increases with every entry.
    pub seq: i64,
    /// Unix milliseconds.
    pub time: i64,
    /// A user name, `admin-token`, `run:<id>`, `cli`, `local`; for a failed sign-in the name
    /// that was tried.
    pub actor: Option<String>,
    /// The client's address.
    pub client: Option<String>,
    pub action: String,
    pub target: Option<String>,
    pub detail: Option<String>,
}

pub struct AuditNew {
    pub time: i64,
    pub actor: Option<String>,
    pub client: Option<String>,
    pub action: String,
    pub target: Option<String>,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    pub actor: Option<String>,
    pub action: Option<String>,
    pub target: Option<String>,
    /// Inclusive, unix milliseconds.
    pub since: Option<i64>,
    /// Exclusive.
    pub until: Option<i64>,
    /// Entries with a smaller seq (the next page, newest first).
    pub before_seq: Option<i64>,
    pub limit: usize,
}

/// The access-control half of the store (a supertrait of `Store`).
#[async_trait]
pub trait Accounts: Send + Sync {
    // --- users ---
    /// A taken name is a conflict naming the field `name`.
    async fn create_user(
        &self,
        name: &str,
        password_hash: Option<&str>,
        is_admin: bool,
    ) -> StoreResult<User>;
    async fn get_user(&self, id: &str) -> StoreResult<User>;
    async fn user_by_name(&self, name: &str) -> StoreResult<Option<User>>;
    async fn list_users(&self) -> StoreResult<Vec<User>>;
    async fn password_hash(&self, user_id: &str) -> StoreResult<Option<String>>;
    /// Also ends every session of the user.
    async fn set_password(&self, user_id: &str, hash: &str, now: i64) -> StoreResult<()>;
    /// Disabling also ends every session of the user.
    async fn set_user_disabled(&self, user_id: &str, disabled: bool) -> StoreResult<()>;
    async fn set_user_admin(&self, user_id: &str, is_admin: bool) -> StoreResult<()>;

    // --- sessions ---
    async fn create_session(&self, new: SessionNew) -> StoreResult<()>;
    async fn session(&self, id_hash: &str) -> StoreResult<Option<(Session, User)>>;
    async fn touch_session(&self, id_hash: &str, now: i64) -> StoreResult<()>;
    async fn delete_session(&self, id_hash: &str) -> StoreResult<()>;

    // --- tokens ---
    async fn create_token(&self, new: TokenNew) -> StoreResult<ApiToken>;
    async fn token_by_hash(
        &self,
        secret_hash: &str,
    ) -> StoreResult<Option<(ApiToken, Option<User>)>>;
    async fn get_token(&self, id: &str) -> StoreResult<Option<ApiToken>>;
    /// A user's personal tokens, newest first.
    async fn list_tokens(&self, user_id: &str) -> StoreResult<Vec<ApiToken>>;
    async fn revoke_token(&self, id: &str, now: i64) -> StoreResult<()>;
    async fn revoke_run_tokens(&self, run_id: &str, now: i64) -> StoreResult<()>;
    async fn touch_token(&self, id: &str, now: i64) -> StoreResult<()>;

    // --- teams ---
    async fn create_team(&self, name: &str) -> StoreResult<Team>;
    async fn list_teams(&self) -> StoreResult<Vec<Team>>;
    /// By id, then by name.
    async fn get_team(&self, id_or_name: &str) -> StoreResult<Option<Team>>;
    async fn add_team_member(&self, team_id: &str, user_id: &str) -> StoreResult<()>;
    async fn remove_team_member(&self, team_id: &str, user_id: &str) -> StoreResult<()>;

    // --- experiments: owners, grants, levels ---
    /// Creates an experiment owned by `owner_id`, with `default_level` for everyone else.
    async fn create_experiment_owned(
        &self,
        name: &str,
        owner_id: Option<&str>,
        default_level: Level,
    ) -> StoreResult<Experiment>;
    /// Id or name; a name that does not exist is created like `create_experiment_owned`.
    async fn resolve_experiment_owned(
        &self,
        id_or_name: &str,
        owner_id: Option<&str>,
        default_level: Level,
    ) -> StoreResult<Experiment>;
    async fn rename_experiment(&self, id: &str, name: &str) -> StoreResult<()>;
    async fn experiment_sharing(&self, id: &str) -> StoreResult<Sharing>;
    async fn set_experiment_default_level(&self, id: &str, level: Level) -> StoreResult<()>;
    /// `subject_kind` is `user` or `team`; `Level::None` removes the grant.
    async fn set_grant(
        &self,
        experiment_id: &str,
        subject_kind: &str,
        subject_id: &str,
        level: Level,
    ) -> StoreResult<()>;
    async fn list_grants(&self, experiment_id: &str) -> StoreResult<Vec<Grant>>;
    /// The user's level on each experiment where it is above none: the highest of owner
    /// (MANAGE), the user's own grant, its teams' grants and the experiment's default level.
    async fn experiment_levels(&self, user_id: &str) -> StoreResult<BTreeMap<String, Level>>;
    async fn experiment_level(&self, user_id: &str, experiment_id: &str) -> StoreResult<Level>;
    /// The part of the user's level on the experiment given to them in particular: owner
    /// (MANAGE), the user's own grant and its teams' grants, not the experiment's default level.
    async fn granted_level(&self, user_id: &str, experiment_id: &str) -> StoreResult<Level>;
    async fn run_access(&self, run_id: &str) -> StoreResult<RunAccess>;
    /// Deletes a run with everything stored of it (points, tags, params, events, tokens).
    async fn delete_run(&self, run_id: &str) -> StoreResult<()>;

    // --- audit ---
    async fn append_audit(&self, entry: AuditNew) -> StoreResult<()>;
    /// Newest first.
    async fn list_audit(&self, query: &AuditQuery) -> StoreResult<Vec<AuditEntry>>;
}
