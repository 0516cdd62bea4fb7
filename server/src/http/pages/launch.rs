//! The launch page: pick a profile, edit its YAML, add overrides and a GPU count, submit. The
//! config is checked here first (so errors show inline at the offending YAML line), then the run
//! is created through `POST /api/v1/runs`, which validates again and queues it for the launcher.

use super::views::*;
use super::{api_message, html, Dashboard, PageError, PageResult};
use axum::extract::{Form, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect};
use serde::Deserialize;
use trainer::config::{Config, ConfigError};

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

/// The `POST /api/v1/runs` body that creates a run the launcher starts.
pub fn launch_body(
    experiment: &str,
    name: Option<&str>,
    config: serde_json::Value,
    gpus: u32,
    relaunch_of: Option<&str>,
) -> serde_json::Value {
    let mut body = serde_json::json!({
        "experiment": experiment,
        "config": config,
        "launch": true,
        "resources": { "gpus": gpus },
    });
    if let Some(n) = name.filter(|n| !n.trim().is_empty()) {
        body["name"] = serde_json::Value::String(n.trim().to_string());
    }
    if let Some(of) = relaunch_of {
        body["tags"] = serde_json::json!({ "relaunch_of": of });
    }
    body
}

#[derive(Debug, Deserialize)]
pub struct ProfileParams {
    profile: Option<String>,
}

pub async fn form(Query(p): Query<ProfileParams>) -> PageResult {
    let profile = p.profile.unwrap_or_else(|| DEFAULT_PROFILE.to_string());
    let Some((_, yaml)) = profiles().iter().find(|(n, _)| *n == profile) else {
        let names: Vec<&str> = profiles().iter().map(|(n, _)| *n).collect();
        return Err(PageError::BadRequest(format!(
            "profile: unknown profile `{profile}`; expected one of {}",
            names.join(", ")
        )));
    };
    html(LaunchPage {
        nav: "launch",
        profiles: profile_choices(&profile),
        form: LaunchForm {
            profile: profile.clone(),
            experiment: "Default".to_string(),
            name: String::new(),
            gpus: 0,
            yaml: yaml.to_string(),
            overrides: String::new(),
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

fn check_config(yaml: &str, overrides: &[String]) -> Result<Config, Problem> {
    let located = |e: ConfigError| {
        let line = match &e {
            ConfigError::Syntax(m) => syntax_line(m),
            other => other.key().and_then(|k| line_of_field(yaml, k)),
        };
        Problem {
            message: e.to_string(),
            line,
        }
    };
    let mut cfg = Config::from_yaml_str(yaml).map_err(located)?;
    cfg.apply_overrides(overrides).map_err(|e| Problem {
        message: format!("overrides: {e}"),
        line: None,
    })?;
    cfg.validate().map_err(located)?;
    Ok(cfg)
}

pub async fn submit(State(d): State<Dashboard>, Form(f): Form<LaunchFields>) -> PageResult {
    let overrides: Vec<String> = f
        .overrides
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let gpus = match f.gpus.trim() {
        "" => Ok(0),
        g => g
            .parse::<u32>()
            .map_err(|_| format!("gpus: must be a whole number of GPUs, got `{g}`")),
    };
    let checked = match gpus {
        Err(message) => Err(Problem {
            message,
            line: None,
        }),
        Ok(gpus) => check_config(&f.yaml, &overrides).map(|cfg| (cfg, gpus)),
    };
    let problem = match checked {
        Ok((cfg, gpus)) => {
            let config =
                serde_json::to_value(&cfg).map_err(|e| PageError::Internal(e.to_string()))?;
            let experiment = if f.experiment.trim().is_empty() {
                "Default"
            } else {
                f.experiment.trim()
            };
            let body = launch_body(experiment, Some(&f.name), config, gpus, None);
            let (status, json) = d.call_api(Method::POST, "/api/v1/runs", Some(body)).await?;
            if status.is_success() {
                if let Some(id) = json.get("id").and_then(|v| v.as_str()) {
                    return Ok(Redirect::to(&format!("/runs/{id}")).into_response());
                }
                return Err(PageError::Internal(format!(
                    "launch answered without an id: {json}"
                )));
            }
            if status.is_server_error() {
                return Err(PageError::Internal(format!(
                    "launch failed with {status}: {json}"
                )));
            }
            let field = json.pointer("/error/field").and_then(|v| v.as_str());
            Problem {
                message: api_message(&json),
                line: field.and_then(|k| line_of_field(&f.yaml, k)),
            }
        }
        Err(p) => p,
    };
    let profile = if f.profile.is_empty() {
        DEFAULT_PROFILE.to_string()
    } else {
        f.profile.clone()
    };
    let page = LaunchPage {
        nav: "launch",
        profiles: profile_choices(&profile),
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
        let problem = check_config(yaml, &[]).err().map(|p| (p.line, p.message));
        let (line, message) = problem.unwrap_or((None, String::new()));
        assert!(
            message.contains("model."),
            "message names the key: {message}"
        );
        assert!(matches!(line, Some(2) | Some(3)), "line {line:?}");
    }

    #[test]
    fn an_unknown_key_is_located_at_its_line() {
        let yaml = "model:\n  d_model: 64\ntraining:\n  lernin_rate: 0.1\n";
        let p = check_config(yaml, &[]).err();
        assert_eq!(p.as_ref().and_then(|p| p.line), Some(4));
    }
}
