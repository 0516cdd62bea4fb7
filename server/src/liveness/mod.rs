//! Is a reporting client still there? A run this server did not launch (someone ran
//! `trainyard train --server` in a terminal, or a script reports through the API) has no
//! process here to watch, so its client shows it is alive: a heartbeat
//! (`POST /api/v1/runs/{id}/heartbeat`, every 30 s from the trainer), or any metric batch or
//! update. A `running` run silent for longer than `--lost-after-secs` is marked `lost`; a sign
//! of life from a lost run makes it `running` again. Launched runs are left to the launcher,
//! which watches their processes.
//!
//! Last signs of life are kept in memory: after a restart every running run gets a fresh
//! `lost_after` from the server's start before it can be declared lost.

pub mod tracker;

use std::time::Duration;

use crate::state::AppState;
use crate::status::{change_status, Actor};
pub use tracker::Liveness;

use crate::store::{now_ms, RunQuery, RunStatus, SortDir, SortKey, StoreResult};

/// Records a sign of life from a run's client; a run marked `lost` becomes `running` again.
pub async fn seen(state: &AppState, run_id: &str) -> StoreResult<()> {
    // Every metric batch comes through here: update in place, allocate only for a new run.
    let previous = {
        let mut seen = state.liveness.seen_map();
        match seen.get_mut(run_id) {
            Some(t) => Some(std::mem::replace(t, now_ms())),
            None => seen.insert(run_id.to_string(), now_ms()),
        }
    };
    // Only a run marked lost by this server, or one not heard from since it started (marked
    // before a restart), can need reviving: skip the status read for the common case.
    let may_be_lost = previous.is_none() || state.liveness.marked().remove(run_id);
    if may_be_lost && state.store.get_run(run_id).await?.status == RunStatus::Lost {
        change_status(
            state.store.as_ref(),
            &state.live,
            run_id,
            RunStatus::Running,
            Some("its client reported again"),
            None,
            Actor::Client,
        )
        .await?;
    }
    Ok(())
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Marks every `running` run that was not launched here and has been silent for longer than
/// `lost_after` at time `now_ms` as `lost`. Returns the ids it marked.
pub async fn mark_silent_runs_lost(state: &AppState, now_ms: i64) -> StoreResult<Vec<String>> {
    let lost_after = millis(state.liveness.lost_after);
    let mut marked = Vec::new();
    let mut cursor = None;
    loop {
        let page = state
            .store
            .search_runs(&RunQuery {
                experiment_id: None,
                status: Some(RunStatus::Running),
                tag: None,
                filter: None,
                sort: SortKey::CreatedAt,
                dir: SortDir::Asc,
                limit: 500,
                cursor: cursor.take(),
                visible_experiments: None,
                lifecycle: crate::store::Lifecycle::All,
            })
            .await?;
        for run in page.runs {
            if state.launcher.is_launched(&run.id) {
                continue;
            }
            let last = [
                state.liveness.last_seen(&run.id),
                run.started_at,
                Some(state.liveness.started_ms),
            ]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(now_ms);
            if now_ms - last <= lost_after {
                continue;
            }
            let reason = format!(
                "no heartbeat, metric or update for {} s (the limit is {} s): its process was \
                 probably killed; it becomes running again if its client reports",
                (now_ms - last) / 1000,
                lost_after / 1000
            );
            let changed = change_status(
                state.store.as_ref(),
                &state.live,
                &run.id,
                RunStatus::Lost,
                Some(&reason),
                None,
                Actor::Watchdog,
            )
            .await;
            match changed {
                Ok(_) => {
                    state.liveness.marked().insert(run.id.clone());
                    marked.push(run.id)
                }
                // It changed status meanwhile (finished, say): nothing to do.
                Err(crate::store::StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    Ok(marked)
}

/// Runs the watchdog until the server stops: a sweep every quarter of `lost_after` (at most
/// every 30 s).
pub async fn watch(state: AppState) {
    let period =
        (state.liveness.lost_after / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match mark_silent_runs_lost(&state, now_ms()).await {
            Ok(marked) if !marked.is_empty() => {
                tracing::warn!(runs = ?marked, "silent runs marked lost")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "the lost-run watchdog could not sweep"),
        }
    }
}
