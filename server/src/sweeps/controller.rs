//! The controller of one sweep: a task that, every poll interval or when woken, follows the
//! sweep's running trials (their metric as it is ingested, their run's status), prunes the
//! hopeless ones through the early-stopping rule, launches new trials into free slots (never
//! more than `parallel` at once, through the launcher's queue like any run) and finishes the
//! sweep when its budget is spent.
//!
//! Everything it decides is in the database before it acts on it: a trial is written (with its
//! parameters) before its run is launched, and its run carries the sweep and trial number in a
//! tag, so a server that stops at any point continues with no trial lost or launched twice.
//! The search and the early-stopping rule are pure functions of the spec and the trials, so the
//! answers after a restart are the ones it would have got.
//!
//! A step that fails is tried again after a wait that doubles each time (`sweeps::Retry`);
//! after that many failures in a row the sweep is marked `failed` with the last error, so a
//! sweep that cannot go on says so instead of failing every half second for ever. A database
//! that cannot be reached is waited out without counting.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sweep::{SweepSpec, Verdict};
use tokio::sync::{watch, Notify};

use super::retry;
use crate::access::audit::AuditAction;
use crate::access::audit::{self, Actor};
use crate::access::principal::{Principal, Via};
use crate::state::AppState;
use crate::store::accounts::TokenScope;
use crate::store::sweeps::{SweepRow, SweepState, TrialRow, TrialState, TrialUpdate};
use crate::store::{now_ms, Lifecycle, RunQuery, RunStatus, SortDir, SortKey, StoreError};

/// The metric values seen so far, per trial number (step → value).
type Curves = HashMap<i64, BTreeMap<u64, f64>>;

/// Most points read per history page.
const PAGE: usize = 10_000;
/// Launches that failed in a row (no run was created) before the sweep pauses itself.
const LAUNCH_FAILURES_TO_PAUSE: usize = 3;

