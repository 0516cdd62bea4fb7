//! The access epoch: a counter that account changes bump, so that every open event stream
//! checks its caller's access again (`revocation::StreamAccess`).

use tokio::sync::watch;

/// A counter that goes up whenever access may have been taken away somewhere.
#[derive(Debug)]
pub struct AccessEpoch {
    epoch: watch::Sender<u64>,
}

impl Default for AccessEpoch {
    fn default() -> Self {
        Self::new()
    }
}

impl AccessEpoch {
    pub fn new() -> Self {
        AccessEpoch {
            epoch: watch::channel(0).0,
        }
    }

    /// Tells every open stream to check its access again. Call it after the change is stored.
    pub fn bump(&self) {
        self.epoch.send_modify(|e| *e = e.wrapping_add(1));
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }
}
