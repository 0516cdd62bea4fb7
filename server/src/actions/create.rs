//! Creating a tracked run: a run some client reports to itself (not launched here), for the
//! REST API (`POST /api/v1/runs` without `launch`) and MLflow's `runs/create` alike. The caller
//! has resolved the experiment and its access; the run is stored, noted, started when asked,
//! and audited here, once.

use tracing::instrument;

use crate::access::audit::Actor;
use crate::access::audit::AuditAction;
use crate::error::Error;
use crate::state::AppState;
use crate::status::{change_status, Actor as StatusActor};
use crate::store::{NewRun, Run, RunStatus, RunUpdate};

/// A tracked run to create, its values already validated.
#[derive(Debug, Default)]
pub struct TrackedRun {
    /// The experiment's id (the caller checked that the actor may add runs to it).
    pub experiment_id: String,
    pub name: Option<String>,
    pub config: Option<serde_json::Value>,
    pub tags: std::collections::BTreeMap<String, String>,
    /// Notes to store with it.
    pub notes: Option<String>,
    /// Start it `running` at once, with this reason (an MLflow client's run is running from
    /// its creation); otherwise it stays `created` until its client reports.
    pub started: Option<&'static str>,
}

/// Stores the run for `actor` (its creator), and returns it as stored.
#[instrument(skip(state, actor, run), fields(experiment = %run.experiment_id))]
pub async fn create_run(state: &AppState, actor: &Actor, run: TrackedRun) -> Result<Run, Error> {
    let changed_after = run.notes.is_some() || run.started.is_some();
    let created = state
        .store
        .create_run(NewRun {
            experiment_id: run.experiment_id,
            name: run.name,
            config: run.config,
            tags: run.tags,
            status: run.started.map(|_| RunStatus::Created),
            created_by: actor.principal.user_id().map(str::to_owned),
        })
        .await?;
    if run.notes.is_some() {
        let notes = RunUpdate {
            notes: run.notes,
            ..Default::default()
        };
        state.store.update_run(&created.id, notes).await?;
    }
    if let Some(reason) = run.started {
        change_status(
            state.store.as_ref(),
            &state.live,
            &created.id,
            RunStatus::Running,
            Some(reason),
            None,
            StatusActor::Client,
        )
        .await?;
    }
    actor
        .record(
            state.store.as_ref(),
            AuditAction::RunCreate,
            Some(&created.id),
            None,
        )
        .await;
    if !changed_after {
        return Ok(created);
    }
    Ok(state.store.get_run(&created.id).await?)
}
