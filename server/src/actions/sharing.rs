//! Who may do what in an experiment: its grants to users and teams, as the API
//! (`/api/v1/experiments/{id}/grants`) and the sharing page change them.

use serde::Deserialize;

use crate::access::audit::AuditAction;
use crate::access::{audit, Principal};
use crate::error::Error;
use crate::state::AppState;
use crate::store::accounts::Level;
use crate::store::Experiment;
use crate::validate::Invalid;

/// A level named in a request, at most `max`.
pub fn parse_level(field: &str, text: &str, max: Level) -> Result<Level, Invalid> {
    match Level::parse(text) {
        Some(level) if level <= max => Ok(level),
        _ => {
            let allowed = [Level::None, Level::Read, Level::Edit, Level::Manage]
                .into_iter()
                .filter(|l| *l <= max)
                .map(Level::as_str)
                .collect::<Vec<_>>()
                .join(", ");
            Err(Invalid::new(
                field,
                format!("{field} must be one of {allowed}, not `{text}`"),
            ))
        }
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantChange {
    /// A user name (give this or `team`).
    #[serde(default)]
    pub user: Option<String>,
    /// A team name (give this or `user`).
    #[serde(default)]
    pub team: Option<String>,
    /// `none` (removes the grant), `read`, `edit` or `manage`.
    pub level: String,
}

/// Applies a [`GrantChange`] (shared by the API and the sharing page).
pub async fn apply_grant(
    state: &AppState,
    principal: &Principal,
    client: Option<&str>,
    experiment: &Experiment,
    body: &GrantChange,
) -> Result<(), Error> {
    let level = parse_level("level", &body.level, Level::Manage)?;
    let (kind, subject_id, label) = match (&body.user, &body.team) {
        (Some(user), None) => {
            let u = state
                .store
                .user_by_name(user)
                .await?
                .ok_or_else(|| Error::NotFound(format!("no user named `{user}`")))?;
            ("user", u.id, format!("user {}", u.name))
        }
        (None, Some(team)) => {
            let t = state
                .store
                .get_team(team)
                .await?
                .ok_or_else(|| Error::NotFound(format!("no team `{team}`")))?;
            ("team", t.id, format!("team {}", t.name))
        }
        _ => return Err(Invalid::new("user", "name exactly one of `user` and `team`").into()),
    };
    state
        .store
        .set_grant(&experiment.id, kind, &subject_id, level)
        .await?;
    // Open streams of whoever lost access stop at once (`access::revocation`).
    state.access_epoch.bump();
    let detail = Some(format!("{label}: {}", level.as_str()));
    audit::by(
        state.store.as_ref(),
        principal,
        client,
        AuditAction::GrantSet,
        Some(&experiment.name),
        detail,
    )
    .await;
    Ok(())
}
