//! The live hub: fans freshly stored points and status changes out to SSE subscribers.
//!
//! One tokio `broadcast` channel per run, created when the first subscriber arrives and removed
//! when the last one leaves, plus one global channel carrying the status events of every run.
//! The hub only carries what the store already holds, so a subscriber that falls behind (a
//! lagged receiver) loses nothing: it re-reads the gap from the store.
//!
//! The hub also counts the event streams each caller holds open ([`StreamSlots`]): one
//! principal (a user, the admin token, a run's token) and one client address hold at most
//! their share ([`StreamLimits`]), so one reader cannot take every connection the server has.

/// The event names of the API's server-sent event streams, for the server that sends them and
/// the client (`client::sse`) and the tests that read them. `static/live.js` listens for the
/// same names.
pub mod names {
    /// A run's stream (`GET /api/v1/runs/{id}/events`): new points of the run.
    pub const POINTS: &str = "points";
    /// A run's stream and the global one (`GET /api/v1/events`): a status change.
    pub const STATUS: &str = "status";
    /// The global stream: the reader fell behind and missed status changes; read the runs
    /// again.
    pub const LAGGED: &str = "lagged";
    /// The last event of a run stream the server had to end on its own failure. Not `error`:
    /// in the browser that name is EventSource's own connection-error event, which a listener
    /// could not tell apart from this one.
    pub const STREAM_ERROR: &str = "stream_error";
    /// `GET /api/v1/runs/{id}/logs?follow=true`: output of the run, `{offset, text}`.
    pub const LOG: &str = "log";
    /// `GET /api/v1/runs/{id}/logs?follow=true`: the run ended, `{status}`; nothing follows.
    pub const END: &str = "end";
    /// `GET /api/v1/sweeps/{id}/events`: the sweep as `GET /api/v1/sweeps/{id}` shows it.
    pub const SWEEP: &str = "sweep";
}

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{broadcast, watch};

use crate::store::{RunEvent, StoredPoint};

/// Messages buffered per run channel before a slow subscriber lags (each may hold a whole batch).
const RUN_CHANNEL_CAPACITY: usize = 256;
/// Status events buffered on the global channel.
const GLOBAL_CHANNEL_CAPACITY: usize = 1024;
/// Write-order locks, shared by hashing run ids (no per-run bookkeeping to clean up).
const WRITE_STRIPES: usize = 256;

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
    write_order: Vec<tokio::sync::Mutex<()>>,
    /// Event streams open per principal and per client address.
    streams: Arc<StreamSlots>,
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
            write_order: (0..WRITE_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            streams: Arc::default(),
        }
    }

    /// A slot for one more event stream of `principal` (`None`: not counted per principal)
    /// from `address` (`None`: unknown), or why not. The slot is given back when dropped.
    pub fn open_stream(
        &self,
        principal: Option<&str>,
        address: Option<IpAddr>,
        limits: StreamLimits,
    ) -> Result<StreamSlot, StreamRefusal> {
        self.streams.take(principal, address, limits)
    }

    /// Event streams `principal` holds open now (for tests and diagnostics).
    pub fn open_streams_of(&self, principal: &str) -> usize {
        self.streams
            .count()
            .principals
            .get(principal)
            .copied()
            .unwrap_or(0)
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, broadcast::Sender<RunMessage>>> {
        // The map stays consistent even if a holder panicked: every operation is one insert/remove.
        self.runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Held across "store, then publish" for one run. The store gives a run's writes
    /// increasing seqs in commit order; this lock makes the hub publish them in that same
    /// order, so a subscriber that drops every seq it has already passed never drops one it
    /// has not seen.
    pub async fn write_order(&self, run_id: &str) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        run_id.hash(&mut hasher);
        let stripe = (hasher.finish() % WRITE_STRIPES as u64) as usize;
        self.write_order[stripe].lock().await
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

/// Event streams one principal may hold open at once by default: far more than the browser
/// tabs (two streams each at most) and `--follow` commands of one person, and a sixteenth of
/// the default connection cap.
pub const DEFAULT_STREAMS_PER_PRINCIPAL: usize = 32;
/// Event streams one client address may hold open at once by default: three quarters of its
/// default share of connections, so an address at its stream cap can still make requests.
pub const DEFAULT_STREAMS_PER_ADDRESS: usize = 48;

/// How many event streams one caller may hold open at once (`--max-streams-per-principal`,
/// `--max-streams-per-address`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    pub per_principal: usize,
    pub per_address: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            per_principal: DEFAULT_STREAMS_PER_PRINCIPAL,
            per_address: DEFAULT_STREAMS_PER_ADDRESS,
        }
    }
}

