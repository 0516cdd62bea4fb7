//! The Parzen estimators of TPE, over several dimensions at once: a mixture with one kernel per
//! observation plus a broad prior kernel, each kernel a product over the dimensions of a
//! truncated Gaussian (numeric axes; the probability of a value's cell on discrete ones) or a
//! smoothed categorical. Modelling the dimensions jointly keeps what the good trials have in
//! common: a candidate is drawn from one good trial's kernel in every dimension at once.

use rand::Rng;

use crate::dims::{Grid, Kind};
use crate::stats::{log_sum_exp, normal_mass, std_normal, LN_SQRT_2PI};

/// Observation weights by age (oldest first): after 25 observations the older ones ramp down
/// linearly from 1/n to 1, so the estimator follows where the search is now rather than where
/// it started; the newest 25 keep weight 1.
pub(crate) fn ramp_weights(n: usize) -> Vec<f64> {
    const FLAT: usize = 25;
    if n < FLAT {
        return vec![1.0; n];
    }
    let ramp = n - FLAT;
    let start = 1.0 / n as f64;
    let mut w: Vec<f64> = (0..ramp)
        .map(|i| {
            if ramp == 1 {
                start
            } else {
                start + (1.0 - start) * i as f64 / (ramp - 1) as f64
            }
        })
        .collect();
    w.extend(std::iter::repeat_n(1.0, FLAT));
    w
}

/// The narrowest kernel, as a fraction of the range.
pub(crate) const MIN_BANDWIDTH: f64 = 0.02;

/// Each observation's bandwidth on one numeric axis: the larger gap to its neighbours (for the
/// lowest and highest of two or more, the gap to the one inner neighbour: the range ends are
/// not neighbours), clipped to [width · max(0.02, 1 / (n + 2)²), width]: the "magic clip",
/// so a few coinciding observations cannot collapse the density to a spike (n + 2 counts the
/// kernels, the prior's included, plus one). Optuna clips at width / min(100, n + 2); the
/// squared form (exponent 2 and floor 0.02, after Watanabe's 2023 ablation of TPE's components)
/// lets the kernels narrow as evidence accumulates, which is what fine convergence needs.
pub(crate) fn bandwidths(mus: &[f64], lo: f64, hi: f64) -> Vec<f64> {
    let n = mus.len();
    if n == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| mus[a].total_cmp(&mus[b]));
    let sorted: Vec<f64> = order.iter().map(|&i| mus[i]).collect();
    let at = |p: isize| -> f64 {
        if p < 0 {
            lo
        } else if p as usize >= n {
            hi
        } else {
            sorted[p as usize]
        }
    };
    let mut sorted_sigma: Vec<f64> = (0..n as isize)
        .map(|p| (at(p) - at(p - 1)).max(at(p + 1) - at(p)))
        .collect();
    if n >= 2 {
        sorted_sigma[0] = sorted[1] - sorted[0];
        sorted_sigma[n - 1] = sorted[n - 1] - sorted[n - 2];
    }
    let width = hi - lo;
    let min_sigma = width * MIN_BANDWIDTH.max((n as f64 + 2.0).powi(-2));
    let mut sigmas = vec![0.0; n];
    for (p, &i) in order.iter().enumerate() {
        sigmas[i] = sorted_sigma[p].clamp(min_sigma, width);
    }
    sigmas
}

/// One dimension's kernels (the observations' in order, then the prior's).
enum Axis {
    Num {
        mus: Vec<f64>,
        sigmas: Vec<f64>,
        /// Log of each kernel's mass inside `[lo, hi]` (the truncation normalizer).
        log_z: Vec<f64>,
        lo: f64,
        hi: f64,
        log: bool,
        grid: Option<Grid>,
    },
    /// Per kernel, the log probability of each choice.
    Cat(Vec<Vec<f64>>),
}

