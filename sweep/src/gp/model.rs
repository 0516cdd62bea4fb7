//! A Gaussian-process regressor with a Matérn-5/2 kernel and one length scale per parameter
//! (automatic relevance determination), its kernel parameters fitted by maximizing the log
//! marginal likelihood plus a log prior on them (Optuna's, with long length scales made
//! costlier). Inputs lie in [0, 1] per dimension; categorical dimensions hold the choice's
//! index and count as distance 1 when they differ (the Hamming distance), 0 when equal.

use nalgebra::{Cholesky, DMatrix, DVector};

use crate::optim::{self, Options};

/// The smallest noise variance: keeps the kernel matrix well conditioned.
pub(crate) const MIN_NOISE: f64 = 1e-6;

/// The log prior on an inverse squared length scale x is −(LONG_SCALE_PENALTY/x +
/// SHORT_SCALE_PENALTY·x): its mode is at x = √(LONG/SHORT) ≈ 3.2 (a length scale of 0.56 of
/// the unit cube). Optuna uses 0.1 for both (mode at a length scale of 1, and a length scale
/// of 3 costs only 0.9 nats), which lets a fit on a few dozen trials of a multimodal function
/// (Hartmann-6) declare a parameter irrelevant; the GP then stops varying it and stays on a
/// local optimum. With 1.0, a length scale of 3 costs 9 nats, and over 60 seeds the mean best
/// on Hartmann-6 went from −2.76 to −3.03 at 30 trials and from −3.02 to −3.21 at 50
/// (docs/sweeps.md).
const LONG_SCALE_PENALTY: f64 = 1.0;
const SHORT_SCALE_PENALTY: f64 = 0.1;
/// A categorical parameter's distance is 0 or 1 (not a position in the cube): a long length
/// scale there says the choices behave alike, which is a finding, not a sign of too little
/// data, so it keeps Optuna's 0.1.
const CATEGORICAL_LONG_SCALE_PENALTY: f64 = 0.1;

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Hyper {
    /// Inverse squared length scale of each dimension.
    pub ils: Vec<f64>,
    pub scale: f64,
    pub noise: f64,
}

/// Matérn-5/2 as a function of the squared scaled distance, and its derivative with respect to
/// that squared distance.
pub(crate) fn matern52(r2: f64) -> (f64, f64) {
    let s = (5.0 * r2).sqrt();
    let e = (-s).exp();
    (e * (5.0 / 3.0 * r2 + s + 1.0), -5.0 / 6.0 * (1.0 + s) * e)
}

/// Per-dimension squared differences of two points.
fn sqd(a: &[f64], b: &[f64], cat: &[bool], out: &mut [f64]) {
    for j in 0..a.len() {
        out[j] = if cat[j] {
            if a[j] == b[j] {
                0.0
            } else {
                1.0
            }
        } else {
            (a[j] - b[j]).powi(2)
        };
    }
}

pub(crate) struct Gp {
    x: Vec<Vec<f64>>,
    cat: Vec<bool>,
    pub hyper: Hyper,
    /// The lower Cholesky factor of K + noise·I.
    l: DMatrix<f64>,
    /// (K + noise·I)⁻¹ y.
    alpha: DVector<f64>,
}

impl Gp {
    /// The posterior given the data and kernel parameters, or None when the kernel matrix
    /// cannot be factored.
    pub(crate) fn new(x: Vec<Vec<f64>>, y: &[f64], cat: Vec<bool>, hyper: Hyper) -> Option<Gp> {
        let n = x.len();
        let d = cat.len();
        let mut buf = vec![0.0; d];
        let mut k = DMatrix::<f64>::zeros(n, n);
        for a in 0..n {
            k[(a, a)] = hyper.scale + hyper.noise;
            for b in 0..a {
                sqd(&x[a], &x[b], &cat, &mut buf);
                let r2: f64 = buf.iter().zip(&hyper.ils).map(|(s, w)| s * w).sum();
                let v = hyper.scale * matern52(r2).0;
                k[(a, b)] = v;
                k[(b, a)] = v;
            }
        }
        let chol = Cholesky::new(k)?;
        let alpha = chol.solve(&DVector::from_column_slice(y));
        Some(Gp {
            x,
            cat,
            hyper,
            l: chol.unpack(),
            alpha,
        })
    }

