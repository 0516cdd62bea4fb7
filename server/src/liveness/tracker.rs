//! What the liveness watch remembers: each run's last sign of life, in memory.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use crate::store::now_ms;

/// Last signs of life of runs reporting from elsewhere, and the runs marked `lost` here.
pub struct Liveness {
    /// Run id → unix ms of its client's last sign of life.
    last_seen: Mutex<HashMap<String, i64>>,
    /// Runs this server marked `lost` since it started.
    marked: Mutex<HashSet<String>>,
    /// When this server started: the earliest a silence can be counted from.
    pub(super) started_ms: i64,
    pub(super) lost_after: Duration,
}

impl Liveness {
    pub fn new(lost_after: Duration) -> Self {
        Liveness {
            last_seen: Mutex::new(HashMap::new()),
            marked: Mutex::new(HashSet::new()),
            started_ms: now_ms(),
            lost_after,
        }
    }

    pub fn lost_after(&self) -> Duration {
        self.lost_after
    }

    pub(super) fn marked(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.marked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn seen_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts).
        self.last_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes a sign of life without reviving (a client that reports its own new status).
    pub fn record(&self, run_id: &str) {
        self.seen_map().insert(run_id.to_string(), now_ms());
    }

    pub(super) fn last_seen(&self, run_id: &str) -> Option<i64> {
        self.seen_map().get(run_id).copied()
    }
}
