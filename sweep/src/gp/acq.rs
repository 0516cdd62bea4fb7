//! The log expected-improvement acquisition (computed stably far into the tail, as in Ament et
//! al., 2023, "Unexpected Improvements to Expected Improvement") and its maximization over a
//! mixed space: many random starts, then from the best few a local search alternating L-BFGS
//! over the continuous coordinates (scaled by the length scales) with a search over each
//! discrete one (every value when there are at most 16, else steps of 1, 2, 4, ... either way).

use rand::Rng;

use super::model::Gp;
use crate::dims::Grid;
use crate::optim::{self, Options};
use crate::stats::LN_SQRT_2PI;

/// A searched coordinate of the unit cube.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Coord {
    Cont,
    /// Evenly spaced values (on the log scale when `log`) whose cells span the internal axis
    /// `[lo, hi]`, which maps onto [0, 1].
    Grid {
        grid: Grid,
        log: bool,
        lo: f64,
        hi: f64,
    },
    /// Choice indices 0 .. k.
    Cat(usize),
}

impl Coord {
    /// The valid point of [0, 1] nearest to `u`, with its index.
    fn snap(&self, u: f64) -> (u64, f64) {
        match *self {
            Coord::Cont => (0, u.clamp(0.0, 1.0)),
            Coord::Cat(k) => {
                let i = (u.round().max(0.0) as u64).min(k as u64 - 1);
                (i, i as f64)
            }
            Coord::Grid { grid, log, lo, hi } => {
                let i = grid.index_of(lo + u * (hi - lo), log);
                (i, self.point(i))
            }
        }
    }

    /// The `i`-th value of a grid on [0, 1].
    fn point(&self, i: u64) -> f64 {
        match *self {
            Coord::Grid { grid, log, lo, hi } => {
                ((grid.internal(i, log) - lo) / (hi - lo)).clamp(0.0, 1.0)
            }
            _ => i as f64,
        }
    }
}

const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;
const SQRT_HALF: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// Added to the posterior variance, as Optuna does, so a point on an observation keeps a
/// finite log EI.
const STABILIZING_NOISE: f64 = 1e-12;

/// log h(z) with h(z) = E[max(0, z + N(0, 1))] = z Φ(z) + φ(z), and the ratios Φ(z)/h(z) and
/// φ(z)/h(z) that its derivatives need.
pub(crate) fn log_h(z: f64) -> (f64, f64, f64) {
    if z > -25.0 {
        let cdf = 0.5 * libm::erfc(-SQRT_HALF * z);
        let pdf = (-0.5 * z * z).exp() * INV_SQRT_2PI;
        let h = z * cdf + pdf;
        (h.ln(), cdf / h, pdf / h)
    } else {
        // Far tail: h(z) = φ(z)/z² (1 − 3/z² + 15/z⁴ − 105/z⁶ + ...) and
        // Φ(z) = φ(z)/|z| (1 − 1/z² + 3/z⁴ − 15/z⁶ + ...).
        let u = 1.0 / (z * z);
        let sh = 1.0 - 3.0 * u + 15.0 * u * u - 105.0 * u * u * u;
        let sc = 1.0 - u + 3.0 * u * u - 15.0 * u * u * u;
        let log_h = -0.5 * z * z - LN_SQRT_2PI + u.ln() + sh.ln();
        (log_h, -z * sc / sh, 1.0 / (u * sh))
    }
}

pub(crate) struct Acq<'a> {
    pub gp: &'a Gp,
    /// The best (standardized, maximized) value observed.
    pub best: f64,
}

