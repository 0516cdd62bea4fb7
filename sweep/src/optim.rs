//! A limited-memory quasi-Newton minimizer (L-BFGS) for smooth functions on a box: the
//! search direction comes from the last few gradient differences (the two-loop recursion),
//! variables held at a bound by their gradient stay there, and each step is a backtracking
//! line search along the path projected into the box (Armijo's sufficient decrease). Used to
//! fit the Gaussian process's kernel parameters and to refine the acquisition's optimum.

pub(crate) struct Options {
    pub max_iter: usize,
    /// Stop once no free variable's gradient exceeds this.
    pub gtol: f64,
    /// Stop once an iteration improves f by less than this relative amount.
    pub ftol: f64,
    /// Correction pairs kept.
    pub memory: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_iter: 200,
            gtol: 1e-5,
            // SciPy's L-BFGS-B default (factr 1e7 times the machine epsilon).
            ftol: 2.2e-9,
            memory: 10,
        }
    }
}

pub(crate) struct Outcome {
    pub x: Vec<f64>,
    pub f: f64,
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Minimizes `f` (which returns the value and writes the gradient) from `x0` inside
/// `[lower, upper]` (infinite bounds for none). A non-finite value counts as worse than any.
pub(crate) fn minimize(
    mut f: impl FnMut(&[f64], &mut [f64]) -> f64,
    x0: &[f64],
    lower: &[f64],
    upper: &[f64],
    opts: &Options,
) -> Outcome {
    let n = x0.len();
    let project = |x: &mut [f64]| {
        for i in 0..n {
            x[i] = x[i].clamp(lower[i], upper[i]);
        }
    };
    let mut x = x0.to_vec();
    project(&mut x);
    let mut g = vec![0.0; n];
    let mut fx = f(&x, &mut g);
    if !fx.is_finite() || g.iter().any(|v| !v.is_finite()) {
        return Outcome { x, f: fx };
    }
    let mut pairs: std::collections::VecDeque<(Vec<f64>, Vec<f64>, f64)> = Default::default();
    let mut gn = vec![0.0; n];
    let mut xn = vec![0.0; n];
    let mut iters = 0;
    while iters < opts.max_iter {
        // Variables pushed against a bound by their gradient are held there this iteration.
        let free: Vec<bool> = (0..n)
            .map(|i| !((x[i] <= lower[i] && g[i] > 0.0) || (x[i] >= upper[i] && g[i] < 0.0)))
            .collect();
        let q: Vec<f64> = (0..n).map(|i| if free[i] { g[i] } else { 0.0 }).collect();
        if q.iter().all(|v| v.abs() <= opts.gtol) {
            break;
        }
        let mut d = two_loop(&q, &pairs);
        for i in 0..n {
            if !free[i] {
                d[i] = 0.0;
            }
            d[i] = -d[i];
        }
        if dot(&d, &q) >= 0.0 || d.iter().any(|v| !v.is_finite()) {
            d = q.iter().map(|v| -v).collect();
            pairs.clear();
        }
        let mut t = if pairs.is_empty() {
            (1.0 / dot(&d, &d).sqrt()).min(1.0)
        } else {
            1.0
        };
        let mut accepted = None;
        for _ in 0..40 {
            for i in 0..n {
                xn[i] = x[i] + t * d[i];
            }
            project(&mut xn);
            let moved: f64 = (0..n).map(|i| (xn[i] - x[i]) * g[i]).sum();
            if xn == x || moved >= 0.0 {
                break;
            }
            let fnew = f(&xn, &mut gn);
            if fnew.is_finite() && gn.iter().all(|v| v.is_finite()) && fnew <= fx + 1e-4 * moved {
                accepted = Some(fnew);
                break;
            }
            t *= 0.5;
        }
        iters += 1;
        let Some(fnew) = accepted else {
            break;
        };
        let s: Vec<f64> = (0..n).map(|i| xn[i] - x[i]).collect();
        let y: Vec<f64> = (0..n).map(|i| gn[i] - g[i]).collect();
        let sy = dot(&s, &y);
        if sy > 1e-10 * dot(&y, &y) {
            if pairs.len() == opts.memory {
                pairs.pop_front();
            }
            pairs.push_back((s, y, 1.0 / sy));
        }
        let small = fx - fnew <= opts.ftol * fx.abs().max(fnew.abs()).max(1.0);
        x.copy_from_slice(&xn);
        g.copy_from_slice(&gn);
        fx = fnew;
        if small {
            break;
        }
    }
    Outcome { x, f: fx }
}

/// H·q for the inverse-Hessian approximation of the stored pairs (oldest first).
fn two_loop(q: &[f64], pairs: &std::collections::VecDeque<(Vec<f64>, Vec<f64>, f64)>) -> Vec<f64> {
    let mut r = q.to_vec();
    let mut alphas = Vec::with_capacity(pairs.len());
    for (s, y, rho) in pairs.iter().rev() {
        let a = rho * dot(s, &r);
        for (ri, yi) in r.iter_mut().zip(y) {
            *ri -= a * yi;
        }
        alphas.push(a);
    }
    if let Some((s, y, _)) = pairs.back() {
        let gamma = dot(s, y) / dot(y, y);
        for ri in &mut r {
            *ri *= gamma;
        }
    }
    for ((s, y, rho), a) in pairs.iter().zip(alphas.iter().rev()) {
        let b = rho * dot(y, &r);
        for (ri, si) in r.iter_mut().zip(s) {
            *ri += (a - b) * si;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rosenbrock(x: &[f64], g: &mut [f64]) -> f64 {
        let (a, b) = (x[0], x[1]);
        g[0] = -2.0 * (1.0 - a) - 400.0 * a * (b - a * a);
        g[1] = 200.0 * (b - a * a);
        (1.0 - a).powi(2) + 100.0 * (b - a * a).powi(2)
    }

    #[test]
    fn it_finds_the_rosenbrock_minimum_without_bounds() {
        let inf = f64::INFINITY;
        let opts = Options {
            max_iter: 500,
            ftol: 0.0,
            ..Options::default()
        };
        let out = minimize(rosenbrock, &[-1.2, 1.0], &[-inf; 2], &[inf; 2], &opts);
        assert!(
            (out.x[0] - 1.0).abs() < 1e-4 && (out.x[1] - 1.0).abs() < 1e-4,
            "{:?}",
            out.x
        );
    }

    #[test]
    fn a_bound_that_cuts_off_the_minimum_is_where_it_stops() {
        // Minimum of (x - 2)^2 + (y + 1)^2 inside [0, 1] x [0, 1] is (1, 0).
        let f = |x: &[f64], g: &mut [f64]| {
            g[0] = 2.0 * (x[0] - 2.0);
            g[1] = 2.0 * (x[1] + 1.0);
            (x[0] - 2.0).powi(2) + (x[1] + 1.0).powi(2)
        };
        let out = minimize(f, &[0.3, 0.6], &[0.0; 2], &[1.0; 2], &Options::default());
        assert_eq!(out.x, vec![1.0, 0.0]);
        assert!((out.f - 2.0).abs() < 1e-12);
    }
}
