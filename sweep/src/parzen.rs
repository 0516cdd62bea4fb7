//! The Parzen estimators of TPE: a truncated Gaussian mixture on a numeric axis, and a smoothed
//! categorical, each with a prior component so an estimator built from few observations still
//! puts mass everywhere.

use rand::Rng;

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

/// A mixture of Gaussians truncated to `[lo, hi]`: one per observation plus a broad prior.
pub(crate) struct Parzen {
    mus: Vec<f64>,
    sigmas: Vec<f64>,
    /// Normalized mixture weights.
    weights: Vec<f64>,
    /// Log of each component's mass inside `[lo, hi]` (the truncation normalizer).
    log_z: Vec<f64>,
    lo: f64,
    hi: f64,
    step: Option<f64>,
}

impl Parzen {
    /// `obs` are points on the axis, `weights` their weights (same length).
    pub(crate) fn new(
        obs: &[f64],
        weights: &[f64],
        lo: f64,
        hi: f64,
        step: Option<f64>,
        prior_weight: f64,
    ) -> Parzen {
        let width = hi - lo;
        let prior_mu = 0.5 * (lo + hi);
        let mut mus: Vec<f64> = obs.to_vec();
        mus.push(prior_mu);
        // Bandwidth of each point: the larger gap to its neighbours (the range ends stand in
        // for missing neighbours), so sparse regions get wide kernels and dense ones narrow.
        let mut order: Vec<usize> = (0..mus.len()).collect();
        order.sort_by(|&a, &b| mus[a].total_cmp(&mus[b]));
        let mut sigmas = vec![0.0; mus.len()];
        for (pos, &i) in order.iter().enumerate() {
            let left = if pos == 0 { lo } else { mus[order[pos - 1]] };
            let right = order.get(pos + 1).map_or(hi, |&j| mus[j]);
            sigmas[i] = (mus[i] - left).max(right - mus[i]);
        }
        // The "magic clip": no kernel narrower than the range over min(100, n + 1), so a few
        // coinciding observations cannot collapse the density to a spike.
        let min_sigma = width / (100.0f64).min(1.0 + obs.len() as f64);
        for s in &mut sigmas {
            *s = s.clamp(min_sigma, width);
        }
        let last = sigmas.len() - 1;
        sigmas[last] = width;

        let mut weights: Vec<f64> = weights.to_vec();
        weights.push(prior_weight);
        let total: f64 = weights.iter().sum();
        for w in &mut weights {
            *w /= total;
        }
        let log_z = mus
            .iter()
            .zip(&sigmas)
            .map(|(&m, &s)| normal_mass((lo - m) / s, (hi - m) / s).max(1e-300).ln())
            .collect();
        Parzen {
            mus,
            sigmas,
            weights,
            log_z,
            lo,
            hi,
            step,
        }
    }

    /// One draw: a component by weight, then a truncated normal by rejection (every component is
    /// centred inside the range with sigma at most its width, so at least about a third of
    /// draws land inside); discretized axes snap to the nearest valid point.
    pub(crate) fn sample<R: Rng>(&self, rng: &mut R) -> f64 {
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
        let mut x = self.mus[k];
        for _ in 0..100 {
            let draw = self.mus[k] + self.sigmas[k] * std_normal(rng);
            if draw >= self.lo && draw <= self.hi {
                x = draw;
                break;
            }
        }
        self.snap(x)
    }

    fn snap(&self, x: f64) -> f64 {
        match self.step {
            Some(step) => {
                let first = self.lo + 0.5 * step;
                let last = self.hi - 0.5 * step;
                (first + ((x - first) / step).round() * step).clamp(first, last)
            }
            None => x.clamp(self.lo, self.hi),
        }
    }

