//! The sweep pages: the list of sweeps, one sweep (its header and trials table rendered here,
//! made live and charted by `static/sweep.js` from the sweep's event stream), and the form that
//! submits a new sweep. Pages read sweeps through the same functions the API answers with
//! (`sweeps::view::{list, detail}`, `sweeps::admit::submit`), so a page and the API never
//! disagree on what a sweep is or which sweeps a caller may see.
//!
//! The view structs live here rather than in `views.rs`, which is at its size budget.

use super::sweep_around::{spec_around, Around};
use super::views::{annotate_yaml, fmt_time, fmt_value, line_of_field, AnnotatedLine};
use super::{check_run_id, html, PageError, PageResult};
use crate::access::audit::Actor;
use crate::access::Principal;
use crate::app::AppState;
use crate::http::ApiError;
use crate::store::accounts::Level;
use crate::sweeps::view::{self, SweepDetail, TrialCounts};
use askama::Template;
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect};
use axum::Extension;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

// ---------------------------------------------------------------------------------------------
// Views

pub struct SweepListRow {
    pub id: String,
    pub name: String,
    pub experiment_id: String,
    pub experiment: String,
    pub state: &'static str,
    pub method: String,
    pub metric: String,
    pub goal: String,
    /// Trials that ended (complete, pruned, failed, stopped).
    pub done: usize,
    pub total: usize,
    pub max_trials: u32,
    pub best: String,
    pub created: String,
}

#[derive(Template)]
#[template(path = "sweeps.html")]
pub struct SweepsPage {
    pub nav: &'static str,
    pub rows: Vec<SweepListRow>,
    /// The experiment the list is limited to (its name), if any.
    pub experiment: String,
}

pub struct TrialLine {
    pub number: i64,
    pub run_id: Option<String>,
    pub state: &'static str,
    /// One cell per parameter column, in `SweepPage::params` order.
    pub params: Vec<String>,
    pub value: String,
    /// `value` is the latest point of a trial that has not ended, not its final value.
    pub latest: bool,
    pub step: String,
    pub next_rung: String,
    pub reason: String,
}

pub struct VersionLine {
    pub version: i64,
    pub changed_at: String,
    pub changed_by: String,
    pub changes: Vec<String>,
}

pub struct BestLine {
    pub number: i64,
    pub run_id: Option<String>,
    pub value: String,
}

#[derive(Template)]
#[template(path = "sweep.html")]
pub struct SweepPage {
    pub nav: &'static str,
    pub id: String,
    pub name: String,
    pub state: &'static str,
    pub message: String,
    pub experiment_id: String,
    pub experiment: String,
    pub method: String,
    pub metric: String,
    pub goal: String,
    pub early_terminate: String,
    pub max_trials: u32,
    pub parallel: u32,
    pub counts: TrialCounts,
    pub best: Option<BestLine>,
    pub version: i64,
    pub versions: Vec<VersionLine>,
    /// The parameter columns: every searched key, sorted (`static/sweep.js` sorts the same way).
    pub params: Vec<String>,
    pub trials: Vec<TrialLine>,
    /// Pause, resume, stop and change need EDIT on the sweep's experiment.
    pub can_edit: bool,
    /// Why the last pause, resume or stop was refused (the page answered without JavaScript).
    pub action_error: String,
    pub change: ChangeForm,
}

/// The change form as shown: the sweep's values, or after a refusal what was typed, with the
/// refusal and the field it names.
#[derive(Debug, Clone, Default)]
pub struct ChangeForm {
    pub max_trials: String,
    pub parallel: String,
    pub error: String,
    pub field: String,
}

impl SweepPage {
    pub fn running(&self) -> bool {
        self.state == "running"
    }
    pub fn paused(&self) -> bool {
        self.state == "paused"
    }
    pub fn over(&self) -> bool {
        !self.running() && !self.paused()
    }
}

