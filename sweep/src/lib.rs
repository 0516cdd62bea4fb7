//! Hyperparameter search for Trainyard sweeps: the sweep spec, grid, random and TPE search,
//! ASHA, median and Hyperband early stopping, and fANOVA parameter importance.
//!
//! Everything here is a pure function of its arguments: the server's sweep controller keeps the
//! state (trials, their metric values, the rung bookkeeping) in its database and asks again
//! after a restart, getting the same answers.

use std::collections::BTreeMap;

mod forest;
mod grid;
mod importance;
mod params;
mod parse;
mod parzen;
mod prune;
mod random;
mod space;
mod spec;
mod stats;
pub mod testfns;
mod tpe;
mod trial;

pub use importance::importance;
pub use prune::{assign_bracket, judge, next_rung};
pub use spec::{
    Base, Command, EarlyTerminate, Goal, Method, Metric, Param, Resources, SpecError, SweepSpec,
};
pub use trial::{Trial, TrialState, Verdict};

/// A trial's parameters: config key path -> value.
pub type Params = BTreeMap<String, serde_json::Value>;

/// The parameters of trial `number`, or None when the sweep has no more to give: the grid is
/// exhausted or `number` reached `max_trials`.
///
/// Deterministic: the random numbers depend only on (seed, number), and only trials numbered
/// below `number` are looked at, so re-asking after a restart gives the same answer for the same
/// history. History values the current space cannot produce (the spec changed mid-sweep) are
/// ignored for that parameter.
pub fn suggest(spec: &SweepSpec, trials: &[Trial], number: u32) -> Option<Params> {
    if number >= spec.max_trials {
        return None;
    }
    let earlier: Vec<&Trial> = trials.iter().filter(|t| t.number < number).collect();
    match spec.method {
        Method::Grid => grid::suggest(spec, &earlier),
        Method::Random => Some(random::suggest(spec, number)),
        Method::Tpe => Some(tpe::suggest(spec, &earlier, number)),
    }
}
