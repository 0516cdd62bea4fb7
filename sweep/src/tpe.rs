//! The Tree-structured Parzen Estimator (Bergstra et al., 2011) in the multivariate form that is
//! Optuna's default: the parameters are modelled jointly, with Optuna's defaults (10 random
//! start-up trials, a good set of the best min(ceil(n/10), 25) finished trials, 24 candidates
//! drawn from the good-set density l(x) and the one maximizing l(x)/g(x) kept, prior weight 1
//! in g(x), the age ramp of the bad set's weights, the constant liar for running trials).
//!
//! Two departures, both from Watanabe's 2023 ablation study of TPE's components, and both
//! measured (bench/sweep_quality.py) to find better values in the same budget: a good trial
//! weighs in l(x) by how far it beats the best bad one (with the prior weighing as much as an
//! average good trial), so l(x) centres on the best trials rather than on all good ones alike;
//! and kernels may narrow to width · max(0.02, 1/(n + 2)²) rather than width / (n + 2), so the
//! search can converge finely once the good trials agree (`parzen::bandwidths`).
//!
//! When the spec changed mid-sweep, earlier trials may hold values the current space cannot
//! produce for some parameters. The parameters are then split into groups that every trial
//! either has whole or not at all (the finest such partition), and each group is modelled
//! jointly from the trials that have it: a parameter is never modelled from a trial that lacks
//! a valid value for it, and parameters that always appear together stay together.

use rand::Rng;

use crate::dims::{self, Dim, Kind};
use crate::history::history;
use crate::parzen::{ramp_weights, Mixture};
use crate::spec::SweepSpec;
use crate::stats::{rng_for, STREAM_PARAMS};
use crate::{random, space, Params, Trial};

pub(crate) const STARTUP_TRIALS: usize = 10;
pub(crate) const CANDIDATES: usize = 24;
pub(crate) const PRIOR_WEIGHT: f64 = 1.0;

/// The size of the good set among `n` finished trials.
pub(crate) fn gamma(n: usize) -> usize {
    n.div_ceil(10).min(25)
}

pub(crate) fn suggest(spec: &SweepSpec, earlier: &[&Trial], number: u32) -> Params {
    let mut rng = rng_for(spec.seed, number.into(), STREAM_PARAMS);
    let h = history(spec, earlier);
    if h.finished.len() < STARTUP_TRIALS {
        return random::sample_all(spec, &mut rng);
    }
    let dims = dims::dims(spec);
    let n_good = gamma(h.finished.len()).min(h.finished.len());
    // Good trials weigh by how far they beat the best bad one (the improvement they bring over
    // the split), so l(x) centres on the best of them rather than on all alike.
    let threshold = h.finished.get(n_good).map(|f| f.value);
    let mut good: Vec<(&Trial, f64)> = h.finished[..n_good]
        .iter()
        .map(|f| {
            let w = threshold.map_or(1.0, |t| (t - f.value).max(1e-12));
            (f.trial, if w.is_finite() { w } else { 1.0 })
        })
        .collect();
    // Constant liar: a running trial counts in the bad set, as if it had come in worse than
    // every finished one, so g(x) rises around the spot it is already exploring and trials
    // started in parallel spread out.
    let mut bad: Vec<&Trial> = h.finished[n_good..].iter().map(|f| f.trial).collect();
    bad.extend(h.running.iter().copied());
    // Oldest first, for the age ramp of the bad set's weights.
    good.sort_by_key(|(t, _)| t.number);
    bad.sort_by_key(|t| t.number);
    let good_weights: Vec<f64> = good.iter().map(|(_, w)| *w).collect();
    let good_points: Vec<Vec<Option<f64>>> =
        good.iter().map(|(t, _)| dims::point(&dims, t)).collect();
    let bad_points: Vec<Vec<Option<f64>>> = bad.iter().map(|t| dims::point(&dims, t)).collect();

    let masks: Vec<Vec<bool>> = good_points
        .iter()
        .chain(&bad_points)
        .map(|p| p.iter().map(Option::is_some).collect())
        .collect();
    let mut x: Vec<Option<f64>> = vec![None; dims.len()];
    for group in groups(&masks, dims.len()) {
        let chosen = suggest_group(
            &dims,
            &group,
            &good_points,
            &good_weights,
            &bad_points,
            &mut rng,
        );
        for (&d, v) in group.iter().zip(chosen) {
            x[d] = Some(v);
        }
    }
    // Single-valued parameters decode to their one value from any point.
    let mut out: Params = spec
        .parameters
        .iter()
        .map(|(key, param)| (key.clone(), space::decode(param, 0.0)))
        .collect();
    for (d, dim) in dims.iter().enumerate() {
        let value = match x[d] {
            Some(v) => dim.decode(v),
            // No trial has a value for it that the current space can produce: a random draw.
            None => space::sample(dim.param, &mut rng),
        };
        out.insert(dim.key.to_string(), value);
    }
    out
}