    pub(crate) fn dim(&self) -> usize {
        self.cat.len()
    }

    /// Posterior mean and variance at `q`; with `grad`, also their gradients with respect to
    /// the continuous coordinates of `q` (categorical entries are left at 0).
    pub(crate) fn posterior(
        &self,
        q: &[f64],
        grad: Option<(&mut [f64], &mut [f64])>,
    ) -> (f64, f64) {
        let n = self.x.len();
        let d = self.dim();
        let mut buf = vec![0.0; d];
        let mut kv = DVector::<f64>::zeros(n);
        let mut dk = vec![0.0; n];
        for i in 0..n {
            sqd(q, &self.x[i], &self.cat, &mut buf);
            let r2: f64 = buf.iter().zip(&self.hyper.ils).map(|(s, w)| s * w).sum();
            let (m, dm) = matern52(r2);
            kv[i] = self.hyper.scale * m;
            dk[i] = self.hyper.scale * dm;
        }
        let mean = kv.dot(&self.alpha);
        let mut v = kv;
        self.l.solve_lower_triangular_mut(&mut v);
        let var = (self.hyper.scale - v.dot(&v)).max(0.0);
        if let Some((gm, gv)) = grad {
            // K⁻¹k, for the variance's gradient.
            self.l.tr_solve_lower_triangular_mut(&mut v);
            gm.fill(0.0);
            gv.fill(0.0);
            for i in 0..n {
                let (a, w) = (self.alpha[i] * dk[i], -2.0 * v[i] * dk[i]);
                for j in 0..d {
                    if self.cat[j] {
                        continue;
                    }
                    let dr2 = 2.0 * self.hyper.ils[j] * (q[j] - self.x[i][j]);
                    gm[j] += a * dr2;
                    gv[j] += w * dr2;
                }
            }
        }
        (mean, var)
    }
}

/// The negated log marginal likelihood plus log prior of the raw kernel parameters
/// (log inverse squared length scales, log scale, log(noise − MIN_NOISE)), and its gradient.
struct Objective<'a> {
    n: usize,
    d: usize,
    y: &'a [f64],
    /// Which dimensions are categorical.
    cat: &'a [bool],
    /// Squared differences of each pair a > b, d entries per pair, pairs in row order.
    pairs: Vec<f64>,
}