pub(super) async fn run(
    state: AppState,
    id: String,
    wake: Arc<Notify>,
    revision: watch::Sender<u64>,
) {
    let mut curves = Curves::new();
    let retry = state.sweeps.retry;
    // Failed steps in a row, and steps in a row that found the database unreachable.
    let (mut failures, mut outages) = (0u32, 0u32);
    loop {
        let wait = match tick(&state, &id, &mut curves).await {
            Ok(Tick { changed, done }) => {
                (failures, outages) = (0, 0);
                if changed {
                    revision.send_modify(|r| *r = r.wrapping_add(1));
                }
                if done {
                    return;
                }
                state.sweeps.poll
            }
            Err(e) if retry::is_outage(&e) => {
                outages = outages.saturating_add(1);
                let wait = retry.delay(outages);
                tracing::warn!(sweep = %id, error = %format!("{e:#}"), next_try_in = ?wait,
                    "sweep controller cannot reach the database; waiting");
                wait
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                outages = 0;
                if failures >= retry.attempts.max(1) {
                    match retry::give_up(state.store.as_ref(), &id, failures, &e).await {
                        Ok(()) => {
                            revision.send_modify(|r| *r = r.wrapping_add(1));
                            return;
                        }
                        Err(mark) => tracing::warn!(sweep = %id, error = %mark,
                            "could not mark the sweep failed; trying again"),
                    }
                }
                let wait = retry.delay(failures);
                tracing::warn!(sweep = %id, error = %format!("{e:#}"), failures,
                    next_try_in = ?wait, "sweep controller step failed; trying again");
                wait
            }
        };
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

struct Tick {
    changed: bool,
    done: bool,
}

/// The trials as the search sees them.
pub(super) fn search_trials(rows: &[TrialRow], curves: &Curves) -> Vec<sweep::Trial> {
    rows.iter()
        .map(|r| super::view::search_trial(r, curves.get(&r.number).cloned().unwrap_or_default()))
        .collect()
}

async fn tick(state: &AppState, id: &str, curves: &mut Curves) -> anyhow::Result<Tick> {
    let sweep = state.store.get_sweep(id).await?;
    if sweep.state.is_over() {
        return Ok(Tick {
            changed: false,
            done: true,
        });
    }
    let spec = super::view::spec_of(&sweep)?;
    // A spec admitted before a check existed may hold what no step can use (a NUL in its
    // metric's name, which Postgres refuses in every read of it): a failing step, not a read.
    super::fields::check(&spec)
        .map_err(|e| anyhow::anyhow!("its spec cannot run here: {}", e.message))?;
    let mut rows = state.store.trials(id).await?;
    let mut changed = false;

    // Follow every trial that has a run: new metric values, and the end of its run.
    let mut fresh = Vec::new();
    for row in rows.iter_mut() {
        let Some(run_id) = row.run_id.clone() else {
            continue;
        };
        let known = curves.contains_key(&row.number);
        if known && row.state != TrialState::Running {
            continue;
        }
        let curve = curves.entry(row.number).or_default();
        let grew = read_new_points(state, &run_id, &spec.metric.name, curve).await?;
        if row.state != TrialState::Running {
            continue;
        }
        if grew {
            fresh.push(row.number);
            row.step = curve
                .keys()
                .next_back()
                .and_then(|s| i64::try_from(*s).ok());
            changed = true;
        }
        if let Some(update) = ended(state, &run_id, &spec, row, curve).await? {
            state.store.update_trial(id, row.number, &update).await?;
            apply(row, update);
            changed = true;
        } else if grew {
            // The step shown in the trials table follows the run.
            let update = update_of(row);
            state.store.update_trial(id, row.number, &update).await?;
        }
    }

    // Judge the running trials that reported something new.
    if !matches!(spec.early_terminate, sweep::EarlyTerminate::None) {
        for number in fresh {
            changed |= judge(state, id, &spec, &mut rows, curves, number).await?;
        }
    }

    // Launch what was decided but not launched, then new trials while there is room.
    if sweep.state == SweepState::Running {
        changed |= launch_trials(state, &sweep, &spec, &mut rows, curves).await?;
    }

    // Done when the budget is spent (or the space exhausted) and nothing runs any more.
    let active = rows.iter().filter(|r| r.state.is_active()).count();
    let spent = rows.len() >= spec.max_trials as usize;
    let exhausted = !spent
        && sweep.state == SweepState::Running
        && sweep::exhausted(&spec, &search_trials(&rows, curves), rows.len() as u32);
    if active == 0 && (spent || exhausted) {
        let message = if spent {
            format!("its budget of {} trials is spent", spec.max_trials)
        } else {
            format!("its search space is exhausted after {} trials", rows.len())
        };
        state
            .store
            .set_sweep_state(id, SweepState::Finished, Some(&message))
            .await?;
        tracing::info!(sweep = %id, "{message}");
        return Ok(Tick {
            changed: true,
            done: true,
        });
    }
    Ok(Tick {
        changed,
        done: false,
    })
}

/// Reads the metric's points after the last one seen; whether there were any.
async fn read_new_points(
    state: &AppState,
    run_id: &str,
    metric: &str,
    curve: &mut BTreeMap<u64, f64>,
) -> anyhow::Result<bool> {
    let mut grew = false;
    loop {
        let after = curve
            .keys()
            .next_back()
            .and_then(|s| i64::try_from(*s).ok());
        let points = match state
            .store
            .metric_history(run_id, metric, after, PAGE)
            .await
        {
            Ok(points) => points,
            Err(StoreError::NotFound { .. }) => return Ok(grew),
            Err(e) => return Err(e.into()),
        };
        let full = points.len() == PAGE;
        for p in points {
            if p.value.is_finite() {
                if let Ok(step) = u64::try_from(p.step) {
                    curve.insert(step, p.value);
                    grew = true;
                }
            }
        }
        if !full {
            return Ok(grew);
        }
    }
}

fn update_of(row: &TrialRow) -> TrialUpdate {
    TrialUpdate {
        state: row.state,
        value: row.value,
        step: row.step,
        rungs: row.rungs.clone(),
        reason: row.reason.clone(),
        ended_at: row.ended_at,
    }
}

fn apply(row: &mut TrialRow, update: TrialUpdate) {
    row.state = update.state;
    row.value = update.value;
    row.step = update.step;
    row.rungs = update.rungs;
    row.reason = update.reason;
    row.ended_at = update.ended_at;
}

/// The trial's end, when its run has ended (or is gone).
async fn ended(
    state: &AppState,
    run_id: &str,
    spec: &SweepSpec,
    row: &TrialRow,
    curve: &BTreeMap<u64, f64>,
) -> anyhow::Result<Option<TrialUpdate>> {
    let status = match state.store.get_run(run_id).await {
        Ok(run) => Some(run.status),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let last = curve.values().next_back().copied();
    let (trial_state, reason) = match status {
        None => (TrialState::Failed, "its run was deleted".to_string()),
        Some(RunStatus::Finished) => match last {
            Some(_) => (TrialState::Complete, "finished".to_string()),
            None => (
                TrialState::Failed,
                format!("its run finished without reporting `{}`", spec.metric.name),
            ),
        },
        Some(RunStatus::Pruned) => (TrialState::Pruned, "pruned".to_string()),
        Some(RunStatus::Failed) => (TrialState::Failed, "its run failed".to_string()),
        Some(RunStatus::Stopped) => (TrialState::Stopped, "its run was stopped".to_string()),
        Some(_) => return Ok(None),
    };
    Ok(Some(TrialUpdate {
        state: trial_state,
        value: last,
        step: curve
            .keys()
            .next_back()
            .and_then(|s| i64::try_from(*s).ok()),
        rungs: row.rungs.clone(),
        reason: Some(reason),
        ended_at: Some(now_ms()),
    }))
}

/// Asks the early-stopping rule about trial `number`; prunes it if told to. Whether anything
/// changed.
async fn judge(
    state: &AppState,
    id: &str,
    spec: &SweepSpec,
    rows: &mut [TrialRow],
    curves: &Curves,
    number: i64,
) -> anyhow::Result<bool> {
    let Some(index) = rows.iter().position(|r| r.number == number) else {
        return Ok(false);
    };
    if rows[index].state != TrialState::Running {
        return Ok(false);
    }
    let mut trials = search_trials(rows, curves);
    let verdict = sweep::judge(spec, &mut trials, index);
    let rungs = trials[index].rungs.clone();
    let row = &mut rows[index];
    let mut changed = false;
    if rungs != row.rungs {
        row.rungs = rungs;
        changed = true;
    }
    if let Verdict::Prune { reason } = verdict {
        let run_id = row.run_id.clone().unwrap_or_default();
        prune(state, &run_id, &reason).await;
        row.state = TrialState::Pruned;
        row.value = curves
            .get(&number)
            .and_then(|c| c.values().next_back().copied());
        row.reason = Some(reason);
        row.ended_at = Some(now_ms());
        changed = true;
    }
    if changed {
        state
            .store
            .update_trial(id, number, &update_of(row))
            .await?;
    }
    Ok(changed)
}

/// Marks the run `pruned` first (so the trainer's own `stopped` after its final checkpoint does
/// not overrule it), then stops its process; the slot frees when the process exits.
async fn prune(state: &AppState, run_id: &str, reason: &str) {
    let marked = crate::status::change_status(
        &*state.store,
        &state.live,
        run_id,
        RunStatus::Pruned,
        Some(reason),
        None,
        crate::status::Actor::Sweep,
    )
    .await;
    if let Err(e) = marked {
        tracing::warn!(run = %run_id, error = %e, "could not mark the run pruned");
    }
    if state.launcher.is_launched(run_id) {
        if let Err(e) = state.launcher.stop(run_id).await {
            tracing::debug!(run = %run_id, error = %e, "stopping a pruned trial");
        }
    }
}

/// Who the controller launches as: the sweep's creator (their access is checked at every
/// launch, so a creator who lost access stops the sweep's launches), the local user of a
/// server without accounts, or the administrator for a sweep made with the admin token. Read
/// again before every launch: a creator who was disabled or deleted launches nothing, and the
/// sweep is paused saying so (`Err` holds that message).
async fn actor_of(state: &AppState, sweep: &SweepRow) -> anyhow::Result<Result<Actor, String>> {
    let local = !state.settings.accounts_on()
        && state
            .settings
            .admin_token
            .as_deref()
            .is_none_or(str::is_empty);
    let principal = match &sweep.created_by {
        // The one local user of a server without accounts, as their own requests are.
        None if local => Principal::Local,
        None => Principal::AdminToken,
        Some(user_id) => match state.store.get_user(user_id).await {
            Ok(user) if user.disabled => {
                return Ok(Err(format!(
                    "paused: its creator {} was disabled",
                    user.name
                )))
            }
            Ok(user) => Principal::User {
                user: Arc::new(user),
                via: Via::Token {
                    id: format!("sweep {}", sweep.id),
                    scope: TokenScope::Write,
                },
            },
            Err(StoreError::NotFound { .. }) => {
                return Ok(Err("paused: its creator's account was deleted".to_string()))
            }
            Err(e) => return Err(e.into()),
        },
    };
    Ok(Ok(Actor {
        principal,
        client: Some(format!("sweep {}", sweep.id)),
    }))
}

/// The actor to launch the next trial as, or `None` after pausing the sweep because its
/// creator may no longer launch (the cause is logged and audited).
async fn launcher_of(state: &AppState, sweep: &SweepRow) -> anyhow::Result<Option<Actor>> {
    let reason = match actor_of(state, sweep).await? {
        Ok(actor) => return Ok(Some(actor)),
        Err(reason) => reason,
    };
    tracing::warn!(sweep = %sweep.id, "{reason}; no trial is launched");
    state
        .store
        .set_sweep_state(&sweep.id, SweepState::Paused, Some(&reason))
        .await?;
    let client = format!("sweep {}", sweep.id);
    audit::record(
        state.store.as_ref(),
        Some("server".into()),
        Some(&client),
        AuditAction::SweepPause,
        Some(&sweep.id),
        Some(reason),
    )
    .await;
    Ok(None)
}

/// Launches pending trials, then suggests and launches new ones while the sweep has room.
async fn launch_trials(
    state: &AppState,
    sweep: &SweepRow,
    spec: &SweepSpec,
    rows: &mut Vec<TrialRow>,
    curves: &Curves,
) -> anyhow::Result<bool> {
    let mut changed = false;
    // A running sweep whose creator may no longer launch is paused at once, room or not.
    if launcher_of(state, sweep).await?.is_none() {
        return Ok(true);
    }
    let pending: Vec<i64> = rows
        .iter()
        .filter(|r| r.state == TrialState::Pending)
        .map(|r| r.number)
        .collect();
    for number in pending {
        let Some(actor) = launcher_of(state, sweep).await? else {
            return Ok(true);
        };
        changed |= launch_one(state, sweep, spec, rows, &actor, number).await?;
    }
    loop {
        let active = rows.iter().filter(|r| r.state.is_active()).count();
        if active >= spec.parallel as usize || rows.len() >= spec.max_trials as usize {
            break;
        }
        if failing_launches(rows) {
            let message = "paused: the last trials could not be launched (see their reasons)";
            state
                .store
                .set_sweep_state(&sweep.id, SweepState::Paused, Some(message))
                .await?;
            return Ok(true);
        }
        let number = rows.len() as u32;
        // A model-based suggestion is CPU work (a GP fit): off the async workers.
        let (for_search, trials) = (spec.clone(), search_trials(rows, curves));
        let suggested =
            tokio::task::spawn_blocking(move || sweep::suggest(&for_search, &trials, number))
                .await?;
        let Some(params) = suggested else {
            break;
        };
        // Checked again right before each launch (a creator may be disabled meanwhile).
        let Some(actor) = launcher_of(state, sweep).await? else {
            return Ok(true);
        };
        let params: serde_json::Map<String, serde_json::Value> = params.into_iter().collect();
        let bracket = sweep::assign_bracket(spec, number).map(i64::from);
        state
            .store
            .add_trial(&sweep.id, i64::from(number), &params, bracket)
            .await?;
        rows.push(TrialRow {
            number: i64::from(number),
            run_id: None,
            params,
            state: TrialState::Pending,
            value: None,
            step: None,
            rungs: BTreeMap::new(),
            bracket,
            reason: None,
            created_at: now_ms(),
            ended_at: None,
        });
        launch_one(state, sweep, spec, rows, &actor, i64::from(number)).await?;
        changed = true;
    }
    Ok(changed)
}

/// Whether the last few trials all failed before a run existed.
fn failing_launches(rows: &[TrialRow]) -> bool {
    rows.len() >= LAUNCH_FAILURES_TO_PAUSE
        && rows[rows.len() - LAUNCH_FAILURES_TO_PAUSE..]
            .iter()
            .all(|r| r.state == TrialState::Failed && r.run_id.is_none())
}

/// Launches pending trial `number` (or links the run a controller before a restart launched).
async fn launch_one(
    state: &AppState,
    sweep: &SweepRow,
    spec: &SweepSpec,
    rows: &mut [TrialRow],
    actor: &Actor,
    number: i64,
) -> anyhow::Result<bool> {
    let Some(row) = rows.iter_mut().find(|r| r.number == number) else {
        return Ok(false);
    };
    let tag = format!("{}={}/{number}", super::TRIAL_TAG, sweep.id);
    let found = state
        .store
        .search_runs(&RunQuery {
            experiment_id: Some(sweep.experiment_id.clone()),
            status: None,
            tag: Some(tag),
            filter: None,
            sort: SortKey::CreatedAt,
            dir: SortDir::Asc,
            limit: 1,
            cursor: None,
            visible_experiments: None,
            lifecycle: Lifecycle::All,
        })
        .await?;
    let run_id = match found.runs.into_iter().next() {
        Some(run) => run.id,
        None => {
            let params: sweep::Params = row.params.clone().into_iter().collect();
            let request = super::admit::trial_request(
                spec,
                &sweep.id,
                &sweep.experiment_id,
                u32::try_from(number).unwrap_or(u32::MAX),
                &params,
            );
            match crate::actions::launch_run(state, actor, request).await {
                Ok(run) => run.id,
                Err(e) => {
                    let reason = format!("could not be launched: {}", e.reason());
                    // The whole cause chain for the operator; the trial keeps its reason.
                    let error = format!("{:#}", anyhow::Error::from(e));
                    tracing::warn!(sweep = %sweep.id, trial = number, %error, "{reason}");
                    row.state = TrialState::Failed;
                    row.reason = Some(reason);
                    row.ended_at = Some(now_ms());
                    state
                        .store
                        .update_trial(&sweep.id, number, &update_of(row))
                        .await?;
                    return Ok(true);
                }
            }
        }
    };
    state
        .store
        .set_trial_run(&sweep.id, number, &run_id)
        .await?;
    row.run_id = Some(run_id);
    row.state = TrialState::Running;
    Ok(true)
}
