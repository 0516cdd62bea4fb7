//! The launch page: pick a profile, edit its YAML, add overrides and a GPU count, submit. The
//! form becomes the same `LaunchRequest` the API takes and goes through the same
//! `actions::launch_run`; a refusal is shown inline at the YAML line of the key it names.
//! The experiment is asked for, and starts as the one the user launched into last, so runs do
//! not pile up in the shared `Default` experiment.

use super::views::*;
use super::{html, PageError, PageResult};
use crate::access::audit::Actor;
use crate::access::Principal;
use crate::actions::{self, LaunchRequest, Resources};
use crate::app::AppState;
use crate::store::accounts::Level;
use crate::store::filter::{Attribute, CmpOp, Condition, Expr, Field, Filter, Literal, Predicate};
use crate::store::{Lifecycle, RunQuery, SortDir, SortKey, StoreResult, DEFAULT_EXPERIMENT};
use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect};
use axum::Extension;
use serde::Deserialize;
use std::collections::BTreeMap;

const DEFAULT_PROFILE: &str = "tiny";

fn profiles() -> &'static [(&'static str, &'static str)] {
    trainer::config::PROFILES
}

fn profile_choices(selected: &str) -> Vec<Choice> {
    profiles()
        .iter()
        .map(|(name, _)| Choice {
            value: name.to_string(),
            selected: *name == selected,
        })
        .collect()
}

/// A launch of `config` (YAML text or a JSON object) on `gpus` GPUs (0 = a CPU slot).
pub fn launch_request(
    experiment: &str,
    name: &str,
    config: serde_json::Value,
    gpus: usize,
) -> LaunchRequest {
    LaunchRequest {
        experiment: Some(experiment.to_string()),
        name: Some(name.to_string()).filter(|n| !n.trim().is_empty()),
        config: Some(config),
        resources: Some(Resources {
            gpus,
            ..Resources::default()
        }),
        ..Default::default()
    }
}

#[derive(Debug, Deserialize)]
pub struct ProfileParams {
    profile: Option<String>,
    /// The overrides box's text to start with (a model page's "Fine-tune" sets
    /// `training.init_from=model:NAME@ALIAS`).
    overrides: Option<String>,
}

/// The experiments the caller may launch into (EDIT or more), by name, and the one the form
/// starts with: that of the caller's most recent run among them, else `Default`.
async fn experiment_choices(
    state: &AppState,
    principal: &Principal,
) -> StoreResult<(Vec<String>, String)> {
    let editable = crate::access::experiments_at(state, principal, Level::Edit).await?;
    let mut experiments = state.store.list_experiments(Lifecycle::Active).await?;
    if let Some(ids) = &editable {
        experiments.retain(|e| ids.contains(&e.id));
    }
    let mine = principal.user().and_then(|user| {
        Filter::from_expr(Expr::Cond(Condition {
            field: Field::Attribute(Attribute::User),
            predicate: Predicate::Compare {
                op: CmpOp::Eq,
                value: Literal::Text(user.name.clone()),
            },
        }))
        .ok()
    });
    let mut last = None;
    if let Some(filter) = mine {
        let newest = RunQuery {
            experiment_id: None,
            status: None,
            tag: None,
            filter: Some(filter),
            sort: SortKey::CreatedAt,
            dir: SortDir::Desc,
            limit: 1,
            cursor: None,
            visible_experiments: Some(experiments.iter().map(|e| e.id.clone()).collect()),
            lifecycle: Lifecycle::Active,
        };
        let page = state.store.search_runs(&newest).await?;
        last = page.runs.first().and_then(|run| {
            experiments
                .iter()
                .find(|e| e.id == run.experiment_id)
                .map(|e| e.name.clone())
        });
    }
    let names = experiments.into_iter().map(|e| e.name).collect();
    Ok((
        names,
        last.unwrap_or_else(|| DEFAULT_EXPERIMENT.to_string()),
    ))
}

pub async fn form(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Query(p): Query<ProfileParams>,
) -> PageResult {
    let profile = p.profile.unwrap_or_else(|| DEFAULT_PROFILE.to_string());
    let Some((_, yaml)) = profiles().iter().find(|(n, _)| *n == profile) else {
        let names: Vec<&str> = profiles().iter().map(|(n, _)| *n).collect();
        return Err(PageError::BadRequest(format!(
            "profile: unknown profile `{profile}`; expected one of {}",
            names.join(", ")
        )));
    };
    let (experiments, last) = experiment_choices(&state, &principal).await?;
    html(LaunchPage {
        nav: "launch",
        profiles: profile_choices(&profile),
        experiments,
        form: LaunchForm {
            profile: profile.clone(),
            experiment: last,
            name: String::new(),
            gpus: 0,
            yaml: yaml.to_string(),
            overrides: p.overrides.unwrap_or_default(),
        },
        error: None,
        yaml_error_line: None,
        annotated: Vec::new(),
    })
}

#[derive(Debug, Deserialize)]
pub struct LaunchFields {
    #[serde(default)]
    profile: String,
    #[serde(default)]
    experiment: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    gpus: String,
    #[serde(default)]
    yaml: String,
    #[serde(default)]
    overrides: String,
}

/// A problem found before launching: the message, and the YAML line it belongs to if any.
struct Problem {
    message: String,
    line: Option<usize>,
}

