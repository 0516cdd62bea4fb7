//! The Tree-structured Parzen Estimator (Bergstra et al., 2011) with the defaults Optuna settled
//! on: 10 random start-up trials, a good set of the best min(ceil(n/10), 25) observations, 24
//! candidates drawn from the good-set density l(x) and the one maximizing l(x)/g(x) kept, each
//! parameter modelled on its own.

use crate::parzen::{ramp_weights, CatParzen, Parzen};
use crate::space::{self, Axis};
use crate::spec::SweepSpec;
use crate::stats::{rng_for, STREAM_PARAMS};
use crate::{random, Params, Trial, TrialState};

pub(crate) const STARTUP_TRIALS: usize = 10;
pub(crate) const CANDIDATES: usize = 24;
pub(crate) const PRIOR_WEIGHT: f64 = 1.0;

/// The size of the good set among `n` observations.
pub(crate) fn gamma(n: usize) -> usize {
    n.div_ceil(10).min(25)
}

/// How a trial ranks: by objective (negated when maximizing), then complete before pruned
/// before running, then by number so ties split the same way every time.
#[derive(Clone, Copy)]
struct Ranked<'a> {
    value: f64,
    tier: u8,
    trial: &'a Trial,
}

/// A finished trial's objective: a Complete trial's value, or for a Pruned trial (or a Complete
/// one that never set a value) its last finite report.
fn objective(t: &Trial) -> Option<f64> {
    t.value
        .filter(|v| v.is_finite())
        .or_else(|| t.reports().next_back().map(|(_, v)| v))
}

pub(crate) fn suggest(spec: &SweepSpec, earlier: &[&Trial], number: u32) -> Params {
    let mut rng = rng_for(spec.seed, number.into(), STREAM_PARAMS);
    let sign = if spec.maximize() { -1.0 } else { 1.0 };

    let mut ranked: Vec<Ranked> = Vec::new();
    for &t in earlier {
        let tier = match t.state {
            TrialState::Complete => 0,
            TrialState::Pruned => 1,
            _ => continue,
        };
        if let Some(v) = objective(t) {
            ranked.push(Ranked {
                value: sign * v,
                tier,
                trial: t,
            });
        }
    }
    let finished = ranked.len();
    if finished < STARTUP_TRIALS {
        return random::sample_all(spec, &mut rng);
    }
    // Constant liar: a running trial counts as if it had come in at the worst value seen, so it
    // sits in the bad set and pushes g(x) up around the spot it is already exploring.
    let worst = ranked
        .iter()
        .map(|r| r.value)
        .fold(f64::NEG_INFINITY, f64::max);
    for &t in earlier {
        if t.state == TrialState::Running {
            ranked.push(Ranked {
                value: worst,
                tier: 2,
                trial: t,
            });
        }
    }
    ranked.sort_by(|a, b| {
        a.value
            .total_cmp(&b.value)
            .then(a.tier.cmp(&b.tier))
            .then(a.trial.number.cmp(&b.trial.number))
    });
    let n_good = gamma(ranked.len()).clamp(1, finished);
    let (good, bad) = ranked.split_at(n_good);
    let mut good: Vec<&Trial> = good.iter().map(|r| r.trial).collect();
    let mut bad: Vec<&Trial> = bad.iter().map(|r| r.trial).collect();
    // Oldest first, for the age ramp of the weights.
    good.sort_by_key(|t| t.number);
    bad.sort_by_key(|t| t.number);

    let mut out = Params::new();
    for (key, param) in &spec.parameters {
        // Each set keeps only the values the current space can produce: a range narrowed
        // mid-sweep drops the history outside it for this parameter alone.
        let encoded = |set: &[&Trial]| -> Vec<f64> {
            set.iter()
                .filter_map(|t| t.params.get(key).and_then(|v| space::encode(param, v)))
                .collect()
        };
        let (l_obs, g_obs) = (encoded(&good), encoded(&bad));
        let (l_w, g_w) = (ramp_weights(l_obs.len()), ramp_weights(g_obs.len()));
        let value = match space::axis(param) {
            Axis::Fixed => space::decode(param, 0.0),
            Axis::Choice(k) => {
                let to_idx = |xs: &[f64]| xs.iter().map(|&x| x as usize).collect::<Vec<_>>();
                let l = CatParzen::new(&to_idx(&l_obs), &l_w, k, PRIOR_WEIGHT);
                let g = CatParzen::new(&to_idx(&g_obs), &g_w, k, PRIOR_WEIGHT);
                let best = best_of((0..CANDIDATES).map(|_| l.sample(&mut rng)), |&c| {
                    l.log_pdf(c) - g.log_pdf(c)
                });
                space::decode(param, best.unwrap_or(0) as f64)
            }
            Axis::Num { lo, hi, step } => {
                let l = Parzen::new(&l_obs, &l_w, lo, hi, step, PRIOR_WEIGHT);
                let g = Parzen::new(&g_obs, &g_w, lo, hi, step, PRIOR_WEIGHT);
                let best = best_of((0..CANDIDATES).map(|_| l.sample(&mut rng)), |&x| {
                    l.log_pdf(x) - g.log_pdf(x)
                });
                space::decode(param, best.unwrap_or(0.5 * (lo + hi)))
            }
        };
        out.insert(key.clone(), value);
    }
    out
}

/// The candidate with the highest score (the first of equals).
fn best_of<T: Copy>(candidates: impl Iterator<Item = T>, score: impl Fn(&T) -> f64) -> Option<T> {
    let mut best: Option<(T, f64)> = None;
    for c in candidates {
        let s = score(&c);
        if best.is_none_or(|(_, b)| s > b) {
            best = Some((c, s));
        }
    }
    best.map(|(c, _)| c)
}
