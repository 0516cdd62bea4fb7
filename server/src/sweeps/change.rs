//! What a user does to a sweep after it started: pause it (no new trials; running ones go on),
//! resume it, stop it (its running trials are stopped too), and change it while it runs: raise
//! `max_trials` or `parallel`, narrow or widen a parameter's range. A change edits the stored
//! document, is checked like a new spec, and becomes the next version with a sentence per
//! change; the controller picks it up at once.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::admit;
use crate::access::audit::Actor;
use crate::access::audit::AuditAction;
use crate::error::Error;
use crate::state::AppState;
use crate::store::now_ms;
use crate::store::sweeps::{SweepRow, SweepState, TrialState, TrialUpdate};
use crate::validate::Invalid;

/// `PATCH /api/v1/sweeps/{id}`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SweepChange {
    /// The version the change was made against; a conflict (409) if the sweep changed since.
    pub version: Option<i64>,
    /// A new budget: at least the trials made so far.
    pub max_trials: Option<u32>,
    /// How many trials may run at once.
    pub parallel: Option<u32>,
    /// New definitions of existing parameters (as in the spec), e.g. a wider range.
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<BTreeMap<String, serde_json::Value>>,
}

fn bad(field: &str, message: impl Into<String>) -> Error {
    admit::bad(Invalid::new(field, message))
}

fn compact(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The edited document and a sentence per change, or an error naming the field.
fn edit(
    document: &serde_json::Value,
    change: &SweepChange,
    trials_so_far: usize,
) -> Result<(serde_json::Value, Vec<String>), Error> {
    let mut doc = document.clone();
    let Some(map) = doc.as_object_mut() else {
        return Err(Error::Internal(anyhow::anyhow!(
            "a stored sweep spec is not an object"
        )));
    };
    let mut changes = Vec::new();
    if let Some(max) = change.max_trials {
        if (max as usize) < trials_so_far {
            return Err(bad(
                "max_trials",
                format!("max_trials must be at least the {trials_so_far} trials made so far"),
            ));
        }
        let old = map
            .remove("run_cap")
            .or_else(|| map.get("max_trials").cloned());
        let old = old
            .map(|v| compact(&v))
            .unwrap_or_else(|| "the grid size".into());
        map.insert("max_trials".into(), max.into());
        changes.push(format!("max_trials: {old} → {max}"));
    }
    if let Some(parallel) = change.parallel {
        let old = map
            .get("parallel")
            .map(compact)
            .unwrap_or_else(|| "1".into());
        map.insert("parallel".into(), parallel.into());
        changes.push(format!("parallel: {old} → {parallel}"));
    }
    if let Some(parameters) = &change.parameters {
        let Some(existing) = map.get_mut("parameters").and_then(|p| p.as_object_mut()) else {
            return Err(Error::Internal(anyhow::anyhow!(
                "a stored sweep spec has no parameters"
            )));
        };
        for (key, definition) in parameters {
            let Some(old) = existing.get(key).cloned() else {
                return Err(bad(
                    &format!("parameters.{key}"),
                    format!(
                        "the sweep has no parameter `{key}`; a running sweep can change the \
                         range of its parameters, not add new ones"
                    ),
                ));
            };
            existing.insert(key.clone(), definition.clone());
            changes.push(format!("parameters.{key}: {old} → {definition}"));
        }
    }
    if changes.is_empty() {
        return Err(bad(
            "max_trials",
            "nothing to change: give max_trials, parallel or parameters",
        ));
    }
    Ok((doc, changes))
}

/// Applies `change` to sweep `id` as a new version; returns the sweep.
pub async fn change(
    state: &AppState,
    actor: &Actor,
    id: &str,
    change: SweepChange,
) -> Result<SweepRow, Error> {
    let row = state.store.get_sweep(id).await?;
    if row.state.is_over() {
        return Err(Error::Conflict {
            field: Some("state".into()),
            message: format!(
                "the sweep is {}; it cannot change any more",
                row.state.as_str()
            ),
        });
    }
    if let Some(v) = change.version {
        if v != row.version {
            return Err(Error::Conflict {
                field: Some("version".into()),
                message: format!(
                    "the sweep is at version {}, not {v}; read it again and repeat the change",
                    row.version
                ),
            });
        }
    }
    if super::view::spec_of(&row).is_err() {
        return Err(Error::Conflict {
            field: Some("spec".into()),
            message: "this server cannot read the sweep's spec, so it cannot change it; stop \
                      the sweep and submit it again"
                .into(),
        });
    }
    let trials = state.store.trials(id).await?;
    let (document, changes) = edit(&row.spec, &change, trials.len())?;
    let (document, spec) = admit::parse(&document).map_err(admit::bad)?;
    admit::check(state, &spec).await?;
    state
        .store
        .change_sweep_spec(
            id,
            row.version,
            &document,
            &changes,
            actor.principal.user_id(),
        )
        .await?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::SweepChange,
            Some(id),
            Some(changes.join("; ")),
        )
        .await;
    state.sweeps.wake(id);
    state.sweeps.changed(id);
    Ok(state.store.get_sweep(id).await?)
}

/// Pause, resume or stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Pause,
    Resume,
    Stop,
}

