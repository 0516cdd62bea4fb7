//! A sweep as the API, its event stream and its page show it: the spec and state, the best
//! trial, every trial with its parameters, objective, step, next rung and metric curve, the
//! parameter importance and the versions of the spec. Built from the store alone, so every
//! reader sees the same thing whether or not a controller runs.
//!
//! A broken sweep is shown too, never a 500: one whose stored spec this server cannot read is
//! shown from its row and trials alone (method `unknown`, no curves), and one whose metric is no
//! key a run can report (a NUL in it, admitted before that was checked) without curves, since
//! no run can have reported it.

use std::collections::BTreeMap;

use serde::Serialize;
use sweep::{Goal, SweepSpec};

use crate::access::Principal;
use crate::error::Error;
use crate::state::AppState;
use crate::store::sweeps::{SweepRow, SweepState, SweepVersion, TrialRow, TrialState};
use crate::store::StoreResult;

/// Points of each trial's metric curve in a view (downsampled keeping each bucket's extremes).
pub const CURVE_POINTS: usize = 200;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TrialCounts {
    pub total: usize,
    pub pending: usize,
    pub running: usize,
    pub complete: usize,
    pub pruned: usize,
    pub failed: usize,
    pub stopped: usize,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BestTrial {
    pub number: i64,
    pub run_id: Option<String>,
    pub value: f64,
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

/// A sweep in a list.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SweepSummary {
    pub id: String,
    pub name: String,
    pub experiment_id: String,
    pub state: SweepState,
    /// Why it is in its state (finished, paused by itself, stopped).
    pub message: Option<String>,
    /// The spec's version (1, then one more per change).
    pub version: i64,
    /// grid, random, tpe, bayes or auto.
    pub method: String,
    pub metric: String,
    /// minimize or maximize.
    pub goal: String,
    /// asha, median, hyperband or none.
    pub early_terminate: String,
    pub max_trials: u32,
    pub parallel: u32,
    /// How many trials are in each state (`counts` in JSON: a sweep's `trials` are the list).
    #[serde(rename = "counts")]
    pub trials: TrialCounts,
    /// The complete trial with the best objective (pruned trials do not count).
    pub best: Option<BestTrial>,
    pub created_by: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub ended_at: Option<i64>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TrialView {
    pub number: i64,
    pub run_id: Option<String>,
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
    pub state: TrialState,
    /// The objective: the metric's last value.
    pub value: Option<f64>,
    /// The last step the metric was reported at.
    pub step: Option<i64>,
    /// The step at which the early-stopping rule judges it next (running trials).
    pub next_rung: Option<u64>,
    /// The values it had at each rung it reached.
    pub rungs: BTreeMap<u32, f64>,
    pub bracket: Option<i64>,
    pub reason: Option<String>,
    pub created_at: i64,
    pub ended_at: Option<i64>,
    /// `[step, value]` pairs of the metric, at most [`CURVE_POINTS`].
    pub curve: Vec<[f64; 2]>,
}

/// A sweep with its trials.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SweepDetail {
    #[serde(flatten)]
    pub summary: SweepSummary,
    /// The current spec.
    #[schema(value_type = Object)]
    pub spec: serde_json::Value,
    pub trials: Vec<TrialView>,
    /// Each parameter's share of the objective's variance over the complete trials (fANOVA).
    pub importance: BTreeMap<String, f64>,
    pub versions: Vec<SweepVersion>,
}

fn goal_name(goal: Goal) -> &'static str {
    match goal {
        Goal::Minimize => "minimize",
        Goal::Maximize => "maximize",
    }
}

fn method_name(method: sweep::Method) -> &'static str {
    match method {
        sweep::Method::Grid => "grid",
        sweep::Method::Random => "random",
        sweep::Method::Tpe => "tpe",
        sweep::Method::Bayes => "bayes",
        sweep::Method::Auto => "auto",
    }
}

fn rule_name(rule: &sweep::EarlyTerminate) -> &'static str {
    match rule {
        sweep::EarlyTerminate::None => "none",
        sweep::EarlyTerminate::Asha { .. } => "asha",
        sweep::EarlyTerminate::Median { .. } => "median",
        sweep::EarlyTerminate::Hyperband { .. } => "hyperband",
    }
}