pub(crate) struct Mixture {
    /// Normalized kernel weights, and their logs.
    weights: Vec<f64>,
    log_weights: Vec<f64>,
    axes: Vec<Axis>,
}

impl Mixture {
    /// `obs[i][d]` is observation i on dimension d (every value valid for its dimension);
    /// `weights[i]` its weight.
    pub(crate) fn new(
        kinds: &[Kind],
        obs: &[Vec<f64>],
        weights: &[f64],
        prior_weight: f64,
    ) -> Self {
        let n = obs.len();
        let mut w: Vec<f64> = weights.iter().take(n).copied().collect();
        w.push(if n == 0 { 1.0 } else { prior_weight });
        let total: f64 = w.iter().sum();
        for x in &mut w {
            *x /= total;
        }
        let log_weights = w.iter().map(|x| x.max(1e-300).ln()).collect();
        let axes = kinds
            .iter()
            .enumerate()
            .map(|(d, kind)| {
                let column: Vec<f64> = obs.iter().map(|o| o[d]).collect();
                match *kind {
                    Kind::Cat(k) => Axis::Cat(categorical_rows(&column, k, prior_weight)),
                    Kind::Num { lo, hi, log, grid } => {
                        let mut sigmas = bandwidths(&column, lo, hi);
                        let mut mus = column;
                        mus.push(0.5 * (lo + hi));
                        sigmas.push(hi - lo);
                        let log_z = mus
                            .iter()
                            .zip(&sigmas)
                            .map(|(&m, &s)| {
                                normal_mass((lo - m) / s, (hi - m) / s).max(1e-300).ln()
                            })
                            .collect();
                        Axis::Num {
                            mus,
                            sigmas,
                            log_z,
                            lo,
                            hi,
                            log,
                            grid,
                        }
                    }
                }
            })
            .collect();
        Mixture {
            weights: w,
            log_weights,
            axes,
        }
    }

    /// One draw: a kernel by weight, then each dimension from that kernel (numeric axes by
    /// rejection inside the range, then snapped to the nearest valid value on a grid).
    pub(crate) fn sample<R: Rng>(&self, rng: &mut R) -> Vec<f64> {
        let u: f64 = rng.random();
        let mut acc = 0.0;
        let mut k = self.weights.len() - 1;
        for (i, w) in self.weights.iter().enumerate() {
            acc += w;
            if u < acc {
                k = i;
                break;
            }
        }
        self.axes
            .iter()
            .map(|axis| match axis {
                Axis::Cat(rows) => {
                    let u: f64 = rng.random();
                    let mut acc = 0.0;
                    let row = &rows[k];
                    for (c, lp) in row.iter().enumerate() {
                        acc += lp.exp();
                        if u < acc {
                            return c as f64;
                        }
                    }
                    (row.len() - 1) as f64
                }
                Axis::Num {
                    mus,
                    sigmas,
                    lo,
                    hi,
                    log,
                    grid,
                    ..
                } => {
                    // Every kernel is centred inside the range with sigma at most its width, so
                    // about a third of draws or more land inside.
                    let mut x = mus[k];
                    for _ in 0..100 {
                        let draw = mus[k] + sigmas[k] * std_normal(rng);
                        if draw >= *lo && draw <= *hi {
                            x = draw;
                            break;
                        }
                    }
                    match grid {
                        Some(g) => g.internal(g.index_of(x, *log), *log),
                        None => x.clamp(*lo, *hi),
                    }
                }
            })
            .collect()
    }