#[derive(Template)]
#[template(path = "sweep_new.html")]
pub struct SweepNewPage {
    pub nav: &'static str,
    pub spec: String,
    /// Where the prefilled spec came from ("Sweep around this run"), for the subtitle.
    pub from: Option<(String, String)>,
    pub error: Option<String>,
    /// The spec key the refusal names (`parameters.training.learning_rate`).
    pub error_field: String,
    pub error_line: Option<usize>,
    pub annotated: Vec<AnnotatedLine>,
}

// ---------------------------------------------------------------------------------------------
// The list

#[derive(Debug, Deserialize)]
pub struct ListParams {
    experiment: Option<String>,
}

#[tracing::instrument(skip(state, principal))]
pub(super) async fn sweeps_page(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Query(p): Query<ListParams>,
) -> PageResult {
    let experiment = p.experiment.filter(|e| !e.trim().is_empty());
    let sweeps = crate::sweeps::view::list(&state, &principal, experiment.as_deref()).await?;
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut rows = Vec::with_capacity(sweeps.len());
    for s in sweeps {
        if !names.contains_key(&s.experiment_id) {
            let name = match state.store.get_experiment(&s.experiment_id).await {
                Ok(e) => e.name,
                Err(_) => s.experiment_id.clone(),
            };
            names.insert(s.experiment_id.clone(), name);
        }
        let t = &s.trials;
        rows.push(SweepListRow {
            experiment: names.get(&s.experiment_id).cloned().unwrap_or_default(),
            state: s.state.as_str(),
            done: t.complete + t.pruned + t.failed + t.stopped,
            total: t.total,
            max_trials: s.max_trials,
            best: s
                .best
                .as_ref()
                .map(|b| fmt_value(b.value))
                .unwrap_or_else(|| "–".into()),
            created: fmt_time(s.created_at),
            id: s.id,
            name: s.name,
            experiment_id: s.experiment_id,
            method: s.method,
            metric: s.metric,
            goal: s.goal,
        });
    }
    html(SweepsPage {
        nav: "sweeps",
        rows,
        experiment: experiment.unwrap_or_default(),
    })
}

// ---------------------------------------------------------------------------------------------
// One sweep