/// The spec stored with a sweep: the document as its author wrote it (as JSON), checked when
/// it was stored, so it parses.
pub fn spec_of(row: &SweepRow) -> StoreResult<SweepSpec> {
    SweepSpec::from_json_value(&row.spec).map_err(|e| {
        crate::store::StoreError::Database(sqlx::Error::Protocol(format!(
            "sweep {} has a spec this server cannot read: {e}",
            row.id
        )))
    })
}

fn best(spec: &SweepSpec, trials: &[TrialRow]) -> Option<BestTrial> {
    let better = |a: f64, b: f64| match spec.metric.goal {
        Goal::Minimize => a < b,
        Goal::Maximize => a > b,
    };
    trials
        .iter()
        .filter(|t| t.state == TrialState::Complete)
        .filter_map(|t| t.value.filter(|v| v.is_finite()).map(|v| (t, v)))
        .fold(None, |acc: Option<(&TrialRow, f64)>, (t, v)| match acc {
            Some((_, bv)) if !better(v, bv) => acc,
            _ => Some((t, v)),
        })
        .map(|(t, v)| BestTrial {
            number: t.number,
            run_id: t.run_id.clone(),
            value: v,
            params: t.params.clone(),
        })
}

fn counts(trials: &[TrialRow]) -> TrialCounts {
    let n = |s: TrialState| trials.iter().filter(|t| t.state == s).count();
    TrialCounts {
        total: trials.len(),
        pending: n(TrialState::Pending),
        running: n(TrialState::Running),
        complete: n(TrialState::Complete),
        pruned: n(TrialState::Pruned),
        failed: n(TrialState::Failed),
        stopped: n(TrialState::Stopped),
    }
}

/// The summary of a sweep whose stored spec this server cannot read (its row and trials).
fn unreadable_summary(row: &SweepRow, trials: &[TrialRow]) -> SweepSummary {
    SweepSummary {
        id: row.id.clone(),
        name: row.name.clone(),
        experiment_id: row.experiment_id.clone(),
        state: row.state,
        message: row.message.clone(),
        version: row.version,
        method: "unknown".into(),
        metric: String::new(),
        goal: String::new(),
        early_terminate: "none".into(),
        max_trials: 0,
        parallel: 0,
        trials: counts(trials),
        best: None,
        created_by: row.created_by.clone(),
        created_at: row.created_at,
        updated_at: row.updated_at,
        ended_at: row.ended_at,
    }
}

/// The spec of `row`, or `None` (logged) when this server cannot read it.
fn readable_spec(row: &SweepRow) -> Option<SweepSpec> {
    match spec_of(row) {
        Ok(spec) => Some(spec),
        Err(e) => {
            tracing::warn!(sweep = %row.id, error = %e, "showing a sweep whose spec cannot be read");
            None
        }
    }
}

fn summary_of(row: &SweepRow, spec: &SweepSpec, trials: &[TrialRow]) -> SweepSummary {
    SweepSummary {
        id: row.id.clone(),
        name: row.name.clone(),
        experiment_id: row.experiment_id.clone(),
        state: row.state,
        message: row.message.clone(),
        version: row.version,
        method: method_name(spec.method).into(),
        metric: spec.metric.name.clone(),
        goal: goal_name(spec.metric.goal).into(),
        early_terminate: rule_name(&spec.early_terminate).into(),
        max_trials: spec.max_trials,
        parallel: spec.parallel,
        trials: counts(trials),
        best: best(spec, trials),
        created_by: row.created_by.clone(),
        created_at: row.created_at,
        updated_at: row.updated_at,
        ended_at: row.ended_at,
    }
}

/// The importance of the sweep's parameters over its complete trials: from the cache while
/// no trial completed and the spec did not change, else fitted off the async workers.
async fn importance(
    state: &AppState,
    row: &SweepRow,
    spec: SweepSpec,
    trials: Vec<sweep::Trial>,
) -> StoreResult<BTreeMap<String, f64>> {
    let complete = trials
        .iter()
        .filter(|t| t.state == sweep::TrialState::Complete)
        .count();
    let key = (row.version, complete);
    if let Some(cached) = state.sweeps.cached_importance(&row.id, key) {
        return Ok(cached);
    }
    let value = tokio::task::spawn_blocking(move || sweep::importance(&spec, &trials))
        .await
        .map_err(|e| {
            crate::store::StoreError::Database(sqlx::Error::Protocol(format!(
                "computing parameter importance failed: {e}"
            )))
        })?;
    state
        .sweeps
        .remember_importance(&row.id, key, value.clone());
    Ok(value)
}

