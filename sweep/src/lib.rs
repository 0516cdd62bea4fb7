//! Hyperparameter search for Trainyard sweeps: the sweep spec, grid, random, TPE and
//! Gaussian-process search, ASHA, median and Hyperband early stopping, and fANOVA parameter
//! importance.
//!
//! Everything here is a pure function of its arguments: the server's sweep controller keeps the
//! state (trials, their metric values, the rung bookkeeping) in its database and asks again
//! after a restart, getting the same answers.

use std::collections::BTreeMap;

mod dims;
mod forest;
mod gp;
mod grid;
mod history;
mod importance;
mod optim;
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
    AUTO_BAYES_MAX_PARAMS, AUTO_BAYES_MAX_TRIALS,
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
///
/// A model-based suggestion (`tpe`, `bayes`) is CPU work: up to a few hundred milliseconds for
/// a GP over hundreds of trials. An async caller should run it on a blocking thread.
pub fn suggest(spec: &SweepSpec, trials: &[Trial], number: u32) -> Option<Params> {
    if number >= spec.max_trials {
        return None;
    }
    let earlier: Vec<&Trial> = trials.iter().filter(|t| t.number < number).collect();
    match spec.method.resolve(spec) {
        Method::Grid => grid::suggest(spec, &earlier),
        Method::Random => Some(random::suggest(spec, number)),
        Method::Tpe | Method::Auto => Some(tpe::suggest(spec, &earlier, number)),
        Method::Bayes => Some(gp::suggest(spec, &earlier, number)),
    }
}

/// Whether the sweep has nothing more to suggest at trial `number` (the budget is spent, or a
/// grid is exhausted): what `suggest(..).is_none()` says, without the cost of a model-based
/// suggestion.
pub fn exhausted(spec: &SweepSpec, trials: &[Trial], number: u32) -> bool {
    if number >= spec.max_trials {
        return true;
    }
    match spec.method {
        Method::Grid => suggest(spec, trials, number).is_none(),
        _ => false,
    }
}