impl Objective<'_> {
    fn eval(&self, raw: &[f64], grad: &mut [f64]) -> f64 {
        let (n, d) = (self.n, self.d);
        let ils: Vec<f64> = raw[..d].iter().map(|r| r.exp()).collect();
        let scale = raw[d].exp();
        let noise_raw = raw[d + 1].exp();
        let noise = noise_raw + MIN_NOISE;
        let mut k = DMatrix::<f64>::zeros(n, n);
        let mut dm = vec![0.0; self.pairs.len() / d.max(1)];
        let mut p = 0;
        for a in 0..n {
            k[(a, a)] = scale + noise;
            for b in 0..a {
                let s = &self.pairs[p * d..(p + 1) * d];
                let r2: f64 = s.iter().zip(&ils).map(|(x, w)| x * w).sum();
                let (m, dmr) = matern52(r2);
                k[(a, b)] = scale * m;
                k[(b, a)] = scale * m;
                dm[p] = scale * dmr;
                p += 1;
            }
        }
        let Some(chol) = Cholesky::new(k.clone()) else {
            return f64::INFINITY;
        };
        let alpha = chol.solve(&DVector::from_column_slice(self.y));
        let l = chol.l_dirty();
        let log_det_half: f64 = (0..n).map(|i| l[(i, i)].ln()).sum();
        let mll = -log_det_half - 0.5 * alpha.dot(&DVector::from_column_slice(self.y));
        let kinv = chol.inverse();
        // d mll / d theta = 1/2 tr((alpha alphaᵀ - K⁻¹) dK/dtheta).
        grad.fill(0.0);
        let mut p = 0;
        let mut g_scale = 0.0;
        let mut trace_w = 0.0;
        for a in 0..n {
            let w_aa = alpha[a] * alpha[a] - kinv[(a, a)];
            trace_w += w_aa;
            g_scale += 0.5 * w_aa * scale;
            for b in 0..a {
                let w = alpha[a] * alpha[b] - kinv[(a, b)];
                // Both (a, b) and (b, a): the 1/2 cancels.
                g_scale += w * (k[(a, b)]);
                let c = w * dm[p];
                let s = &self.pairs[p * d..(p + 1) * d];
                for j in 0..d {
                    grad[j] += c * s[j];
                }
                p += 1;
            }
        }
        for j in 0..d {
            grad[j] *= ils[j];
        }
        grad[d] = g_scale;
        grad[d + 1] = 0.5 * trace_w * noise_raw;
        // On each inverse squared length scale -(LONG/x + SHORT·x), Gamma(2, 1) on the scale,
        // Gamma(1.1, 30) on the noise (constants dropped): Optuna's prior, except that a length
        // scale longer than the unit cube costs ten times as much on an ordered parameter (see
        // LONG_SCALE_PENALTY).
        let mut prior = 0.0;
        for j in 0..d {
            let long = if self.cat[j] {
                CATEGORICAL_LONG_SCALE_PENALTY
            } else {
                LONG_SCALE_PENALTY
            };
            prior -= long / ils[j] + SHORT_SCALE_PENALTY * ils[j];
            grad[j] += long / ils[j] - SHORT_SCALE_PENALTY * ils[j];
        }
        prior += scale.ln() - scale;
        grad[d] += 1.0 - scale;
        prior += 0.1 * noise.ln() - 30.0 * noise;
        grad[d + 1] += (0.1 / noise - 30.0) * noise_raw;
        for g in grad.iter_mut() {
            *g = -*g;
        }
        -(mll + prior)
    }
}

