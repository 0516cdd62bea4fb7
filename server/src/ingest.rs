//! The one path a metric point takes into the server: store (the store checks the batch once
//! against `validate::points`, then writes it in one idempotent transaction), then publish
//! what was newly stored to the live hub.

use tracing::instrument;

use crate::live::LiveHub;
use crate::store::{now_ms, Conflict, MetricPoint, Store, StoreError};

/// Most conflicting points one ingest call reports by name (all of them are counted).
pub const MAX_REPORTED_CONFLICTS: usize = 10;

/// What one ingest call did.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestOutcome {
    /// Points in the request (all of them are now stored).
    pub accepted: usize,
    /// Points that were new; a re-sent batch stores nothing twice.
    pub stored: usize,
    /// Points whose (key, step) was already stored (or repeated in the request) with another
    /// value; the stored value is kept.
    pub conflicts: usize,
    /// The first `MAX_REPORTED_CONFLICTS` of them, in request order.
    pub first_conflicts: Vec<Conflict>,
}

/// Stores and publishes one batch of points for a run. A batch that breaks a rule is refused
/// whole (`StoreError::Rejected`, naming the point and field).
#[instrument(skip(store, live, points), fields(points = points.len()))]
pub async fn ingest_points(
    store: &dyn Store,
    live: &LiveHub,
    run_id: &str,
    points: &[MetricPoint],
) -> Result<IngestOutcome, StoreError> {
    let _order = live.write_order(run_id).await;
    let appended = store.append_points(run_id, points, now_ms()).await?;
    let mut conflicts = appended.conflicts;
    let outcome = IngestOutcome {
        accepted: points.len(),
        stored: appended.stored.len(),
        conflicts: conflicts.len(),
        first_conflicts: {
            conflicts.truncate(MAX_REPORTED_CONFLICTS);
            conflicts
        },
    };
    live.publish_points(run_id, appended.stored);
    Ok(outcome)
}