/// The 1-based line a YAML syntax message points at (`... at line 3 column 5`).
fn syntax_line(message: &str) -> Option<usize> {
    let rest = &message[message.find("line ")? + 5..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The YAML line a refusal belongs to: where a syntax error points, else the line of the key
/// it names.
fn locate(yaml: &str, field: Option<&str>, message: &str) -> Option<usize> {
    match field {
        Some("config") => syntax_line(message),
        Some(key) => line_of_field(yaml, key),
        None => None,
    }
}

/// The form as the launch request the API takes: the YAML text as the config, each
/// `KEY=VALUE` line of the overrides box as one override.
fn request_of(f: &LaunchFields) -> Result<LaunchRequest, Problem> {
    let mut overrides = BTreeMap::new();
    for line in f
        .overrides
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let Some((key, value)) = line.split_once('=') else {
            return Err(Problem {
                message: format!("overrides: `{line}` is not of the form KEY=VALUE"),
                line: None,
            });
        };
        overrides.insert(
            key.trim().to_string(),
            serde_json::Value::String(value.trim().to_string()),
        );
    }
    let gpus = match f.gpus.trim() {
        "" => 0,
        g => g.parse::<usize>().map_err(|_| Problem {
            message: format!("resources.gpus: must be a whole number of GPUs, got `{g}`"),
            line: None,
        })?,
    };
    let experiment = match f.experiment.trim() {
        "" => DEFAULT_EXPERIMENT,
        e => e,
    };
    Ok(LaunchRequest {
        overrides,
        ..launch_request(
            experiment,
            &f.name,
            serde_json::Value::String(f.yaml.clone()),
            gpus,
        )
    })
}

pub async fn submit(
    State(state): State<AppState>,
    actor: Actor,
    Form(f): Form<LaunchFields>,
) -> PageResult {
    // Whether the caller may launch into that experiment comes before what is in the form.
    let experiment = Some(f.experiment.trim()).filter(|e| !e.is_empty());
    crate::access::may_add_runs(&state, &actor.principal, experiment)
        .await
        .map_err(crate::http::ApiError::from)?;
    let problem = match request_of(&f) {
        Err(problem) => problem,
        Ok(request) => match actions::launch_run(&state, &actor, request).await {
            Ok(run) => return Ok(Redirect::to(&format!("/runs/{}", run.id)).into_response()),
            Err(e) if e.status().is_client_error() => {
                let message = e.to_string();
                Problem {
                    line: locate(&f.yaml, e.field().as_deref(), &message),
                    message,
                }
            }
            Err(e) => return Err(e.into()),
        },
    };
    let profile = if f.profile.is_empty() {
        DEFAULT_PROFILE.to_string()
    } else {
        f.profile.clone()
    };
    let (experiments, _) = experiment_choices(&state, &actor.principal).await?;
    let page = LaunchPage {
        nav: "launch",
        profiles: profile_choices(&profile),
        experiments,
        annotated: annotate_yaml(&f.yaml, problem.line, &problem.message),
        yaml_error_line: problem.line,
        error: Some(problem.message),
        form: LaunchForm {
            profile,
            experiment: f.experiment,
            name: f.name,
            gpus: f.gpus.trim().parse().unwrap_or(0),
            yaml: f.yaml,
            overrides: f.overrides,
        },
    };
    let body = page.render_html()?;
    Ok((StatusCode::UNPROCESSABLE_ENTITY, body).into_response())
}

impl LaunchPage {
    fn render_html(&self) -> Result<axum::response::Html<String>, PageError> {
        use askama::Template;
        Ok(axum::response::Html(self.render()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_of_refusal(yaml: &str) -> (Option<usize>, String) {
        let req = launch_request("Default", "", serde_json::Value::String(yaml.into()), 0);
        match actions::launch::resolve_config(&req) {
            Err(e) => (locate(yaml, Some(&e.field), &e.message), e.message),
            Ok(_) => (None, String::new()),
        }
    }

    #[test]
    fn a_yaml_syntax_message_yields_its_line() {
        assert_eq!(
            syntax_line("mapping values are not allowed at line 3 column 9"),
            Some(3)
        );
        assert_eq!(syntax_line("no position here"), None);
    }

    #[test]
    fn an_invalid_value_is_located_at_its_key_line() {
        let yaml = "model:\n  d_model: 64\n  n_heads: 5\ntraining:\n  max_steps: 10\n";
        let (line, message) = line_of_refusal(yaml);
        assert!(
            message.contains("model."),
            "message names the key: {message}"
        );
        assert!(matches!(line, Some(2) | Some(3)), "line {line:?}");
    }

    #[test]
    fn an_unknown_key_is_located_at_its_line() {
        let yaml = "model:\n  d_model: 64\ntraining:\n  lernin_rate: 0.1\n";
        assert_eq!(line_of_refusal(yaml).0, Some(4));
    }

    #[test]
    fn an_override_line_without_an_equals_sign_is_refused() {
        let fields = LaunchFields {
            profile: String::new(),
            experiment: String::new(),
            name: String::new(),
            gpus: String::new(),
            yaml: String::new(),
            overrides: "training.max_steps 5".into(),
        };
        let message = request_of(&fields).err().map(|p| p.message);
        assert!(message.is_some_and(|m| m.starts_with("overrides:")));
    }
}
