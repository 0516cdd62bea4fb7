//! Hyperparameter sweeps in the server: admission of a spec (`admit`), the controller task of
//! each active sweep (`controller`), changes to a running sweep (`change`) and the view the API,
//! the event stream and the pages show (`view`). The search itself is the `sweep` crate: pure
//! functions of the spec and the trials, so a controller that restarts asks again and gets the
//! same answers.
//!
//! `SweepHub` knows the running controller tasks: one per running or paused sweep. Each has a
//! `Notify` to wake it at once (a change, pause, resume or stop) and a revision counter that
//! goes up whenever the sweep's view changed, which the event stream waits on.

pub mod admit;
pub mod change;
mod controller;
pub mod fields;
pub mod hub;
pub mod retry;
pub mod view;

use crate::state::AppState;
pub use hub::{SweepHub, POLL};
pub use retry::Retry;

/// Tag on every trial run: the sweep's id.
pub const SWEEP_TAG: &str = "trainyard.sweep";
/// Tag on every trial run: `<sweep id>/<trial number>` (how a restarted controller finds a run
/// it launched but had not linked yet).
pub const TRIAL_TAG: &str = "trainyard.trial";

impl SweepHub {
    /// Starts the controller of sweep `id` unless one runs already.
    pub fn start(&self, state: &AppState, id: &str) {
        let state = state.clone();
        let owned = id.to_string();
        self.start_with(id, move |wake, revision| {
            controller::run(state, owned, wake, revision)
        });
    }
}

/// Starts a controller for every running or paused sweep (a starting server).
pub async fn resume_all(state: &AppState) {
    match state.store.live_sweeps().await {
        Ok(sweeps) => {
            for sweep in sweeps {
                tracing::info!(sweep = %sweep.id, name = %sweep.name, "resuming sweep");
                state.sweeps.start(state, &sweep.id);
            }
        }
        Err(e) => tracing::error!(error = %e, "could not read the sweeps to resume"),
    }
}
