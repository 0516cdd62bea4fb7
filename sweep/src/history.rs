//! What the model-based samplers learn from: the finished trials ranked by objective, and the
//! running ones.

use crate::spec::SweepSpec;
use crate::{Trial, TrialState};

/// A finished trial with its objective, negated when maximizing so that lower is better.
#[derive(Clone, Copy)]
pub(crate) struct Finished<'a> {
    pub trial: &'a Trial,
    pub value: f64,
    /// 0 for complete, 1 for pruned: a pruned trial ranks after a complete one of equal value.
    pub tier: u8,
}

pub(crate) struct History<'a> {
    /// Best first: by value, then complete before pruned, then by number.
    pub finished: Vec<Finished<'a>>,
    /// Running trials, by number.
    pub running: Vec<&'a Trial>,
}

/// A finished trial's objective: a Complete trial's value, or for a Pruned trial (or a Complete
/// one that never set a value) its last finite report.
fn objective(t: &Trial) -> Option<f64> {
    t.value
        .filter(|v| v.is_finite())
        .or_else(|| t.reports().next_back().map(|(_, v)| v))
}

pub(crate) fn history<'a>(spec: &SweepSpec, earlier: &[&'a Trial]) -> History<'a> {
    let sign = if spec.maximize() { -1.0 } else { 1.0 };
    let mut finished = Vec::new();
    let mut running = Vec::new();
    for &t in earlier {
        let tier = match t.state {
            TrialState::Complete => 0,
            TrialState::Pruned => 1,
            TrialState::Running => {
                running.push(t);
                continue;
            }
            TrialState::Failed => continue,
        };
        if let Some(v) = objective(t) {
            finished.push(Finished {
                trial: t,
                value: sign * v,
                tier,
            });
        }
    }
    finished.sort_by(|a, b| {
        a.value
            .total_cmp(&b.value)
            .then(a.tier.cmp(&b.tier))
            .then(a.trial.number.cmp(&b.trial.number))
    });
    running.sort_by_key(|t| t.number);
    History { finished, running }
}