/// Fits the kernel parameters from each of `starts` (inverse squared length scale, scale,
/// noise) and keeps the fit with the best penalized likelihood.
pub(crate) fn fit(x: &[Vec<f64>], y: &[f64], cat: &[bool], starts: &[(f64, f64, f64)]) -> Hyper {
    let n = x.len();
    let d = cat.len();
    let mut pairs = Vec::with_capacity(n * n.saturating_sub(1) / 2 * d);
    let mut buf = vec![0.0; d];
    for a in 0..n {
        for b in 0..a {
            sqd(&x[a], &x[b], cat, &mut buf);
            pairs.extend_from_slice(&buf);
        }
    }
    let obj = Objective {
        n,
        d,
        y,
        cat,
        pairs,
    };
    let inf = vec![f64::INFINITY; d + 2];
    let neg_inf = vec![f64::NEG_INFINITY; d + 2];
    // Optuna's tolerance: a tighter one makes the fit chase numerical noise.
    let opts = Options {
        max_iter: 200,
        gtol: 1e-2,
        ..Options::default()
    };
    let mut best: Option<(Vec<f64>, f64)> = None;
    for &(ils0, scale0, noise0) in starts {
        let mut x0 = vec![ils0.ln(); d];
        x0.push(scale0.ln());
        x0.push((noise0 - 0.99 * MIN_NOISE).ln());
        let out = optim::minimize(|r, g| obj.eval(r, g), &x0, &neg_inf, &inf, &opts);
        if out.f.is_finite() && best.as_ref().is_none_or(|(_, f)| out.f < *f) {
            best = Some((out.x, out.f));
        }
    }
    match best {
        Some((raw, _)) => Hyper {
            ils: raw[..d].iter().map(|r| r.exp()).collect(),
            scale: raw[d].exp(),
            noise: raw[d + 1].exp() + MIN_NOISE,
        },
        None => Hyper {
            ils: vec![1.0; d],
            scale: 1.0,
            noise: 1.0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_likelihood_gradient_matches_finite_differences() {
        let x: Vec<Vec<f64>> = (0..9)
            .map(|i| {
                vec![
                    (i as f64 * 0.37) % 1.0,
                    (i as f64 * 0.61) % 1.0,
                    (i % 3) as f64,
                ]
            })
            .collect();
        let y: Vec<f64> = x
            .iter()
            .map(|p| (3.0 * p[0]).sin() + p[1] - 0.3 * p[2])
            .collect();
        let cat = vec![false, false, true];
        let mut pairs = Vec::new();
        let mut buf = vec![0.0; 3];
        for a in 0..x.len() {
            for b in 0..a {
                sqd(&x[a], &x[b], &cat, &mut buf);
                pairs.extend_from_slice(&buf);
            }
        }
        let obj = Objective {
            n: x.len(),
            d: 3,
            y: &y,
            cat: &cat,
            pairs,
        };
        let raw = [0.3, -0.5, 0.1, 0.2, -3.0];
        let mut g = vec![0.0; 5];
        obj.eval(&raw, &mut g);
        for i in 0..5 {
            let h = 1e-6;
            let (mut up, mut down) = (raw, raw);
            up[i] += h;
            down[i] -= h;
            let mut scratch = vec![0.0; 5];
            let numeric = (obj.eval(&up, &mut scratch) - obj.eval(&down, &mut scratch)) / (2.0 * h);
            assert!(
                (numeric - g[i]).abs() < 1e-5 * (1.0 + numeric.abs()),
                "{i}: {numeric} vs {}",
                g[i]
            );
        }
    }

    #[test]
    fn the_posterior_interpolates_its_data_and_its_gradient_matches_finite_differences() {
        let x: Vec<Vec<f64>> = (0..8)
            .map(|i| vec![i as f64 / 7.0, ((i * 3) % 8) as f64 / 7.0])
            .collect();
        let y: Vec<f64> = x.iter().map(|p| (4.0 * p[0]).cos() * p[1]).collect();
        let hyper = Hyper {
            ils: vec![4.0, 2.0],
            scale: 1.0,
            noise: 1e-6,
        };
        let gp = Gp::new(x.clone(), &y, vec![false, false], hyper).unwrap();
        let (m, v) = gp.posterior(&x[3], None);
        assert!((m - y[3]).abs() < 1e-3 && v < 1e-4, "{m} {v}");
        let q = [0.43, 0.71];
        let (mut gm, mut gv) = (vec![0.0; 2], vec![0.0; 2]);
        gp.posterior(&q, Some((&mut gm, &mut gv)));
        for j in 0..2 {
            let h = 1e-6;
            let (mut up, mut down) = (q, q);
            up[j] += h;
            down[j] -= h;
            let (mu, vu) = gp.posterior(&up, None);
            let (md, vd) = gp.posterior(&down, None);
            assert!(((mu - md) / (2.0 * h) - gm[j]).abs() < 1e-5, "mean {j}");
            assert!(((vu - vd) / (2.0 * h) - gv[j]).abs() < 1e-5, "var {j}");
        }
    }

    #[test]
    fn fitting_finds_the_relevant_dimension_shorter_than_the_irrelevant_one() {
        let x: Vec<Vec<f64>> = (0..30)
            .map(|i| vec![((i * 7) % 30) as f64 / 29.0, ((i * 11) % 30) as f64 / 29.0])
            .collect();
        let y: Vec<f64> = x.iter().map(|p| (6.0 * p[0]).sin()).collect();
        let h = fit(&x, &y, &[false, false], &[(1.0, 1.0, 1.0)]);
        assert!(h.ils[0] > 10.0 * h.ils[1], "{h:?}");
        assert!(h.noise < 0.05, "{h:?}");
    }
}