/// A parameter value as a table cell: numbers as the pages print metric values, text as it is.
fn param_cell(v: Option<&serde_json::Value>) -> String {
    match v {
        None | Some(serde_json::Value::Null) => "–".into(),
        Some(serde_json::Value::Number(n)) => n.as_f64().map(fmt_value).unwrap_or_default(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Every parameter key of the spec and of the trials (a key can leave the spec in a change while
/// old trials still have it), sorted.
pub fn param_columns(detail: &SweepDetail) -> Vec<String> {
    let mut keys: BTreeSet<String> = detail
        .spec
        .get("parameters")
        .and_then(|p| p.as_object())
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    for t in &detail.trials {
        keys.extend(t.params.keys().cloned());
    }
    keys.into_iter().collect()
}

#[tracing::instrument(skip(state, principal))]
pub(super) async fn sweep_page(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> PageResult {
    html(sweep_view(&state, &principal, &id).await?)
}

/// The sweep page as `principal` sees it now (the page's controls answer a refusal with it).
pub(super) async fn sweep_view(
    state: &AppState,
    principal: &Principal,
    id: &str,
) -> Result<SweepPage, PageError> {
    let d = view::detail(state, id).await?;
    // The actions offered are those the access check would let through (in the shared
    // experiment, others' sweeps are read-only).
    let level = match principal.may_write() {
        true => {
            let row = state.store.get_sweep(id).await?;
            crate::access::level_on_sweep(state, principal, &row).await?
        }
        false => Level::Read,
    };
    let experiment = match state.store.get_experiment(&d.summary.experiment_id).await {
        Ok(e) => e.name,
        Err(_) => d.summary.experiment_id.clone(),
    };
    let params = param_columns(&d);
    let trials = d
        .trials
        .iter()
        .map(|t| TrialLine {
            number: t.number,
            run_id: t.run_id.clone(),
            state: t.state.as_str(),
            params: params.iter().map(|k| param_cell(t.params.get(k))).collect(),
            // The server records a trial's value when it ends; until then the page shows the
            // latest point of its curve, as static/sweep/table.js does.
            value: t
                .value
                .or_else(|| t.curve.last().map(|p| p[1]))
                .map(fmt_value)
                .unwrap_or_else(|| "–".into()),
            latest: t.value.is_none() && !t.curve.is_empty(),
            step: t.step.map(|s| s.to_string()).unwrap_or_else(|| "–".into()),
            next_rung: t
                .next_rung
                .map(|s| s.to_string())
                .unwrap_or_else(|| "–".into()),
            reason: t.reason.clone().unwrap_or_default(),
        })
        .collect();
    let versions = d
        .versions
        .iter()
        .rev()
        .map(|v| VersionLine {
            version: v.version,
            changed_at: fmt_time(v.changed_at),
            changed_by: v.changed_by.clone().unwrap_or_default(),
            changes: v.changes.clone(),
        })
        .collect();
    let s = d.summary;
    Ok(SweepPage {
        nav: "sweeps",
        state: s.state.as_str(),
        message: s.message.unwrap_or_default(),
        experiment,
        best: s.best.map(|b| BestLine {
            number: b.number,
            run_id: b.run_id,
            value: fmt_value(b.value),
        }),
        can_edit: level >= Level::Edit,
        action_error: String::new(),
        change: ChangeForm {
            max_trials: s.max_trials.to_string(),
            parallel: s.parallel.to_string(),
            ..ChangeForm::default()
        },
        id: s.id,
        name: s.name,
        experiment_id: s.experiment_id,
        method: s.method,
        metric: s.metric,
        goal: s.goal,
        early_terminate: s.early_terminate,
        max_trials: s.max_trials,
        parallel: s.parallel,
        counts: s.trials,
        version: s.version,
        versions,
        params,
        trials,
    })
}

// ---------------------------------------------------------------------------------------------
// A new sweep

/// The form's starting spec: a small search on the `tiny` profile that runs on any CPU.
pub const EXAMPLE_SPEC: &str = "\
# A sweep over the `tiny` profile on CPU (each trial trains a 2-layer byte-level GPT in seconds).
# Keys are documented in docs/sweeps.md (Spec reference).
name: tiny-lr-dropout
experiment: sweeps
base:
  profile: tiny
  overrides: {training.max_steps: 200, training.eval_steps: 50}
metric: {name: val/loss, goal: minimize}
method: tpe            # auto | bayes | tpe | random | grid
parameters:
  training.learning_rate: {distribution: log_uniform, min: 3.0e-4, max: 1.0e-2}
  model.dropout: {distribution: uniform, min: 0.0, max: 0.2}
  training.warmup_steps: {values: [0, 10, 50]}
early_terminate: {type: asha, min_steps: 50, reduction_factor: 3}
max_trials: 12
parallel: 2
resources: {gpus: 0}
seed: 1
";

#[derive(Debug, Deserialize)]
pub struct NewParams {
    from: Option<String>,
}

pub(super) async fn new_sweep_form(
    State(state): State<AppState>,
    Query(p): Query<NewParams>,
) -> PageResult {
    let (spec, from) = match p.from.as_deref().map(str::trim).filter(|f| !f.is_empty()) {
        None => (EXAMPLE_SPEC.to_string(), None),
        Some(run_id) => {
            check_run_id(run_id)?;
            let run = state.store.get_run(run_id).await?;
            let Some(config) = run.config.as_ref() else {
                return Err(PageError::Refused(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "from: this run has no recorded config to sweep around".into(),
                ));
            };
            let experiment = state.store.get_experiment(&run.experiment_id).await?;
            let keys: Vec<String> = state
                .store
                .metric_keys(run_id)
                .await?
                .into_iter()
                .map(|k| k.key)
                .collect();
            let gpus = run
                .tags
                .get("gpus")
                .and_then(|g| g.parse::<u32>().ok())
                .unwrap_or(0);
            let around = Around {
                run_id: &run.id,
                run_name: &run.name,
                experiment: &experiment.name,
                config,
                metric_keys: &keys,
                gpus,
            };
            (
                spec_around(&around),
                Some((run.id.clone(), run.name.clone())),
            )
        }
    };
    html(SweepNewPage {
        nav: "sweeps",
        spec,
        from,
        error: None,
        error_field: String::new(),
        error_line: None,
        annotated: Vec::new(),
    })
}

#[derive(Debug, Deserialize)]
pub struct NewFields {
    #[serde(default)]
    spec: String,
    /// The run the spec was prefilled from, kept through a refusal for the subtitle.
    #[serde(default)]
    from: String,
    #[serde(default)]
    from_name: String,
}

pub(super) async fn submit_sweep(
    State(state): State<AppState>,
    actor: Actor,
    Form(f): Form<NewFields>,
) -> PageResult {
    let body = serde_json::Value::String(f.spec.clone());
    let e = match crate::sweeps::admit::submit(&state, &actor, &body)
        .await
        .map_err(ApiError::from)
    {
        Ok(detail) => {
            return Ok(Redirect::to(&format!("/sweeps/{}", detail.summary.id)).into_response())
        }
        Err(e) if e.status().is_client_error() => e,
        Err(e) => return Err(e.into()),
    };
    let message = e.to_string();
    let field = e.field().unwrap_or_default();
    // A message that does not start with its field gets it, so the refusal always names the
    // parameter or key at fault.
    let message = if field.is_empty() || message.starts_with(&field) {
        message
    } else {
        format!("{field}: {message}")
    };
    let line = locate(&f.spec, &field, &message);
    // The lines around the one at fault, numbered, above the editor: the spec stays editable
    // in full below.
    let mut annotated = annotate_yaml(&f.spec, line, &message);
    if let Some(bad) = line {
        annotated.retain(|l| l.number.abs_diff(bad) <= EXCERPT_LINES);
    }
    let page = SweepNewPage {
        nav: "sweeps",
        annotated,
        from: Some((f.from, f.from_name)).filter(|(id, _)| !id.is_empty()),
        spec: f.spec,
        error: Some(message),
        error_field: field,
        error_line: line,
    };
    Ok((e.status(), Html(page.render()?)).into_response())
}

/// Lines shown on each side of the line a refusal is located at.
const EXCERPT_LINES: usize = 3;

/// The 1-based line a YAML syntax message points at (`... at line 3 column 5`).
fn syntax_line(message: &str) -> Option<usize> {
    let rest = &message[message.find("line ")? + 5..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The spec line a refusal belongs to: where a YAML syntax error points, else the line of the
/// key its field names (`parameters.training.learning_rate.min` is shown on the
/// `training.learning_rate:` line under `parameters:`).
fn locate(spec: &str, field: &str, message: &str) -> Option<usize> {
    match field {
        "" => None,
        "spec" => syntax_line(message),
        key => line_of_field(spec, key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_spec_parses() {
        let body = serde_json::Value::String(EXAMPLE_SPEC.into());
        let (_, spec) = crate::sweeps::admit::parse(&body).expect("example spec");
        assert_eq!(spec.base.profile.as_deref(), Some("tiny"));
        assert_eq!(spec.resources.gpus, 0);
    }

    #[test]
    fn a_refusal_is_located_at_its_parameter_line() {
        let spec = "name: x\nbase: {profile: tiny}\nparameters:\n  model.dropout: {values: [0.1]}\n  training.learning_rate: {distribution: log_uniform, min: 0, max: 1}\n";
        assert_eq!(
            locate(spec, "parameters.training.learning_rate.min", ""),
            Some(5)
        );
        assert_eq!(
            locate(spec, "spec", "did not find expected key at line 3 column 2"),
            Some(3)
        );
        assert_eq!(locate(spec, "", "whatever"), None);
    }
}