impl Acq<'_> {
    /// log EI at `x`, and its gradient over the continuous coordinates when asked.
    pub(crate) fn eval(&self, x: &[f64], grad: Option<&mut [f64]>) -> f64 {
        let d = self.gp.dim();
        match grad {
            None => {
                let (m, v) = self.gp.posterior(x, None);
                let sigma = (v + STABILIZING_NOISE).sqrt();
                log_h((m - self.best) / sigma).0 + sigma.ln()
            }
            Some(g) => {
                let (mut gm, mut gv) = (vec![0.0; d], vec![0.0; d]);
                let (m, v) = self.gp.posterior(x, Some((&mut gm, &mut gv)));
                let sigma = (v + STABILIZING_NOISE).sqrt();
                let (lh, r_cdf, r_pdf) = log_h((m - self.best) / sigma);
                // d log EI = (Φ/h) dμ/σ + (φ/h) dσ/σ, and dσ = dv / (2σ).
                for j in 0..d {
                    g[j] = (r_cdf * gm[j] + r_pdf * gv[j] / (2.0 * sigma)) / sigma;
                }
                lh + sigma.ln()
            }
        }
    }
}

/// A uniform random point of the space.
fn random_point<R: Rng>(coords: &[Coord], rng: &mut R) -> Vec<f64> {
    coords
        .iter()
        .map(|c| {
            let u: f64 = rng.random();
            match c {
                Coord::Cont => u,
                Coord::Grid { .. } => c.snap(u).1,
                Coord::Cat(k) => ((u * *k as f64) as usize).min(k - 1) as f64,
            }
        })
        .collect()
}

pub(crate) const RANDOM_STARTS: usize = 2048;
pub(crate) const LOCAL_SEARCHES: usize = 10;

/// The point of the space with the highest log EI found: `RANDOM_STARTS` random points are
/// scored, and local searches start from the best of them, from `warm` (the best observed
/// point) and from others picked at random with chance growing with their EI.
pub(crate) fn maximize<R: Rng>(acq: &Acq, coords: &[Coord], warm: &[f64], rng: &mut R) -> Vec<f64> {
    let samples: Vec<Vec<f64>> = (0..RANDOM_STARTS)
        .map(|_| random_point(coords, rng))
        .collect();
    let values: Vec<f64> = samples.iter().map(|x| acq.eval(x, None)).collect();
    let mut best_i = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best_i] {
            best_i = i;
        }
    }
    // Roulette without replacement, weights exp(value - best), the best itself taken already.
    let mut weights: Vec<f64> = values
        .iter()
        .map(|v| {
            let w = (v - values[best_i]).exp();
            if w.is_finite() {
                w
            } else {
                0.0
            }
        })
        .collect();
    weights[best_i] = 0.0;
    let mut starts = vec![samples[best_i].clone(), warm.to_vec()];
    while starts.len() < LOCAL_SEARCHES {
        let total: f64 = weights.iter().sum();
        if total <= 0.0 || !total.is_finite() {
            break;
        }
        let u = rng.random::<f64>() * total;
        let mut acc = 0.0;
        let mut pick = weights.len() - 1;
        for (i, w) in weights.iter().enumerate() {
            acc += w;
            if *w > 0.0 && u < acc {
                pick = i;
                break;
            }
        }
        weights[pick] = 0.0;
        starts.push(samples[pick].clone());
    }
    let mut best: Option<(Vec<f64>, f64)> = None;
    for start in starts {
        let (x, v) = local_search(acq, coords, start);
        if best.as_ref().is_none_or(|(_, b)| v > *b) {
            best = Some((x, v));
        }
    }
    best.map(|(x, _)| x).unwrap_or_else(|| warm.to_vec())
}

