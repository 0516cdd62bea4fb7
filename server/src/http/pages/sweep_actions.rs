//! The sweep page's controls as plain forms: Pause, Resume, Stop and Change post here, go
//! through the use cases the API calls (`sweeps::change::{control, change}`) and redirect back
//! to the sweep's page; a refusal is shown on that page, at the control or the field it names,
//! with what was typed kept. `static/sweep.js` sends the same actions through the API instead.

use super::sweeps::{sweep_view, SweepPage};
use super::{PageError, PageResult};
use crate::access::audit::Actor;
use crate::app::AppState;
use crate::http::ApiError;
use crate::sweeps::change::{self, Control, SweepChange};
use crate::validate::Invalid;
use askama::Template;
use axum::extract::{Form, Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect};
use serde::Deserialize;

fn back(id: &str) -> PageResult {
    Ok(Redirect::to(&format!("/sweeps/{id}")).into_response())
}

/// The sweep page again with a refusal on it, answered with the refusal's status.
async fn refused(
    state: &AppState,
    actor: &Actor,
    id: &str,
    status: StatusCode,
    show: impl FnOnce(&mut SweepPage),
) -> PageResult {
    let mut page = sweep_view(state, &actor.principal, id).await?;
    show(&mut page);
    Ok((status, Html(page.render()?)).into_response())
}

/// A client's mistake the page shows in place; anything else (a sweep that is gone, a server
/// fault) is the usual error page.
fn in_place(e: &ApiError) -> bool {
    e.status().is_client_error() && e.status() != StatusCode::NOT_FOUND
}

async fn control(state: AppState, actor: Actor, id: String, what: Control) -> PageResult {
    match change::control(&state, &actor, &id, what)
        .await
        .map_err(ApiError::from)
    {
        Ok(_) => back(&id),
        Err(e) if in_place(&e) => {
            let message = e.to_string();
            refused(&state, &actor, &id, e.status(), |p| {
                p.action_error = message
            })
            .await
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn pause(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
) -> PageResult {
    control(state, actor, id, Control::Pause).await
}

pub(super) async fn resume(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
) -> PageResult {
    control(state, actor, id, Control::Resume).await
}

pub(super) async fn stop(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
) -> PageResult {
    control(state, actor, id, Control::Stop).await
}

/// The change form's fields, as typed.
#[derive(Debug, Deserialize)]
pub(super) struct ChangeFields {
    #[serde(default)]
    version: String,
    #[serde(default)]
    max_trials: String,
    #[serde(default)]
    parallel: String,
}

/// A number field: empty is "not given"; anything else must be a whole number.
fn number(field: &str, text: &str, what: &str) -> Result<Option<u32>, Invalid> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<u32>()
        .map(Some)
        .map_err(|_| Invalid::new(field, format!("{field}: give {what} as a whole number")))
}

/// The change the form asks for: the fields whose value differs from the sweep's now (the form
/// sends both; an unchanged one is no change).
fn requested(f: &ChangeFields, now: &SweepPage) -> Result<SweepChange, Invalid> {
    let max = number("max_trials", &f.max_trials, "the number of trials")?;
    let parallel = number("parallel", &f.parallel, "how many trials run at once")?;
    Ok(SweepChange {
        version: f.version.trim().parse().ok(),
        max_trials: max.filter(|&m| m != now.max_trials),
        parallel: parallel.filter(|&p| p != now.parallel),
        parameters: None,
    })
}

pub(super) async fn change_sweep(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
    Form(f): Form<ChangeFields>,
) -> PageResult {
    let now = sweep_view(&state, &actor.principal, &id).await?;
    let result = match requested(&f, &now) {
        Ok(request) => change::change(&state, &actor, &id, request)
            .await
            .map(|_| ())
            .map_err(ApiError::from),
        Err(invalid) => Err(ApiError::from(invalid)),
    };
    match result {
        Ok(()) => back(&id),
        Err(e) if in_place(&e) => {
            let (message, field) = (e.to_string(), e.field().unwrap_or_default());
            refused(&state, &actor, &id, e.status(), |p| {
                p.change.max_trials = f.max_trials.clone();
                p.change.parallel = f.parallel.clone();
                p.change.error = message;
                p.change.field = field;
            })
            .await
        }
        Err(e) => Err(PageError::from(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_field_names_itself_when_it_is_not_a_number() {
        assert_eq!(number("parallel", " 3 ", "x").ok().flatten(), Some(3));
        assert_eq!(number("parallel", "", "x").ok().flatten(), None);
        let e = number("max_trials", "ten", "the number of trials").unwrap_err();
        assert_eq!(e.field, "max_trials");
        assert!(e.message.starts_with("max_trials:"), "{}", e.message);
    }
}