/// Why a stream was refused: whose share is used up, and how large it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRefusal {
    Principal { cap: usize },
    Address { cap: usize },
}

/// The event streams open per principal and per client address.
#[derive(Debug, Default)]
pub struct StreamSlots {
    open: Mutex<SlotCounts>,
}

#[derive(Debug, Default)]
struct SlotCounts {
    principals: HashMap<String, usize>,
    addresses: HashMap<IpAddr, usize>,
}

impl StreamSlots {
    fn count(&self) -> MutexGuard<'_, SlotCounts> {
        // Every operation is one check and one update: consistent even after a panic.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a slot when neither share is used up (a cap of 0 counts as 1). IPv4-mapped IPv6
    /// addresses count as their IPv4 one.
    pub fn take(
        self: &Arc<Self>,
        principal: Option<&str>,
        address: Option<IpAddr>,
        limits: StreamLimits,
    ) -> Result<StreamSlot, StreamRefusal> {
        let address = address.map(|a| a.to_canonical());
        let mut open = self.count();
        if let Some(p) = principal {
            let cap = limits.per_principal.max(1);
            if open.principals.get(p).copied().unwrap_or(0) >= cap {
                return Err(StreamRefusal::Principal { cap });
            }
        }
        if let Some(a) = address {
            let cap = limits.per_address.max(1);
            if open.addresses.get(&a).copied().unwrap_or(0) >= cap {
                return Err(StreamRefusal::Address { cap });
            }
        }
        if let Some(p) = principal {
            *open.principals.entry(p.to_owned()).or_insert(0) += 1;
        }
        if let Some(a) = address {
            *open.addresses.entry(a).or_insert(0) += 1;
        }
        Ok(StreamSlot {
            slots: Arc::clone(self),
            principal: principal.map(str::to_owned),
            address,
        })
    }
}

/// One open stream's place in its principal's and its address's count; given back on drop,
/// when the stream ends (the client went away, the server ended it, or it was never served).
#[derive(Debug)]
pub struct StreamSlot {
    slots: Arc<StreamSlots>,
    principal: Option<String>,
    address: Option<IpAddr>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.slots.count();
        if let Some(p) = self.principal.take() {
            if let Some(n) = open.principals.get_mut(&p) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.principals.remove(&p);
                }
            }
        }
        if let Some(a) = self.address.take() {
            if let Some(n) = open.addresses.get_mut(&a) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.addresses.remove(&a);
                }
            }
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

    fn limits(per_principal: usize, per_address: usize) -> StreamLimits {
        StreamLimits {
            per_principal,
            per_address,
        }
    }

    #[test]
    fn a_principal_over_its_share_of_streams_is_refused_while_another_is_not() {
        let hub = LiveHub::new();
        let here: IpAddr = [127, 0, 0, 1].into();
        let caps = limits(2, 100);
        let held: Vec<StreamSlot> = (0..2)
            .map(|_| {
                hub.open_stream(Some("user:a"), Some(here), caps)
                    .expect("slot")
            })
            .collect();
        assert_eq!(
            hub.open_stream(Some("user:a"), Some(here), caps).err(),
            Some(StreamRefusal::Principal { cap: 2 })
        );
        assert!(hub.open_stream(Some("user:b"), Some(here), caps).is_ok());
        assert_eq!(hub.open_streams_of("user:a"), 2);
        drop(held);
        assert_eq!(hub.open_streams_of("user:a"), 0);
        assert!(hub.open_stream(Some("user:a"), Some(here), caps).is_ok());
    }

    #[test]
    fn an_address_over_its_share_is_refused_and_a_refusal_takes_nothing() {
        let hub = LiveHub::new();
        let one: IpAddr = [127, 0, 0, 1].into();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().expect("address");
        let caps = limits(100, 1);
        let _held = hub.open_stream(None, Some(one), caps).expect("slot");
        assert_eq!(
            hub.open_stream(Some("user:a"), Some(mapped), caps).err(),
            Some(StreamRefusal::Address { cap: 1 })
        );
        // The refused stream did not count against its principal.
        assert_eq!(hub.open_streams_of("user:a"), 0);
        assert!(hub
            .open_stream(Some("user:a"), Some([127, 0, 0, 2].into()), caps)
            .is_ok());
        // Neither principal nor address known: nothing to count against.
        assert!(hub.open_stream(None, None, caps).is_ok());
    }
}