/// The finest partition of the dimensions that every trial's set of valid dimensions is a
/// union of; dimensions no trial has are in no group. Groups come ordered by their first
/// dimension.
pub(crate) fn groups(masks: &[Vec<bool>], n_dims: usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for mask in masks {
        let set: Vec<usize> = (0..n_dims).filter(|&d| mask[d]).collect();
        if set.is_empty() {
            continue;
        }
        let mut next = Vec::new();
        for g in &groups {
            let (inside, outside): (Vec<usize>, Vec<usize>) = g.iter().partition(|&&d| mask[d]);
            next.extend([inside, outside].into_iter().filter(|p| !p.is_empty()));
        }
        let rest: Vec<usize> = set
            .into_iter()
            .filter(|d| !groups.iter().any(|g| g.contains(d)))
            .collect();
        if !rest.is_empty() {
            next.push(rest);
        }
        groups = next;
    }
    for g in &mut groups {
        g.sort_unstable();
    }
    groups.sort_by_key(|g| g[0]);
    groups
}

/// The TPE choice for one group of dimensions: l(x) from the good trials that have the whole
/// group, g(x) from the bad ones, the best of the candidates drawn from l by l(x)/g(x).
fn suggest_group<R: Rng>(
    dims: &[Dim],
    group: &[usize],
    good: &[Vec<Option<f64>>],
    good_weights: &[f64],
    bad: &[Vec<Option<f64>>],
    rng: &mut R,
) -> Vec<f64> {
    let kinds: Vec<Kind> = group.iter().map(|&d| dims[d].kind).collect();
    let has = |p: &Vec<Option<f64>>| group.iter().map(|&d| p[d]).collect::<Option<Vec<f64>>>();
    let mut l_obs = Vec::new();
    let mut l_w = Vec::new();
    for (p, &w) in good.iter().zip(good_weights) {
        if let Some(row) = has(p) {
            l_obs.push(row);
            l_w.push(w);
        }
    }
    let g_obs: Vec<Vec<f64>> = bad.iter().filter_map(has).collect();
    // The prior weighs as much as an average good trial.
    let l_prior = if l_w.is_empty() {
        PRIOR_WEIGHT
    } else {
        l_w.iter().sum::<f64>() / l_w.len() as f64
    };
    let l = Mixture::new(&kinds, &l_obs, &l_w, l_prior);
    let g = Mixture::new(&kinds, &g_obs, &ramp_weights(g_obs.len()), PRIOR_WEIGHT);
    let mut best: Option<(Vec<f64>, f64)> = None;
    for _ in 0..CANDIDATES {
        let c = l.sample(rng);
        let score = l.log_pdf(&c) - g.log_pdf(&c);
        if best.as_ref().is_none_or(|(_, b)| score > *b) {
            best = Some((c, score));
        }
    }
    best.map(|(c, _)| c).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_split_parameters_that_some_trials_lack_and_keep_the_rest_together() {
        let m = |bits: &[u8]| bits.iter().map(|&b| b == 1).collect::<Vec<bool>>();
        // Trials with all four, then ones whose third value no longer fits.
        let g = groups(&[m(&[1, 1, 1, 1]), m(&[1, 1, 0, 1])], 4);
        assert_eq!(g, vec![vec![0, 1, 3], vec![2]]);
        // A new parameter nobody has yet belongs to no group.
        let g = groups(&[m(&[1, 1, 0]), m(&[1, 1, 0])], 3);
        assert_eq!(g, vec![vec![0, 1]]);
        assert!(groups(&[], 2).is_empty());
    }
}
