//! fANOVA parameter importance (Hutter, Hoos and Leyton-Brown, 2014): fit a random forest from
//! parameters to objective, and for each tree take the variance of its marginal prediction over
//! one parameter (the other parameters integrated out over their whole range) as a fraction of
//! the tree's total variance; average over trees.

use std::collections::BTreeMap;

use crate::forest::{fit, Data, ForestConfig, Leaf};
use crate::space::{self, Axis};
use crate::stats::{rng_for, STREAM_FOREST};
use crate::{SweepSpec, Trial, TrialState};

/// Fitting cost grows with the square of the trial count; beyond this many the most recent
/// complete trials stand for the sweep.
const MAX_ROWS: usize = 2000;

/// Each parameter's share of the objective's variance explained by that parameter alone (its
/// fANOVA main effect). The shares sum to at most 1: the rest is interactions between
/// parameters. Constants get 0. Empty when fewer than 2 complete trials have a finite value the
/// current space can place. Deterministic for a given seed.
pub fn importance(spec: &SweepSpec, trials: &[Trial]) -> BTreeMap<String, f64> {
    let searched: Vec<(&String, &crate::Param, Axis)> = spec
        .parameters
        .iter()
        .map(|(k, p)| (k, p, space::axis(p)))
        .filter(|(_, _, a)| *a != Axis::Fixed)
        .collect();
    let mut usable: Vec<&Trial> = trials
        .iter()
        .filter(|t| t.state == TrialState::Complete && t.value.is_some_and(f64::is_finite))
        .collect();
    usable.sort_by_key(|t| std::cmp::Reverse(t.number));
    let mut x = Vec::new();
    let mut y = Vec::new();
    for t in usable {
        if x.len() == MAX_ROWS {
            break;
        }
        let row: Option<Vec<f64>> = searched
            .iter()
            .map(|(key, param, axis)| {
                let v = space::encode(param, t.params.get(*key)?)?;
                Some(match *axis {
                    Axis::Choice(k) => (v + 0.5) / k as f64,
                    Axis::Num { lo, hi, .. } => ((v - lo) / (hi - lo)).clamp(0.0, 1.0),
                    Axis::Fixed => 0.0,
                })
            })
            .collect();
        if let (Some(row), Some(v)) = (row, t.value) {
            x.push(row);
            y.push(v);
        }
    }
    if y.len() < 2 {
        return BTreeMap::new();
    }
    let mut out: BTreeMap<String, f64> = spec.parameters.keys().map(|k| (k.clone(), 0.0)).collect();
    if searched.is_empty() {
        return out;
    }
    let cells: Vec<Option<usize>> = searched
        .iter()
        .map(|(_, _, axis)| match *axis {
            Axis::Choice(k) => Some(k),
            Axis::Num {
                lo,
                hi,
                step: Some(step),
            } => Some(((hi - lo) / step).round().max(1.0) as usize),
            _ => None,
        })
        .collect();
    let dims = searched.len();
    let cfg = ForestConfig {
        trees: 64,
        max_features: (2 * dims).div_ceil(3),
        min_leaf: 1,
        max_depth: 64,
    };
    let mut rng = rng_for(spec.seed, 0, STREAM_FOREST);
    let forest = fit(
        &Data {
            x: &x,
            y: &y,
            cells: &cells,
        },
        &cfg,
        &mut rng,
    );

    let mut sums = vec![0.0; dims];
    let mut counted = 0usize;
    for leaves in &forest {
        if let Some(fractions) = tree_main_effects(leaves, dims) {
            for (s, f) in sums.iter_mut().zip(fractions) {
                *s += f;
            }
            counted += 1;
        }
    }
    if counted > 0 {
        for ((key, _, _), s) in searched.iter().zip(sums) {
            out.insert((*key).clone(), s / counted as f64);
        }
    }
    out
}

/// For one tree (a piecewise-constant function on the unit cube), each dimension's main-effect
/// variance over the total variance; None for a constant tree.
fn tree_main_effects(leaves: &[Leaf], dims: usize) -> Option<Vec<f64>> {
    let vols: Vec<f64> = leaves
        .iter()
        .map(|l| l.lo.iter().zip(&l.hi).map(|(a, b)| b - a).product())
        .collect();
    let mean: f64 = leaves.iter().zip(&vols).map(|(l, v)| v * l.value).sum();
    let total: f64 = leaves
        .iter()
        .zip(&vols)
        .map(|(l, v)| v * (l.value - mean).powi(2))
        .sum();
    if total <= 1e-12 * mean.abs().max(1.0).powi(2) {
        return None;
    }
    Some(
        (0..dims)
            .map(|d| {
                // The marginal over dimension d is piecewise constant between the leaves' edges
                // along d: each leaf adds value * (its volume / its width along d) wherever it
                // spans. A sweep over the sorted edges accumulates it.
                let mut events: Vec<(f64, f64)> = Vec::with_capacity(2 * leaves.len());
                for (l, vol) in leaves.iter().zip(&vols) {
                    let width = l.hi[d] - l.lo[d];
                    if width > 0.0 {
                        let height = l.value * vol / width;
                        events.push((l.lo[d], height));
                        events.push((l.hi[d], -height));
                    }
                }
                events.sort_by(|a, b| a.0.total_cmp(&b.0));
                let mut var = 0.0;
                let mut level = 0.0;
                let mut at = 0.0;
                for (pos, delta) in events {
                    var += (pos - at) * (level - mean).powi(2);
                    level += delta;
                    at = pos;
                }
                var / total
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(lo: [f64; 2], hi: [f64; 2], value: f64) -> Leaf {
        Leaf {
            lo: lo.to_vec(),
            hi: hi.to_vec(),
            value,
        }
    }

    #[test]
    fn a_tree_split_on_one_dimension_gives_it_all_the_variance() {
        let leaves = [
            leaf([0.0, 0.0], [0.5, 1.0], 0.0),
            leaf([0.5, 0.0], [1.0, 1.0], 1.0),
        ];
        let f = tree_main_effects(&leaves, 2).unwrap();
        assert!((f[0] - 1.0).abs() < 1e-12 && f[1].abs() < 1e-12, "{f:?}");
    }

    #[test]
    fn a_pure_interaction_has_no_main_effects_and_an_additive_tree_splits_evenly() {
        // XOR on the four quadrants: each marginal is flat.
        let xor = [
            leaf([0.0, 0.0], [0.5, 0.5], 0.0),
            leaf([0.5, 0.0], [1.0, 0.5], 1.0),
            leaf([0.0, 0.5], [0.5, 1.0], 1.0),
            leaf([0.5, 0.5], [1.0, 1.0], 0.0),
        ];
        let f = tree_main_effects(&xor, 2).unwrap();
        assert!(f.iter().all(|x| x.abs() < 1e-12), "{f:?}");
        // y = [x0 > 0.5] + [x1 > 0.5]: half each.
        let sum = [
            leaf([0.0, 0.0], [0.5, 0.5], 0.0),
            leaf([0.5, 0.0], [1.0, 0.5], 1.0),
            leaf([0.0, 0.5], [0.5, 1.0], 1.0),
            leaf([0.5, 0.5], [1.0, 1.0], 2.0),
        ];
        let f = tree_main_effects(&sum, 2).unwrap();
        assert!(
            (f[0] - 0.5).abs() < 1e-12 && (f[1] - 0.5).abs() < 1e-12,
            "{f:?}"
        );
        assert!(tree_main_effects(&[leaf([0.0, 0.0], [1.0, 1.0], 3.0)], 2).is_none());
    }
}
