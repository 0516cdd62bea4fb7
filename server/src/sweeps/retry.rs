//! What a sweep controller does when a step fails: it tries again after a wait that doubles
//! each time ([`Retry`]), and after that many failures in a row marks the sweep `failed` with
//! the last error (`give_up`). A database that cannot be reached is waited out without
//! counting (`is_outage`): the sweep did nothing wrong.

use std::time::Duration;

use crate::access::audit;
use crate::access::audit::AuditAction;
use crate::store::sweeps::SweepState;
use crate::store::{Store, StoreError};

/// How a controller whose step failed tries again: after `first`, then twice as long after
/// each further failure, never longer than `max`; after `attempts` failures in a row the sweep
/// is marked `failed` with the last error. An unreachable database is waited out with the same
/// waits, without counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub first: Duration,
    pub max: Duration,
    pub attempts: u32,
}

impl Default for Retry {
    /// 1 s, 2 s, 4 s ... up to a minute; failed after 8 failures in a row (about two minutes).
    fn default() -> Self {
        Retry {
            first: Duration::from_secs(1),
            max: Duration::from_secs(60),
            attempts: 8,
        }
    }
}

impl Retry {
    /// The wait after the `failures`-th failure in a row (1 for the first).
    pub fn delay(&self, failures: u32) -> Duration {
        let doubled = self
            .first
            .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
        doubled.min(self.max)
    }
}

/// Whether a step failed because the database could not be reached (nothing the sweep did).
pub(super) fn is_outage(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<StoreError>(),
        Some(StoreError::Unavailable(_))
    )
}

/// Most characters of the last error kept in a failed sweep's message.
const FAILURE_MESSAGE_CHARS: usize = 500;

/// Marks sweep `id` failed after `failures` failed steps in a row, saying why (and audits it).
/// A sweep that ended meanwhile (stopped by a user) keeps its end.
pub(super) async fn give_up(
    store: &dyn Store,
    id: &str,
    failures: u32,
    error: &anyhow::Error,
) -> Result<(), StoreError> {
    if store.get_sweep(id).await?.state.is_over() {
        return Ok(());
    }
    // Control characters escaped: the error may quote a value of the spec.
    let last: String = format!("{error:#}")
        .chars()
        .take(FAILURE_MESSAGE_CHARS)
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect();
    let message = format!("failed: its controller failed {failures} times in a row; last: {last}");
    store
        .set_sweep_state(id, SweepState::Failed, Some(&message))
        .await?;
    tracing::error!(sweep = %id, "{message}");
    let client = format!("sweep {id}");
    audit::record(
        store,
        Some("server".into()),
        Some(&client),
        AuditAction::SweepFail,
        Some(id),
        Some(message),
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_controller_waits_twice_as_long_each_time_up_to_the_cap() {
        let retry = Retry {
            first: Duration::from_millis(100),
            max: Duration::from_millis(700),
            attempts: 8,
        };
        let waits: Vec<u128> = (1..=6).map(|n| retry.delay(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 700, 700, 700]);
        // However many failures: still the cap, never an overflow.
        assert_eq!(retry.delay(u32::MAX), Duration::from_millis(700));
    }
}
