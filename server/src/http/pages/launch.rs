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
    /// "Fine-tune from here": the run, its checkpoint (a name the panel lists) and `lora` or
    /// `dpo`.
    from: Option<String>,
    checkpoint: Option<String>,
    method: Option<String>,
    /// The overrides box's text to start with.
    overrides: Option<String>,
    /// A model page's "Fine-tune": `NAME@ALIAS` or `NAME/VERSION`, a LoRA fine-tune of the
    /// checkpoint the version points at, with `training.init_from: model:<this>`.
    model: Option<String>,
}

/// The run and checkpoint a model reference (`NAME@ALIAS`, `NAME/VERSION`) picks now, once the
/// caller may read the model; a model or version that is not there, or one that is no
/// checkpoint, is not found in words that say which.
async fn model_checkpoint(
    state: &AppState,
    principal: &Principal,
    written: &str,
) -> Result<(String, String), PageError> {
    let reference = match crate::registry::ModelRef::parse("model", &format!("model:{written}")) {
        Some(Ok(r)) => r,
        Some(Err(e)) => return Err(PageError::BadRequest(format!("model: {}", e.message))),
        None => return Err(PageError::BadRequest("model: not a model reference".into())),
    };
    crate::access::require_model(state, principal, &reference.name, Level::Read)
        .await
        .map_err(crate::http::ApiError::from)?;
    let version = reference.resolve(&state.store).await?;
    match (
        crate::registry::parse_source("source", &version.source),
        version.run_id,
    ) {
        (Ok(crate::registry::Source::Checkpoint { name }), Some(run)) => Ok((run, name)),
        _ => Err(PageError::NotFound(format!(
            "version {} of model `{}` is {}, not a checkpoint to fine-tune",
            version.version, reference.name, version.source
        ))),
    }
}

/// The checkpoint a fine-tune starts from, once the caller may read its run: its directory
/// and saved config. A run or checkpoint the caller cannot see is not found.
async fn base_checkpoint(
    state: &AppState,
    principal: &Principal,
    run_id: &str,
    name: &str,
) -> Result<(std::path::PathBuf, trainer::config::Config), PageError> {
    super::check_run_id(run_id)?;
    crate::access::require_run(state, principal, run_id, Level::Read)
        .await
        .map_err(crate::http::ApiError::from)?;
    let run_dir = state.launcher.run_dir(run_id);
    let name = name.to_string();
    let found = tokio::task::spawn_blocking(move || {
        let (_, dir) = crate::checkpoints::find(&run_dir, &name)?;
        let source = trainer::checkpoint::resolve_for_reading(&dir).ok()?;
        let config = trainer::checkpoint::read_config(&source).ok()?;
        Some((dir, config))
    })
    .await
    .map_err(|e| PageError::Internal(e.to_string()))?;
    found.ok_or_else(|| PageError::NotFound(format!("run `{run_id}` has no such checkpoint")))
}

/// The form's YAML for a fine-tune of a checkpoint: its training and data keys, with
/// `training.init_from` set to it and LoRA or DPO switched on; no `model` section (the
/// checkpoint's is added at launch, see [`with_base_model`]).
fn finetune_yaml(
    run_name: &str,
    checkpoint: &str,
    init_from: String,
    method: &str,
    base: &trainer::config::Config,
) -> Result<String, PageError> {
    let mut training = base.training.clone();
    training.init_from = Some(init_from);
    training.curriculum.clear();
    let intro = match method {
        "dpo" => {
            training.objective = trainer::config::Objective::Dpo;
            training.dpo = trainer::config::DpoConfig::default();
            training.lora = Some(trainer::config::LoraConfig::default());
            "with DPO (LoRA adapters; data.dataset must be a JSONL file of {\"prompt\", \
             \"chosen\", \"rejected\"} records)"
        }
        _ => {
            training.objective = trainer::config::Objective::Lm;
            training.lora = Some(trainer::config::LoraConfig::default());
            "with LoRA"
        }
    };
    // The token cache is the server's (the base run's may have been anywhere).
    let data = trainer::config::DataConfig {
        cache_dir: trainer::config::DataConfig::default().cache_dir,
        ..base.data.clone()
    };
    let body = serde_json::json!({ "training": training, "data": data });
    let yaml = serde_yaml_ng::to_string(&body).map_err(|e| PageError::Internal(e.to_string()))?;
    Ok(format!(
        "# Fine-tune of run {run_name} from its checkpoint {checkpoint}, {intro}.\n\
         # The model is the checkpoint's: its model.* keys are added when you launch.\n{yaml}"
    ))
}