    /// Log density at `x` (valid values, one per dimension); on a discrete axis the log
    /// probability of `x`'s cell stands in for the density.
    pub(crate) fn log_pdf(&self, x: &[f64]) -> f64 {
        let mut terms = self.log_weights.clone();
        for (axis, &xd) in self.axes.iter().zip(x) {
            match axis {
                Axis::Cat(rows) => {
                    let c = xd as usize;
                    for (t, row) in terms.iter_mut().zip(rows) {
                        *t += row.get(c).copied().unwrap_or(-690.0);
                    }
                }
                Axis::Num {
                    mus,
                    sigmas,
                    log_z,
                    lo,
                    hi,
                    log,
                    grid,
                } => {
                    let cell = grid.map(|g| {
                        let (a, b) = g.cell(xd, *log);
                        (a.max(*lo), b.min(*hi))
                    });
                    for (i, t) in terms.iter_mut().enumerate() {
                        let (mu, sigma) = (mus[i], sigmas[i]);
                        let log_p = match cell {
                            Some((a, b)) => normal_mass((a - mu) / sigma, (b - mu) / sigma)
                                .max(1e-300)
                                .ln(),
                            None => {
                                let z = (xd - mu) / sigma;
                                -0.5 * z * z - LN_SQRT_2PI - sigma.ln()
                            }
                        };
                        *t += log_p - log_z[i];
                    }
                }
            }
        }
        log_sum_exp(&terms)
    }
}

