//! The live hub: fans freshly stored points and status changes out to SSE subscribers.
//!
//! One tokio `broadcast` channel per run, created when the first subscriber arrives and removed
//! when the last one leaves, plus one global channel carrying the status events of every run.
//! The hub only carries what the store already holds, so a subscriber that falls behind (a
//! lagged receiver) loses nothing: it re-reads the gap from the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{broadcast, watch};

use crate::store::{RunEvent, StoredPoint};

/// Messages buffered per run channel before a slow subscriber lags (each may hold a whole batch).
const RUN_CHANNEL_CAPACITY: usize = 256;
/// Status events buffered on the global channel.
const GLOBAL_CHANNEL_CAPACITY: usize = 1024;

/// What a run's subscribers receive.
#[derive(Debug, Clone)]
pub enum RunMessage {
    /// Newly stored points of one batch, in seq order.
    Points(Arc<Vec<StoredPoint>>),
    Status(Arc<RunEvent>),
}

#[derive(Debug)]
pub struct LiveHub {
    runs: Mutex<HashMap<String, broadcast::Sender<RunMessage>>>,
    global: broadcast::Sender<Arc<RunEvent>>,
    /// Flips to `true` when the server shuts down, so endless SSE streams end and let it finish.
    closing: watch::Sender<bool>,
}

impl Default for LiveHub {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveHub {
    pub fn new() -> Self {
        let (global, _) = broadcast::channel(GLOBAL_CHANNEL_CAPACITY);
        LiveHub {
            runs: Mutex::new(HashMap::new()),
            global,
            closing: watch::channel(false).0,
        }
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, broadcast::Sender<RunMessage>>> {
        // The map stays consistent even if a holder panicked: every operation is one insert/remove.
        self.runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Subscribes to one run's points and status changes.
    pub fn subscribe_run(self: &Arc<Self>, run_id: &str) -> RunSubscription {
        let receiver = self
            .channels()
            .entry(run_id.to_string())
            .or_insert_with(|| broadcast::channel(RUN_CHANNEL_CAPACITY).0)
            .subscribe();
        RunSubscription {
            hub: Arc::clone(self),
            run_id: run_id.to_string(),
            receiver: Some(receiver),
        }
    }

    /// Subscribes to the status events of every run.
    pub fn subscribe_all(&self) -> broadcast::Receiver<Arc<RunEvent>> {
        self.global.subscribe()
    }

    /// Publishes points that were just stored. A run nobody watches costs one map lookup.
    pub fn publish_points(&self, run_id: &str, points: Vec<StoredPoint>) {
        if points.is_empty() {
            return;
        }
        self.send_to_run(run_id, RunMessage::Points(Arc::new(points)));
    }

    /// Publishes a recorded status change to the run's subscribers and to the global channel.
    pub fn publish_status(&self, event: RunEvent) {
        let event = Arc::new(event);
        self.send_to_run(&event.run_id, RunMessage::Status(Arc::clone(&event)));
        // No receivers is normal (no dashboard open).
        let _ = self.global.send(event);
    }

    fn send_to_run(&self, run_id: &str, message: RunMessage) {
        let mut channels = self.channels();
        if let Some(sender) = channels.get(run_id) {
            if sender.send(message).is_err() {
                channels.remove(run_id);
            }
        }
    }

    /// Tells every stream to end (server shutdown).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Completes once `close` has been called.
    pub async fn closed(&self) {
        let mut rx = self.closing.subscribe();
        // An error means the sender is gone, which only happens with the hub itself.
        let _ = rx.wait_for(|closing| *closing).await;
    }

    /// Number of runs with a live channel (for tests and diagnostics).
    pub fn active_runs(&self) -> usize {
        self.channels().len()
    }
}

/// A receiver for one run; dropping the last one removes the run's channel.
pub struct RunSubscription {
    hub: Arc<LiveHub>,
    run_id: String,
    receiver: Option<broadcast::Receiver<RunMessage>>,
}

impl RunSubscription {
    pub async fn recv(&mut self) -> Result<RunMessage, broadcast::error::RecvError> {
        match self.receiver.as_mut() {
            Some(receiver) => receiver.recv().await,
            None => Err(broadcast::error::RecvError::Closed),
        }
    }
}

impl Drop for RunSubscription {
    fn drop(&mut self) {
        drop(self.receiver.take());
        let mut channels = self.hub.channels();
        if channels
            .get(&self.run_id)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            channels.remove(&self.run_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RunStatus;

    fn point(seq: i64) -> StoredPoint {
        StoredPoint {
            key: "loss".into(),
            step: seq,
            value: 1.0,
            time: 0,
            seq,
        }
    }

    #[tokio::test]
    async fn a_subscriber_receives_points_published_after_it_subscribed() {
        let hub = Arc::new(LiveHub::new());
        let mut sub = hub.subscribe_run("r1");
        hub.publish_points("r1", vec![point(1), point(2)]);
        match sub.recv().await {
            Ok(RunMessage::Points(points)) => assert_eq!(points.len(), 2),
            other => panic!("expected points, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_run_channel_is_removed_when_its_last_subscriber_leaves() {
        let hub = Arc::new(LiveHub::new());
        let a = hub.subscribe_run("r1");
        let b = hub.subscribe_run("r1");
        assert_eq!(hub.active_runs(), 1);
        drop(a);
        assert_eq!(hub.active_runs(), 1);
        drop(b);
        assert_eq!(hub.active_runs(), 0);
    }

    #[tokio::test]
    async fn a_status_change_reaches_the_run_and_the_global_channel() {
        let hub = Arc::new(LiveHub::new());
        let mut run_sub = hub.subscribe_run("r1");
        let mut all = hub.subscribe_all();
        hub.publish_status(RunEvent {
            seq: 7,
            run_id: "r1".into(),
            time: 0,
            from_status: Some(RunStatus::Created),
            to_status: RunStatus::Running,
            reason: None,
        });
        assert!(matches!(run_sub.recv().await, Ok(RunMessage::Status(e)) if e.seq == 7));
        assert_eq!(all.recv().await.map(|e| e.seq).ok(), Some(7));
    }
}
