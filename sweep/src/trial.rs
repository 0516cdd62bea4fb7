//! What the server knows about each trial, as the search and the stopping rules read it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Params;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TrialState {
    Running,
    Complete,
    Pruned,
    Failed,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Trial {
    /// 0, 1, 2, ... in suggestion order.
    pub number: u32,
    pub params: Params,
    pub state: TrialState,
    /// The objective: for Complete (and Pruned) trials, the last reported metric value.
    #[serde(default)]
    pub value: Option<f64>,
    /// Step -> metric value reported so far.
    #[serde(default)]
    pub intermediate: BTreeMap<u64, f64>,
    /// Rung index -> the trial's metric value at that rung (ASHA and Hyperband), kept by `judge`.
    #[serde(default)]
    pub rungs: BTreeMap<u32, f64>,
    /// The Hyperband bracket (see `assign_bracket`).
    #[serde(default)]
    pub bracket: Option<u32>,
}

impl Trial {
    /// A new running trial with no reports yet.
    pub fn new(number: u32, params: Params) -> Trial {
        Trial {
            number,
            params,
            state: TrialState::Running,
            value: None,
            intermediate: BTreeMap::new(),
            rungs: BTreeMap::new(),
            bracket: None,
        }
    }

    /// The finite reports, in step order (NaN and infinities are ignored everywhere).
    pub(crate) fn reports(&self) -> impl DoubleEndedIterator<Item = (u64, f64)> + '_ {
        self.intermediate
            .iter()
            .map(|(&s, &v)| (s, v))
            .filter(|(_, v)| v.is_finite())
    }

    /// The last step with a finite report.
    pub(crate) fn last_step(&self) -> Option<u64> {
        self.reports().next_back().map(|(s, _)| s)
    }

    /// The value the trial had at `step`: its last report at or before it, else its first after.
    pub(crate) fn value_at(&self, step: u64) -> Option<f64> {
        self.reports()
            .take_while(|&(s, _)| s <= step)
            .last()
            .or_else(|| self.reports().find(|&(s, _)| s > step))
            .map(|(_, v)| v)
    }
}

/// What `judge` decided for a running trial.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "verdict", rename_all = "lowercase")]
pub enum Verdict {
    Continue,
    Prune { reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn trials_store_as_json_with_lowercase_states_and_read_back_without_bookkeeping() {
        let mut t = Trial::new(3, [("lr".to_string(), json!(0.1))].into_iter().collect());
        t.intermediate.insert(10, 1.5);
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["state"], json!("running"));
        assert_eq!(serde_json::from_value::<Trial>(v).unwrap(), t);
        let bare: Trial =
            serde_json::from_value(json!({"number": 1, "params": {}, "state": "pruned"})).unwrap();
        assert_eq!(bare.state, TrialState::Pruned);
        assert!(bare.rungs.is_empty() && bare.bracket.is_none());
    }

    #[test]
    fn the_value_at_a_step_is_the_last_finite_report_at_or_before_it_else_the_first_after() {
        let mut t = Trial::new(0, Params::new());
        t.intermediate = [(5, 3.0), (10, f64::NAN), (20, 2.0)].into_iter().collect();
        assert_eq!(t.value_at(10), Some(3.0));
        assert_eq!(t.value_at(2), Some(3.0));
        assert_eq!(t.value_at(25), Some(2.0));
        assert_eq!(t.last_step(), Some(20));
    }
}