/// The kernels of a categorical dimension: each observation's kernel puts weight 1 on its
/// choice plus prior_weight / (n + 1) on every choice, normalized; the prior's kernel is
/// uniform.
fn categorical_rows(column: &[f64], choices: usize, prior_weight: f64) -> Vec<Vec<f64>> {
    let n_kernels = column.len() + 1;
    let base = prior_weight / n_kernels as f64;
    let mut rows: Vec<Vec<f64>> = column
        .iter()
        .map(|&c| {
            let mut row = vec![base; choices];
            if let Some(p) = row.get_mut(c as usize) {
                *p += 1.0;
            }
            row
        })
        .collect();
    rows.push(vec![1.0; choices]);
    for row in &mut rows {
        let total: f64 = row.iter().sum();
        for p in row.iter_mut() {
            *p = if total > 0.0 {
                (*p / total).max(1e-300).ln()
            } else {
                -(choices as f64).ln()
            };
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{rng_for, STREAM_PARAMS};

    const UNIT: Kind = Kind::Num {
        lo: 0.0,
        hi: 1.0,
        log: false,
        grid: None,
    };

    fn rows(xs: &[f64]) -> Vec<Vec<f64>> {
        xs.iter().map(|&x| vec![x]).collect()
    }

    #[test]
    fn weights_are_flat_up_to_25_observations_then_ramp_up_from_the_oldest() {
        assert_eq!(ramp_weights(10), vec![1.0; 10]);
        let w = ramp_weights(40);
        assert_eq!(w.len(), 40);
        assert!((w[0] - 1.0 / 40.0).abs() < 1e-12);
        assert!(w.windows(2).all(|p| p[0] <= p[1]));
        assert!(w[15..].iter().all(|&x| x == 1.0));
    }

    #[test]
    fn bandwidths_follow_the_neighbour_gaps_with_the_outer_ones_taking_their_inner_gap() {
        let s = bandwidths(&[0.5, 0.1, 0.3], 0.0, 1.0);
        // Sorted 0.1, 0.3, 0.5: the outer two take their one inner gap (0.2), the middle the
        // larger of its two gaps (0.2); the clip floor is 1 / 25.
        assert!(s.iter().all(|&x| (x - 0.2).abs() < 1e-12), "{s:?}");
        // A lone observation measures to the range ends.
        assert!((bandwidths(&[0.2], 0.0, 1.0)[0] - 0.8).abs() < 1e-12);
        // Coinciding observations are held at the clip floor, width / (n + 2)², and never
        // below 2 % of the width.
        let s = bandwidths(&[0.4; 4], 0.0, 1.0);
        assert!(s.iter().all(|&x| (x - 1.0 / 36.0).abs() < 1e-12), "{s:?}");
        let s = bandwidths(&[0.4; 20], 0.0, 1.0);
        assert!(s.iter().all(|&x| (x - 0.02).abs() < 1e-12), "{s:?}");
    }

    #[test]
    fn a_continuous_mixture_integrates_to_one_over_its_range() {
        let p = Mixture::new(&[UNIT], &rows(&[0.1, 0.15, 0.8]), &[1.0; 3], 1.0);
        let n = 20_000;
        let integral: f64 = (0..n)
            .map(|i| p.log_pdf(&[(i as f64 + 0.5) / n as f64]).exp() / n as f64)
            .sum();
        assert!((integral - 1.0).abs() < 1e-3, "integral {integral}");
    }

    #[test]
    fn a_joint_mixture_integrates_to_one_over_the_square_and_keeps_pairs_together() {
        let obs = vec![
            vec![0.1, 0.9],
            vec![0.11, 0.89],
            vec![0.12, 0.88],
            vec![0.9, 0.1],
            vec![0.89, 0.11],
            vec![0.88, 0.12],
        ];
        let p = Mixture::new(&[UNIT, UNIT], &obs, &[1.0; 6], 1.0);
        let n = 300;
        let mut integral = 0.0;
        for i in 0..n {
            for j in 0..n {
                let x = [(i as f64 + 0.5) / n as f64, (j as f64 + 0.5) / n as f64];
                integral += p.log_pdf(&x).exp() / (n * n) as f64;
            }
        }
        assert!((integral - 1.0).abs() < 2e-3, "integral {integral}");
        // The observed pairs are likely; their crossings, which an estimator per dimension
        // would rate the same, are not.
        assert!(p.log_pdf(&[0.1, 0.9]) > p.log_pdf(&[0.1, 0.1]) + 1.0);
    }

    #[test]
    fn a_discrete_mixture_sums_to_one_over_its_cells_and_samples_only_valid_values() {
        // Integers 1..=5: axis [0.5, 5.5], and integers 1..=100 on a log scale.
        let int = Kind::Num {
            lo: 0.5,
            hi: 5.5,
            log: false,
            grid: Some(Grid {
                first: 1.0,
                step: 1.0,
                count: 5,
            }),
        };
        let p = Mixture::new(&[int], &rows(&[2.0, 2.0, 5.0]), &[1.0; 3], 1.0);
        let total: f64 = (1..=5).map(|v| p.log_pdf(&[v as f64]).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "total {total}");
        let logint = Kind::Num {
            lo: 0.5f64.ln(),
            hi: 100.5f64.ln(),
            log: true,
            grid: Some(Grid {
                first: 1.0,
                step: 1.0,
                count: 100,
            }),
        };
        let q = Mixture::new(&[logint], &rows(&[3f64.ln(), 50f64.ln()]), &[1.0; 2], 1.0);
        let total: f64 = (1..=100).map(|v| q.log_pdf(&[(v as f64).ln()]).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "total {total}");
        let mut rng = rng_for(1, 1, STREAM_PARAMS);
        for _ in 0..500 {
            let x = p.sample(&mut rng)[0];
            assert_eq!(x.fract(), 0.0);
            assert!((1.0..=5.0).contains(&x));
            let v = q.sample(&mut rng)[0].exp();
            assert!(
                (v - v.round()).abs() < 1e-9 && (1.0..=100.0 + 1e-9).contains(&v),
                "{v}"
            );
        }
    }

    #[test]
    fn the_categorical_kernels_smooth_counts_with_the_prior() {
        let p = Mixture::new(&[Kind::Cat(3)], &rows(&[0.0, 0.0, 0.0]), &[1.0; 3], 1.0);
        let probs: Vec<f64> = (0..3).map(|i| p.log_pdf(&[i as f64]).exp()).collect();
        assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // Three kernels of (1 + 1/4, 1/4, 1/4) / 1.75 and a uniform prior, weighing 1 each.
        let expected = 0.75 * (1.25 / 1.75) + 0.25 / 3.0;
        assert!((probs[0] - expected).abs() < 1e-12, "{probs:?}");
        assert!(probs[1] > 0.0 && (probs[1] - probs[2]).abs() < 1e-12);
    }
}