/// The form's YAML with the base checkpoint's `model` section under its own `model` keys (the
/// launch then checks those against the checkpoint and names one that differs). YAML that does
/// not parse is left as typed: the launch shows the syntax error at its line.
fn with_base_model(yaml: &str, base: &trainer::config::Config) -> Result<String, PageError> {
    let Ok(mut doc) = serde_yaml_ng::from_str::<serde_json::Value>(yaml) else {
        return Ok(yaml.to_string());
    };
    let Some(map) = doc.as_object_mut() else {
        return Ok(yaml.to_string());
    };
    let mut model =
        serde_json::to_value(&base.model).map_err(|e| PageError::Internal(e.to_string()))?;
    if let Some(typed) = map.remove("model") {
        overlay(&mut model, typed);
    }
    map.insert("model".to_string(), model);
    serde_yaml_ng::to_string(&doc).map_err(|e| PageError::Internal(e.to_string()))
}

/// `top`'s keys over `base`'s, section by section.
fn overlay(base: &mut serde_json::Value, top: serde_json::Value) {
    match (base, top) {
        (serde_json::Value::Object(b), serde_json::Value::Object(t)) => {
            for (k, v) in t {
                match b.get_mut(&k) {
                    Some(slot) => overlay(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, top) => *slot = top,
    }
}

/// The experiments the caller may launch into (EDIT or more), by name, and the one the form
/// starts with: that of the caller's most recent run among them, else `Default`.
async fn experiment_choices(
    state: &AppState,
    principal: &Principal,
) -> StoreResult<(Vec<String>, String)> {
    let editable =
        crate::access::experiments_at(state.store.as_ref(), principal, Level::Edit).await?;
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
    // A model page's fine-tune is the checkpoint's, started from the model reference.
    let mut p = p;
    let mut reference = None;
    if let Some(written) = p.model.clone().filter(|m| !m.trim().is_empty()) {
        let (run, checkpoint) = model_checkpoint(&state, &principal, written.trim()).await?;
        (p.from, p.checkpoint) = (Some(run), Some(checkpoint));
        reference = Some(format!("model:{}", written.trim()));
    }
    if let (Some(from), Some(checkpoint)) = (&p.from, &p.checkpoint) {
        let (dir, base) = base_checkpoint(&state, &principal, from, checkpoint).await?;
        let init_from = reference.unwrap_or_else(|| dir.display().to_string());
        let run = state.store.get_run(from).await?;
        let method = match p.method.as_deref() {
            Some("dpo") => "dpo",
            _ => "lora",
        };
        let (experiments, last) = experiment_choices(&state, &principal).await?;
        return html(LaunchPage {
            nav: "launch",
            profiles: profile_choices(DEFAULT_PROFILE),
            experiments,
            form: LaunchForm {
                profile: String::new(),
                experiment: last,
                name: format!("{}-{method}", run.name),
                gpus: 0,
                yaml: finetune_yaml(&run.name, checkpoint, init_from, method, &base)?,
                overrides: String::new(),
                from: from.clone(),
                checkpoint: checkpoint.clone(),
            },
            error: None,
            yaml_error_line: None,
            annotated: Vec::new(),
            overrides_annotated: Vec::new(),
        });
    }
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
            overrides: p.overrides.clone().unwrap_or_default(),
            from: String::new(),
            checkpoint: String::new(),
        },
        error: None,
        yaml_error_line: None,
        annotated: Vec::new(),
        overrides_annotated: Vec::new(),
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
    /// A fine-tune's base run and checkpoint (hidden fields of "Fine-tune from here").
    #[serde(default)]
    from: String,
    #[serde(default)]
    checkpoint: String,
}

/// A problem found before launching: the message, and the YAML line it belongs to if any.
struct Problem {
    message: String,
    line: Option<usize>,
    /// The key the refusal names, if any.
    field: Option<String>,
}

/// The 1-based line of the overrides box that a refusal belongs to: the override of the key it
/// names (overrides apply after the YAML, so theirs is the value refused), or the line it
/// quotes.
fn override_line(overrides: &str, field: Option<&str>, message: &str) -> Option<usize> {
    overrides.lines().enumerate().find_map(|(i, raw)| {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let key = line.split_once('=').map_or(line, |(k, _)| k.trim());
        let named = field.is_some_and(|f| f == key || f.strip_prefix("config.") == Some(key));
        let quoted = message.contains(&format!("`{line}`"));
        (named || quoted).then_some(i + 1)
    })
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
                field: Some("overrides".to_string()),
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
            field: Some("resources.gpus".to_string()),
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
    let mut fields = f;
    let yaml_typed = fields.yaml.clone();
    if !fields.from.is_empty() {
        let (_, base) =
            base_checkpoint(&state, &actor.principal, &fields.from, &fields.checkpoint).await?;
        fields.yaml = with_base_model(&fields.yaml, &base)?;
    }
    let problem = match request_of(&fields) {
        Err(problem) => problem,
        Ok(request) => match actions::launch_run(&state, &actor, request)
            .await
            .map_err(crate::http::ApiError::from)
        {
            Ok(run) => return Ok(Redirect::to(&format!("/runs/{}", run.id)).into_response()),
            Err(e) if e.status().is_client_error() => {
                let message = e.to_string();
                let field = e.field();
                Problem {
                    line: locate(&yaml_typed, field.as_deref(), &message),
                    message,
                    field,
                }
            }
            Err(e) => return Err(e.into()),
        },
    };
    let f = LaunchFields {
        yaml: yaml_typed,
        ..fields
    };
    let profile = if f.profile.is_empty() {
        DEFAULT_PROFILE.to_string()
    } else {
        f.profile.clone()
    };
    let (experiments, _) = experiment_choices(&state, &actor.principal).await?;
    // A mistake of an override is marked on the override's line, not the YAML's.
    let override_at = override_line(&f.overrides, problem.field.as_deref(), &problem.message);
    let yaml_line = if override_at.is_some() {
        None
    } else {
        problem.line
    };
    let page = LaunchPage {
        nav: "launch",
        profiles: profile_choices(&profile),
        experiments,
        annotated: annotate_yaml(&f.yaml, yaml_line, &problem.message),
        overrides_annotated: annotate_yaml(&f.overrides, override_at, &problem.message),
        yaml_error_line: yaml_line,
        error: Some(problem.message),
        form: LaunchForm {
            profile,
            experiment: f.experiment,
            name: f.name,
            gpus: f.gpus.trim().parse().unwrap_or(0),
            yaml: f.yaml,
            overrides: f.overrides,
            from: f.from,
            checkpoint: f.checkpoint,
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
            from: String::new(),
            checkpoint: String::new(),
        };
        let message = request_of(&fields).err().map(|p| p.message);
        assert!(message.is_some_and(|m| m.starts_with("overrides:")));
    }

    #[test]
    fn an_overrides_mistake_is_found_at_its_own_line() {
        let box_ = "# comment\ntraining.max_steps=5\ntraining.lernin_rate=0.1\n";
        assert_eq!(
            override_line(box_, Some("training.lernin_rate"), ""),
            Some(3)
        );
        assert_eq!(override_line(box_, Some("model.d_model"), ""), None);
        assert_eq!(
            override_line("a=1\nbroken", Some("overrides"), "`broken` is not"),
            Some(2)
        );
    }
}
