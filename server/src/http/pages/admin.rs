//! Administrators' pages: users and teams, and the audit log; and an experiment's sharing page
//! (who has which level), which its managers change.

use askama::Template;
use axum::extract::{Form, Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use axum::Extension;
use serde::Deserialize;

use super::{html, PageResult};
use crate::access::audit::Actor;
use crate::access::Principal;
use crate::actions::admin::{self, AuditParams, NewUserBody, UserChange};
use crate::actions::sharing::{apply_grant, GrantChange};
use crate::app::AppState;
use crate::http::access::Client;
use crate::store::accounts::{Level, Team, User};

#[derive(Template)]
#[template(path = "users.html")]
pub struct UsersPage {
    pub nav: &'static str,
    pub users: Vec<User>,
    pub teams: Vec<Team>,
    /// A refused team-membership change, shown in its team's row with what was typed.
    pub member_error: Option<MemberError>,
}

/// A refused change to a team's members: the team's row keeps the typed name and says why.
pub struct MemberError {
    pub team_id: String,
    pub user: String,
    pub message: String,
}

impl UsersPage {
    fn member_error_of(&self, team_id: &str) -> Option<&MemberError> {
        self.member_error.as_ref().filter(|e| e.team_id == team_id)
    }
}

pub(super) async fn users(State(state): State<AppState>) -> PageResult {
    html(UsersPage {
        nav: "users",
        users: state.store.list_users().await?,
        teams: state.store.list_teams().await?,
        member_error: None,
    })
}

/// A page answering a form's mistake: the same page, with the status the API would answer.
fn refused(status: axum::http::StatusCode, t: impl Template) -> PageResult {
    Ok((status, axum::response::Html(t.render()?)).into_response())
}

#[derive(Deserialize)]
pub(super) struct NewUserForm {
    name: String,
    password: String,
    #[serde(default)]
    admin: Option<String>,
}

pub(super) async fn add_user(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    Form(f): Form<NewUserForm>,
) -> PageResult {
    let body = NewUserBody {
        name: f.name,
        password: f.password,
        admin: f.admin.is_some(),
    };
    admin::create_user(&state, &principal, client.as_deref(), &body).await?;
    Ok(Redirect::to("/admin/users").into_response())
}

#[derive(Deserialize)]
pub(super) struct UserActionForm {
    /// `disable`, `enable`, `admin`, `not-admin` or `password`.
    action: String,
    #[serde(default)]
    password: String,
}

pub(super) async fn change_user(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    Path(name): Path<String>,
    Form(f): Form<UserActionForm>,
) -> PageResult {
    let mut change = UserChange {
        disabled: None,
        admin: None,
        password: None,
    };
    match f.action.as_str() {
        "disable" => change.disabled = Some(true),
        "enable" => change.disabled = Some(false),
        "admin" => change.admin = Some(true),
        "not-admin" => change.admin = Some(false),
        "password" => change.password = Some(f.password),
        other => {
            return Err(super::PageError::BadRequest(format!(
                "action: unknown action `{other}`"
            )))
        }
    }
    admin::change(&state, &principal, client.as_deref(), &name, &change).await?;
    Ok(Redirect::to("/admin/users").into_response())
}

#[derive(Deserialize)]
pub(super) struct TeamForm {
    name: String,
}

pub(super) async fn add_team(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    Form(f): Form<TeamForm>,
) -> PageResult {
    admin::create_team(&state, &principal, client.as_deref(), &f.name).await?;
    Ok(Redirect::to("/admin/users").into_response())
}

#[derive(Deserialize)]
pub(super) struct MemberForm {
    user: String,
    /// `add` or `remove`.
    #[serde(default)]
    action: String,
}

pub(super) async fn team_member(
    State(state): State<AppState>,
    actor: Actor,
    Path(team): Path<String>,
    Form(f): Form<MemberForm>,
) -> PageResult {
    let member = f.action != "remove";
    match admin::set_membership(&state, &actor, &team, &f.user, member)
        .await
        .map_err(crate::http::error::ApiError::from)
    {
        Ok(()) => Ok(Redirect::to("/admin/users").into_response()),
        // A mistake in the form (an unknown user) is answered in the team's row.
        Err(e)
            if e.status().is_client_error() && e.status() != axum::http::StatusCode::FORBIDDEN =>
        {
            let status = e.status();
            let teams = state.store.list_teams().await?;
            if !teams.iter().any(|t| t.id == team) {
                return Err(e.into());
            }
            refused(
                status,
                UsersPage {
                    nav: "users",
                    users: state.store.list_users().await?,
                    teams,
                    member_error: Some(MemberError {
                        team_id: team,
                        user: f.user,
                        message: e.to_string(),
                    }),
                },
            )
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Template)]
#[template(path = "audit.html")]
pub struct AuditView {
    pub nav: &'static str,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub rows: Vec<AuditRow>,
    pub older: Option<String>,
}

pub struct AuditRow {
    pub time: String,
    pub actor: String,
    pub client: String,
    pub action: String,
    pub target: String,
    pub detail: String,
}

#[derive(Deserialize, Default)]
pub(super) struct AuditForm {
    #[serde(default)]
    actor: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    target: String,
    #[serde(default)]
    before: Option<i64>,
}

pub(super) async fn audit(State(state): State<AppState>, Query(f): Query<AuditForm>) -> PageResult {
    let page = admin::audit_page(
        &state,
        AuditParams {
            actor: Some(f.actor.clone()),
            action: Some(f.action.clone()),
            target: Some(f.target.clone()),
            since: None,
            until: None,
            before: f.before,
            limit: Some(100),
        },
    )
    .await?;
    let dash = |s: Option<String>| s.unwrap_or_else(|| "—".into());
    let older = page.next_before.map(|seq| {
        let enc = |s: &str| super::views::enc(s);
        format!(
            "/admin/audit?actor={}&action={}&target={}&before={seq}",
            enc(&f.actor),
            enc(&f.action),
            enc(&f.target)
        )
    });
    html(AuditView {
        nav: "audit",
        rows: page
            .entries
            .into_iter()
            .map(|e| AuditRow {
                time: super::views::fmt_time(e.time),
                actor: dash(e.actor),
                client: dash(e.client),
                action: e.action,
                target: dash(e.target),
                detail: e.detail.unwrap_or_default(),
            })
            .collect(),
        actor: f.actor,
        action: f.action,
        target: f.target,
        older,
    })
}

#[derive(Template)]
#[template(path = "sharing.html")]
pub struct SharingPage {
    pub nav: &'static str,
    pub experiment_id: String,
    pub experiment: String,
    pub owner: String,
    pub default_level: &'static str,
    pub grants: Vec<(String, &'static str)>,
    /// Whether the caller may change the grants (MANAGE).
    pub manage: bool,
    /// The grant form as typed, and why it was refused (shown at the field it names).
    pub form: GrantFormView,
}

#[derive(Default)]
pub struct GrantFormView {
    pub subject: String,
    pub level: String,
    pub error: Option<String>,
    /// `subject` or `level`: where the error is shown.
    pub error_field: String,
}

pub(super) async fn sharing(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> PageResult {
    html(sharing_page(&state, &principal, &id, GrantFormView::default()).await?)
}

async fn sharing_page(
    state: &AppState,
    principal: &Principal,
    id: &str,
    form: GrantFormView,
) -> Result<SharingPage, super::PageError> {
    let experiment = state.store.get_experiment(id).await?;
    let sharing = state.store.experiment_sharing(&experiment.id).await?;
    let grants = state.store.list_grants(&experiment.id).await?;
    let manage = principal
        .level_on(state.store.as_ref(), &experiment.id)
        .await?
        >= Level::Manage;
    Ok(SharingPage {
        nav: "runs",
        experiment_id: experiment.id,
        experiment: experiment.name,
        owner: sharing.owner.unwrap_or_else(|| "—".into()),
        default_level: sharing.default_level.as_str(),
        grants: grants
            .into_iter()
            .map(|g| (g.subject.label(), g.level.as_str()))
            .collect(),
        manage,
        form,
    })
}

#[derive(Deserialize)]
pub(super) struct GrantForm {
    /// `user:NAME` or `team:NAME`.
    subject: String,
    level: String,
}

pub(super) async fn set_sharing(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Client(client): Client,
    Path(id): Path<String>,
    Form(f): Form<GrantForm>,
) -> PageResult {
    let experiment = state.store.get_experiment(&id).await?;
    let subject = f.subject.trim();
    let change = match subject.split_once(':') {
        Some(("user", name)) => GrantChange {
            user: Some(name.trim().to_owned()),
            team: None,
            level: f.level,
        },
        Some(("team", name)) => GrantChange {
            user: None,
            team: Some(name.trim().to_owned()),
            level: f.level,
        },
        _ => {
            let hint = if subject.is_empty() || subject.contains(':') {
                String::new()
            } else {
                format!(" (for example team:{subject} or user:{subject})")
            };
            let form = GrantFormView {
                error: Some(format!("write user:NAME or team:NAME{hint}")),
                error_field: "subject".into(),
                subject: f.subject,
                level: f.level,
            };
            let page = sharing_page(&state, &principal, &experiment.id, form).await?;
            return refused(axum::http::StatusCode::UNPROCESSABLE_ENTITY, page);
        }
    };
    match apply_grant(&state, &principal, client.as_deref(), &experiment, &change)
        .await
        .map_err(crate::http::error::ApiError::from)
    {
        Ok(()) => {
            Ok(Redirect::to(&format!("/experiments/{}/sharing", experiment.id)).into_response())
        }
        // A mistake in the form (no such user or team, a bad level) is answered at its field.
        Err(e)
            if e.status().is_client_error() && e.status() != axum::http::StatusCode::FORBIDDEN =>
        {
            let status = e.status();
            let field = e.field().unwrap_or_default();
            let form = GrantFormView {
                error: Some(e.to_string()),
                error_field: if field == "level" { "level" } else { "subject" }.into(),
                subject: f.subject,
                level: change.level,
            };
            let page = sharing_page(&state, &principal, &experiment.id, form).await?;
            refused(status, page)
        }
        Err(e) => Err(e.into()),
    }
}