/// Alternates continuous and discrete improvement until a round of the discrete searches
/// changes nothing.
fn local_search(acq: &Acq, coords: &[Coord], mut x: Vec<f64>) -> (Vec<f64>, f64) {
    let mut fx = acq.eval(&x, None);
    let cont: Vec<usize> = (0..coords.len())
        .filter(|&j| matches!(coords[j], Coord::Cont))
        .collect();
    for _ in 0..30 {
        if !cont.is_empty() {
            let (nx, nf) = continuous_step(acq, &cont, &x);
            if nf > fx {
                x = nx;
                fx = nf;
            }
        }
        let mut changed = false;
        for (j, c) in coords.iter().enumerate() {
            let options: Vec<f64> = match *c {
                Coord::Cont => continue,
                Coord::Cat(k) => (0..k).map(|i| i as f64).collect(),
                Coord::Grid { grid, .. } => grid_neighbours(grid.count, c.snap(x[j]).0)
                    .into_iter()
                    .map(|i| c.point(i))
                    .collect(),
            };
            let mut best = (x[j], fx);
            let mut probe = x.clone();
            for o in options {
                if o == x[j] {
                    continue;
                }
                probe[j] = o;
                let v = acq.eval(&probe, None);
                if v > best.1 {
                    best = (o, v);
                }
            }
            if best.0 != x[j] {
                x[j] = best.0;
                fx = best.1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    (x, fx)
}

/// The indices to try on a grid of `count` values from index `i`: every one when there are at
/// most 16, else those 1, 2, 4, ... steps away either way.
fn grid_neighbours(count: u64, i: u64) -> Vec<u64> {
    if count <= 16 {
        return (0..count).collect();
    }
    let mut out = Vec::new();
    let mut step = 1u64;
    while step < count {
        if let Some(p) = i.checked_sub(step) {
            out.push(p);
        }
        if i + step < count {
            out.push(i + step);
        }
        step = step.saturating_mul(2);
    }
    out
}

/// L-BFGS over the continuous coordinates, the others held. The coordinates are divided by
/// their length scales so that the acquisition varies about equally fast along each.
fn continuous_step(acq: &Acq, cont: &[usize], x: &[f64]) -> (Vec<f64>, f64) {
    let ls: Vec<f64> = cont
        .iter()
        .map(|&j| 1.0 / acq.gp.hyper.ils[j].sqrt())
        .collect();
    let z0: Vec<f64> = cont.iter().zip(&ls).map(|(&j, l)| x[j] / l).collect();
    let lower = vec![0.0; cont.len()];
    let upper: Vec<f64> = ls.iter().map(|l| 1.0 / l).collect();
    let mut full = x.to_vec();
    let mut g = vec![0.0; x.len()];
    let f = |z: &[f64], gz: &mut [f64]| -> f64 {
        for (k, &j) in cont.iter().enumerate() {
            full[j] = z[k] * ls[k];
        }
        let v = acq.eval(&full, Some(&mut g));
        for (k, &j) in cont.iter().enumerate() {
            gz[k] = -g[j] * ls[k];
        }
        -v
    };
    // Optuna's tolerance for this step: the square root of 1e-4.
    let opts = Options {
        max_iter: 200,
        gtol: 1e-2,
        ..Options::default()
    };
    let out = optim::minimize(f, &z0, &lower, &upper, &opts);
    let mut nx = x.to_vec();
    for (k, &j) in cont.iter().enumerate() {
        nx[j] = (out.x[k] * ls[k]).clamp(0.0, 1.0);
    }
    let nf = acq.eval(&nx, None);
    (nx, nf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_h_is_continuous_across_the_tail_switch_and_its_ratios_match_derivatives() {
        let (a, _, _) = log_h(-25.0 + 1e-9);
        let (b, _, _) = log_h(-25.0 - 1e-9);
        assert!((a - b).abs() < 1e-6, "{a} {b}");
        for z in [-40.0, -26.0, -5.0, 0.0, 3.0] {
            let (_, r_cdf, _) = log_h(z);
            let e = 1e-6;
            // d log h / dz = Φ/h.
            let numeric = (log_h(z + e).0 - log_h(z - e).0) / (2.0 * e);
            assert!(
                (numeric - r_cdf).abs() < 1e-4 * r_cdf.abs().max(1.0),
                "{z}: {numeric} vs {r_cdf}"
            );
        }
        // Far below the best the EI is tiny but its log stays finite and ordered.
        assert!(log_h(-100.0).0 < log_h(-50.0).0 && log_h(-100.0).0.is_finite());
    }

    #[test]
    fn large_grids_are_searched_by_doubling_steps_and_small_ones_whole() {
        assert_eq!(grid_neighbours(10, 3), (0..10).collect::<Vec<u64>>());
        let n = grid_neighbours(100, 50);
        assert!(n.contains(&49) && n.contains(&51) && n.contains(&18) && n.contains(&82));
        assert!(n.len() < 16 && !n.contains(&50));
        // A billion values: a few dozen probes.
        assert!(grid_neighbours(1_000_000_000, 0).len() < 40);
    }
}
