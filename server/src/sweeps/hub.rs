//! `SweepHub`: the running controller tasks, one per running or paused sweep, each with a
//! `Notify` to wake it at once, and a revision counter per watched sweep that goes up whenever
//! the sweep's view changed, which the event stream waits on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::retry::Retry;

/// How often a controller looks at its trials when nothing wakes it.
pub const POLL: Duration = Duration::from_millis(500);

struct Handle {
    wake: Arc<Notify>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Parameter importance of a sweep, as computed for a spec version and a number of complete
/// trials (complete trials never change, so the pair says whether it is still current).
type Importance = ((i64, usize), std::collections::BTreeMap<String, f64>);

/// The controllers of active sweeps and the revision counters of all watched sweeps.
pub struct SweepHub {
    controllers: Mutex<HashMap<String, Handle>>,
    revisions: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Importance is a forest fit (up to a few hundred milliseconds for a thousand trials):
    /// computed once per change of the complete trials, not for every event of every viewer.
    importance: Mutex<HashMap<String, Importance>>,
    /// How often a controller looks at its trials when nothing wakes it.
    pub poll: Duration,
    /// How a controller whose step failed tries again.
    pub retry: Retry,
}

impl SweepHub {
    pub fn new(poll: Duration) -> SweepHub {
        SweepHub {
            controllers: Mutex::new(HashMap::new()),
            revisions: Mutex::new(HashMap::new()),
            importance: Mutex::new(HashMap::new()),
            poll,
            retry: Retry::default(),
        }
    }

    /// The same hub with another retry policy.
    pub fn with_retry(mut self, retry: Retry) -> SweepHub {
        self.retry = retry;
        self
    }

    fn controllers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handle>> {
        self.controllers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn revision(&self, id: &str) -> watch::Sender<u64> {
        let mut map = self
            .revisions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(id.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .clone()
    }

    /// Starts the task `controller(wake, revision)` as the controller of sweep `id` unless one
    /// runs already.
    pub(super) fn start_with<F>(
        &self,
        id: &str,
        controller: impl FnOnce(Arc<Notify>, watch::Sender<u64>) -> F,
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut controllers = self.controllers();
        if controllers
            .get(id)
            .and_then(|h| h.task.as_ref())
            .is_some_and(|t| !t.is_finished())
        {
            return;
        }
        let wake = Arc::new(Notify::new());
        let task = tokio::spawn(controller(wake.clone(), self.revision(id)));
        controllers.insert(
            id.to_string(),
            Handle {
                wake,
                task: Some(task),
            },
        );
    }

    /// Wakes the controller of sweep `id` now (its spec or state changed).
    pub fn wake(&self, id: &str) {
        if let Some(h) = self.controllers().get(id) {
            h.wake.notify_one();
        }
    }

    /// Tells watchers of sweep `id` that its view changed.
    pub fn changed(&self, id: &str) {
        self.revision(id).send_modify(|r| *r = r.wrapping_add(1));
    }

    /// A receiver that sees every later change of sweep `id`.
    pub fn subscribe(&self, id: &str) -> watch::Receiver<u64> {
        self.revision(id).subscribe()
    }

    /// The importance of sweep `id` if it was computed for this `key` (spec version, complete
    /// trials).
    pub fn cached_importance(
        &self,
        id: &str,
        key: (i64, usize),
    ) -> Option<std::collections::BTreeMap<String, f64>> {
        let map = self
            .importance
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(id)
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v.clone())
    }

    pub fn remember_importance(
        &self,
        id: &str,
        key: (i64, usize),
        value: std::collections::BTreeMap<String, f64>,
    ) {
        self.importance
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id.to_string(), (key, value));
    }

    /// Stops every controller task (server shutdown); their sweeps continue at the next start.
    pub fn abort_all(&self) {
        for (_, handle) in self.controllers().drain() {
            if let Some(task) = handle.task {
                task.abort();
            }
        }
    }
}