pub async fn control(
    state: &AppState,
    actor: &Actor,
    id: &str,
    control: Control,
) -> Result<SweepRow, Error> {
    let row = state.store.get_sweep(id).await?;
    let conflict = |what: &str| Error::Conflict {
        field: Some("state".into()),
        message: format!("the sweep is {}; it cannot be {what}", row.state.as_str()),
    };
    let who = actor.principal.actor().unwrap_or_else(|| "someone".into());
    match control {
        Control::Pause => {
            if row.state != SweepState::Running {
                return Err(conflict("paused"));
            }
            let message = format!("paused by {who}");
            state
                .store
                .set_sweep_state(id, SweepState::Paused, Some(&message))
                .await?;
        }
        Control::Resume => {
            if row.state != SweepState::Paused {
                return Err(conflict("resumed"));
            }
            state
                .store
                .set_sweep_state(id, SweepState::Running, None)
                .await?;
            state.sweeps.start(state, id);
        }
        Control::Stop => {
            if row.state.is_over() {
                return Err(conflict("stopped"));
            }
            let message = format!("stopped by {who}");
            // The state first: the controller launches nothing more once it reads it.
            state
                .store
                .set_sweep_state(id, SweepState::Stopped, Some(&message))
                .await?;
            stop_trials(state, id).await?;
        }
    }
    let action = match control {
        Control::Pause => AuditAction::SweepPause,
        Control::Resume => AuditAction::SweepResume,
        Control::Stop => AuditAction::SweepStop,
    };
    actor
        .record(state.store.as_ref(), action, Some(id), None)
        .await;
    state.sweeps.wake(id);
    state.sweeps.changed(id);
    Ok(state.store.get_sweep(id).await?)
}

/// Pauses the running sweeps user `user_id` created (their trials launch as that user, who may
/// no longer launch anything), with `reason` as their message. Returns their ids. Running
/// trials go on; the controller, which checks the creator before every launch, launches
/// nothing more even if the sweep is resumed.
pub async fn pause_sweeps_of(
    state: &AppState,
    user_id: &str,
    reason: &str,
) -> Result<Vec<String>, Error> {
    let mut paused = Vec::new();
    for sweep in state.store.live_sweeps().await? {
        if sweep.state != SweepState::Running || sweep.created_by.as_deref() != Some(user_id) {
            continue;
        }
        state
            .store
            .set_sweep_state(&sweep.id, SweepState::Paused, Some(reason))
            .await?;
        tracing::info!(sweep = %sweep.id, "{reason}");
        state.sweeps.wake(&sweep.id);
        state.sweeps.changed(&sweep.id);
        paused.push(sweep.id);
    }
    Ok(paused)
}

/// Stops the runs of a stopped sweep's active trials and records them as stopped.
async fn stop_trials(state: &AppState, id: &str) -> Result<(), Error> {
    for trial in state.store.trials(id).await? {
        if !trial.state.is_active() {
            continue;
        }
        if let Some(run_id) = &trial.run_id {
            if state.launcher.is_launched(run_id) {
                if let Err(e) = state.launcher.stop(run_id).await {
                    tracing::debug!(run = %run_id, error = %e, "stopping a trial of a stopped sweep");
                }
            }
        }
        let update = TrialUpdate {
            state: TrialState::Stopped,
            value: trial.value,
            step: trial.step,
            rungs: trial.rungs.clone(),
            reason: Some("stopped with its sweep".into()),
            ended_at: Some(now_ms()),
        };
        state.store.update_trial(id, trial.number, &update).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> serde_json::Value {
        json!({
            "name": "s", "method": "random", "run_cap": 4, "parallel": 2,
            "metric": {"name": "loss", "goal": "minimize"},
            "parameters": {"x": {"distribution": "uniform", "min": 0.0, "max": 1.0}}
        })
    }

    #[test]
    fn a_change_edits_the_document_and_says_what_changed() {
        let change = SweepChange {
            max_trials: Some(10),
            parallel: Some(3),
            parameters: Some(BTreeMap::from([(
                "x".to_string(),
                json!({"distribution": "uniform", "min": 0.0, "max": 2.0}),
            )])),
            ..Default::default()
        };
        let (doc, changes) = edit(&doc(), &change, 2).expect("edit");
        assert_eq!(doc["max_trials"], json!(10));
        assert!(doc.get("run_cap").is_none(), "the alias is replaced");
        assert_eq!(doc["parameters"]["x"]["max"], json!(2.0));
        assert_eq!(changes[0], "max_trials: 4 → 10");
        assert_eq!(changes[1], "parallel: 2 → 3");
        assert!(changes[2].starts_with("parameters.x: "), "{}", changes[2]);
    }

    #[test]
    fn bad_changes_name_their_field() {
        let cases = [
            (
                SweepChange {
                    max_trials: Some(1),
                    ..Default::default()
                },
                "max_trials",
            ),
            (
                SweepChange {
                    parameters: Some(BTreeMap::from([("y".to_string(), json!({"values": [1]}))])),
                    ..Default::default()
                },
                "parameters.y",
            ),
            (SweepChange::default(), "max_trials"),
        ];
        for (change, field) in cases {
            match edit(&doc(), &change, 3) {
                Err(Error::Malformed { field: Some(f), .. }) => assert_eq!(f, field),
                other => panic!("expected a 400 naming {field}, got {other:?}"),
            }
        }
    }
}
