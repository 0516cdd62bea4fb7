//! The run page's instability-guard events: the steps whose update the trainer's guard skipped
//! and the rollbacks it made, read back from the metric points it records for them
//! (`trainer::wire::guard_keys`). Shown beside the history of status changes, and swapped in live
//! with the other panels (`/runs/{id}/panels`).

use std::collections::BTreeMap;

use trainer::wire::guard_keys;

use crate::store::{Store, StoreResult};

/// Events listed at most (newest first); the skipped-steps chart shows the whole count.
const MAX_EVENTS: usize = 100;
/// Points read per guard key: a run with more skips than this shows its first ones only.
const MAX_POINTS: usize = 5_000;

/// One thing the guard did.
#[derive(Debug, Clone, PartialEq)]
pub struct GuardEvent {
    pub step: i64,
    /// `skipped` or `rollback`.
    pub kind: &'static str,
    pub text: String,
}

/// The guard's events of `run_id`, newest first.
pub async fn guard_events(store: &dyn Store, run_id: &str) -> StoreResult<Vec<GuardEvent>> {
    let read = |key: &'static str| store.metric_history(run_id, key, None, MAX_POINTS);
    let skipped = read(guard_keys::SKIPPED_STEPS).await?;
    let rollbacks = read(guard_keys::ROLLBACK_TO).await?;
    let scales: BTreeMap<i64, f64> = read(guard_keys::LR_SCALE)
        .await?
        .into_iter()
        .map(|p| (p.step, p.value))
        .collect();
    let rolled_back: BTreeMap<i64, f64> = rollbacks.iter().map(|p| (p.step, p.value)).collect();
    let mut events: Vec<GuardEvent> = skipped
        .iter()
        .filter(|p| !rolled_back.contains_key(&p.step))
        .map(|p| GuardEvent {
            step: p.step,
            kind: "skipped",
            text: format!(
                "Update skipped: non-finite or spiking loss ({} skipped so far)",
                p.value
            ),
        })
        .collect();
    events.extend(rollbacks.iter().map(|p| {
        let scale = scales
            .get(&p.step)
            .map(|s| format!("; learning rate now x{s}"))
            .unwrap_or_default();
        GuardEvent {
            step: p.step,
            kind: "rollback",
            text: format!(
                "Update skipped and weights rolled back to the checkpoint of step {}{scale}",
                p.value
            ),
        }
    }));
    events.sort_by_key(|e| std::cmp::Reverse(e.step));
    events.truncate(MAX_EVENTS);
    Ok(events)
}