    /// Log density at `x`; on a discretized axis, the log probability of `x`'s cell.
    pub(crate) fn log_pdf(&self, x: f64) -> f64 {
        let terms: Vec<f64> = (0..self.mus.len())
            .map(|i| {
                let (mu, sigma) = (self.mus[i], self.sigmas[i]);
                let log_w = self.weights[i].max(1e-300).ln();
                let z = (x - mu) / sigma;
                let log_density = -0.5 * z * z - LN_SQRT_2PI - sigma.ln();
                let log_p = match self.step {
                    // A cell much narrower than the kernel: density times width is exact enough
                    // and avoids subtracting two nearly equal tail masses.
                    Some(step) if step / sigma < 1e-3 => log_density + step.ln(),
                    Some(step) => {
                        let a = ((x - 0.5 * step).max(self.lo) - mu) / sigma;
                        let b = ((x + 0.5 * step).min(self.hi) - mu) / sigma;
                        normal_mass(a, b).max(1e-300).ln()
                    }
                    None => log_density,
                };
                log_w + log_p - self.log_z[i]
            })
            .collect();
        log_sum_exp(&terms)
    }
}

/// A categorical estimator: each choice's probability is its weighted count plus an equal share
/// of the prior weight.
pub(crate) struct CatParzen {
    probs: Vec<f64>,
}

impl CatParzen {
    pub(crate) fn new(
        obs: &[usize],
        weights: &[f64],
        choices: usize,
        prior_weight: f64,
    ) -> CatParzen {
        let mut probs = vec![prior_weight / choices as f64; choices];
        for (&c, &w) in obs.iter().zip(weights) {
            if let Some(p) = probs.get_mut(c) {
                *p += w;
            }
        }
        let total: f64 = probs.iter().sum();
        for p in &mut probs {
            *p /= total;
        }
        CatParzen { probs }
    }

    pub(crate) fn sample<R: Rng>(&self, rng: &mut R) -> usize {
        let u: f64 = rng.random();
        let mut acc = 0.0;
        for (i, p) in self.probs.iter().enumerate() {
            acc += p;
            if u < acc {
                return i;
            }
        }
        self.probs.len() - 1
    }

    pub(crate) fn log_pdf(&self, c: usize) -> f64 {
        self.probs.get(c).copied().unwrap_or(0.0).max(1e-300).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{rng_for, STREAM_PARAMS};

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
    fn a_continuous_parzen_integrates_to_one_over_its_range() {
        let p = Parzen::new(&[0.1, 0.15, 0.8], &[1.0, 1.0, 1.0], 0.0, 1.0, None, 1.0);
        let n = 20_000;
        let integral: f64 = (0..n)
            .map(|i| p.log_pdf((i as f64 + 0.5) / n as f64).exp() / n as f64)
            .sum();
        assert!((integral - 1.0).abs() < 1e-3, "integral {integral}");
    }

    #[test]
    fn a_discrete_parzen_sums_to_one_over_its_cells_and_samples_only_cell_centres() {
        // Integers 1..=5: axis [0.5, 5.5] with step 1.
        let p = Parzen::new(&[2.0, 2.0, 5.0], &[1.0, 1.0, 1.0], 0.5, 5.5, Some(1.0), 1.0);
        let total: f64 = (1..=5).map(|v| p.log_pdf(v as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "total {total}");
        let mut rng = rng_for(1, 1, STREAM_PARAMS);
        for _ in 0..500 {
            let x = p.sample(&mut rng);
            assert_eq!(x.fract(), 0.0);
            assert!((1.0..=5.0).contains(&x));
        }
    }

    #[test]
    fn the_parzen_puts_more_mass_near_its_observations() {
        let p = Parzen::new(&[0.2, 0.22, 0.25], &[1.0; 3], 0.0, 1.0, None, 1.0);
        assert!(p.log_pdf(0.22) > p.log_pdf(0.9) + 1.0);
    }

    #[test]
    fn the_categorical_estimator_smooths_counts_with_the_prior() {
        let c = CatParzen::new(&[0, 0, 0], &[1.0; 3], 3, 1.0);
        let p: Vec<f64> = (0..3).map(|i| c.log_pdf(i).exp()).collect();
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(p[0] > 0.8 && p[1] > 0.0 && (p[1] - p[2]).abs() < 1e-12);
    }
}