/// Summaries of the sweeps `principal` may read (of one experiment, when named).
pub async fn list(
    state: &AppState,
    principal: &Principal,
    experiment: Option<&str>,
) -> Result<Vec<SweepSummary>, Error> {
    let visible = principal.readable_experiments(state.store.as_ref()).await?;
    let ids = match experiment {
        Some(name) => {
            let e = state
                .store
                .get_experiment(name)
                .await
                .map_err(|_| Error::NotFound(format!("experiment `{name}` not found")))?;
            if visible.as_ref().is_some_and(|v| !v.contains(&e.id)) {
                return Err(Error::NotFound(format!("experiment `{name}` not found")));
            }
            Some(vec![e.id])
        }
        None => visible,
    };
    let rows = state.store.list_sweeps(ids.as_deref()).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        out.push(summary(state, row).await?);
    }
    Ok(out)
}

pub async fn summary(state: &AppState, row: &SweepRow) -> StoreResult<SweepSummary> {
    let trials = state.store.trials(&row.id).await?;
    Ok(match readable_spec(row) {
        Some(spec) => summary_of(row, &spec, &trials),
        None => unreadable_summary(row, &trials),
    })
}

pub async fn detail(state: &AppState, id: &str) -> StoreResult<SweepDetail> {
    let row = state.store.get_sweep(id).await?;
    let spec = readable_spec(&row);
    // The metric is read by its key; one no run can report is not read at all.
    let metric = spec
        .as_ref()
        .map(|s| s.metric.name.as_str())
        .filter(|name| crate::validate::points::check_key(name).is_ok());
    let rows = state.store.trials(id).await?;
    let mut trials = Vec::with_capacity(rows.len());
    let mut search = Vec::with_capacity(rows.len());
    for t in &rows {
        let curve = match (&t.run_id, metric) {
            (Some(run_id), Some(metric)) => match state
                .store
                .read_series(run_id, metric, None, None, CURVE_POINTS)
                .await
            {
                Ok(series) => series.points,
                Err(crate::store::StoreError::NotFound { .. }) => Vec::new(),
                Err(e) => return Err(e),
            },
            _ => Vec::new(),
        };
        let intermediate: BTreeMap<u64, f64> = curve
            .iter()
            .filter_map(|p| u64::try_from(p.step).ok().map(|s| (s, p.value)))
            .collect();
        let for_search = search_trial(t, intermediate);
        let next_rung = match &spec {
            Some(spec) if t.state.is_active() => sweep::next_rung(spec, &for_search),
            _ => None,
        };
        search.push(for_search);
        trials.push(TrialView {
            number: t.number,
            run_id: t.run_id.clone(),
            params: t.params.clone(),
            state: t.state,
            value: t.value,
            step: t.step,
            next_rung,
            rungs: t.rungs.clone(),
            bracket: t.bracket,
            reason: t.reason.clone(),
            created_at: t.created_at,
            ended_at: t.ended_at,
            curve: curve.iter().map(|p| [p.step as f64, p.value]).collect(),
        });
    }
    let (importance, summary) = match spec {
        Some(spec) => (
            importance(state, &row, spec.clone(), search).await?,
            summary_of(&row, &spec, &rows),
        ),
        None => (BTreeMap::new(), unreadable_summary(&row, &rows)),
    };
    Ok(SweepDetail {
        summary,
        spec: row.spec.clone(),
        trials,
        importance,
        versions: state.store.sweep_versions(id).await?,
    })
}

/// One trial as the search sees it, with the metric values seen so far.
pub(super) fn search_trial(row: &TrialRow, intermediate: BTreeMap<u64, f64>) -> sweep::Trial {
    sweep::Trial {
        number: u32::try_from(row.number).unwrap_or(u32::MAX),
        params: row.params.clone().into_iter().collect(),
        // Pending trials are decided: the search counts them like running ones.
        state: match row.state {
            TrialState::Pending | TrialState::Running => sweep::TrialState::Running,
            TrialState::Complete => sweep::TrialState::Complete,
            TrialState::Pruned => sweep::TrialState::Pruned,
            TrialState::Failed | TrialState::Stopped => sweep::TrialState::Failed,
        },
        value: row.value,
        intermediate,
        rungs: row.rungs.clone(),
        bracket: row.bracket.and_then(|b| u32::try_from(b).ok()),
    }
}
