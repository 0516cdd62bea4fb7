//! Analytic test functions with known minima, for measuring the search (tests, the `quality`
//! and `search` examples, and bench/sweep_quality.py, which holds the same functions in
//! Python for Optuna).

use std::f64::consts::PI;

/// Branin's domain: x1 in [-5, 10], x2 in [0, 15].
pub const BRANIN_BOUNDS: [(f64, f64); 2] = [(-5.0, 10.0), (0.0, 15.0)];
/// Branin's global minimum, reached at (-pi, 12.275), (pi, 2.275) and (9.42478, 2.475).
pub const BRANIN_MIN: f64 = 0.397_887_357_729_738_2;

pub fn branin(x1: f64, x2: f64) -> f64 {
    let b = 5.1 / (4.0 * PI * PI);
    let c = 5.0 / PI;
    let t = 1.0 / (8.0 * PI);
    let a = x2 - b * x1 * x1 + c * x1 - 6.0;
    a * a + 10.0 * (1.0 - t) * x1.cos() + 10.0
}

const H_ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
const H_A: [[f64; 6]; 4] = [
    [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
    [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
    [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
    [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
];
const H_P: [[f64; 6]; 4] = [
    [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
    [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
    [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
    [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
];

/// Hartmann-6's global minimum on [0, 1]^6.
pub const HARTMANN6_MIN: f64 = -3.322_368_011_415_515;
/// Where Hartmann-6 reaches its minimum.
pub const HARTMANN6_ARGMIN: [f64; 6] = [0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573];

pub fn hartmann6(x: &[f64; 6]) -> f64 {
    -(0..4)
        .map(|i| {
            let inner: f64 = (0..6).map(|j| H_A[i][j] * (x[j] - H_P[i][j]).powi(2)).sum();
            H_ALPHA[i] * (-inner).exp()
        })
        .sum::<f64>()
}

/// The choices of `mixed`'s optimizer, and for each its best log10 learning rate and its floor.
pub const MIXED_OPTIMIZERS: [(&str, f64, f64); 4] = [
    ("sgd", -1.0, 0.8),
    ("momentum", -1.7, 0.4),
    ("adam", -3.0, 0.1),
    ("adamw", -2.8, 0.0),
];
/// `mixed`'s global minimum, reached at adamw, lr = 10^-2.8, depth 5, width 128, dropout 0.3.
pub const MIXED_MIN: f64 = 0.0;

/// A synthetic "training loss" over a mixed space, minimum 0: `optimizer` one of
/// `MIXED_OPTIMIZERS` (by index), `lr` log-uniform in [1e-5, 1], `depth` an integer in [1, 8],
/// `width` an integer in [8, 1024] on a log scale, `dropout` in [0, 0.6]. The parameters
/// interact the way real ones do: the best learning rate depends on the optimizer, the best
/// width on the depth, the best dropout on the width.
pub fn mixed(optimizer: usize, lr: f64, depth: i64, width: i64, dropout: f64) -> f64 {
    let (_, best_lr, floor) = MIXED_OPTIMIZERS[optimizer.min(MIXED_OPTIMIZERS.len() - 1)];
    let log_width = (width as f64).log2();
    let best_width = 4.0 + 0.6 * depth as f64;
    let best_dropout = 0.1 + 0.05 * (log_width - 3.0);
    floor
        + 0.5 * (lr.log10() - best_lr).powi(2)
        + 0.15 * (depth as f64 - 5.0).powi(2)
        + 0.25 * (log_width - best_width).powi(2)
        + 4.0 * (dropout - best_dropout).powi(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branin_reaches_its_minimum_at_all_three_minimizers() {
        for (x1, x2) in [(-PI, 12.275), (PI, 2.275), (9.424_78, 2.475)] {
            assert!(
                (branin(x1, x2) - BRANIN_MIN).abs() < 1e-5,
                "at ({x1}, {x2})"
            );
        }
        assert!(branin(0.0, 0.0) > BRANIN_MIN + 1.0);
    }

    #[test]
    fn mixed_reaches_its_minimum_at_the_known_minimizer_only() {
        assert!((mixed(3, 10f64.powf(-2.8), 5, 128, 0.3) - MIXED_MIN).abs() < 1e-12);
        assert!(mixed(2, 10f64.powf(-2.8), 5, 128, 0.3) > 0.1);
        assert!(mixed(3, 10f64.powf(-2.8), 4, 128, 0.3) > 0.1);
        assert!(mixed(3, 1e-2, 5, 128, 0.3) > 0.1);
    }

    #[test]
    fn hartmann6_reaches_its_minimum_at_the_known_minimizer() {
        assert!((hartmann6(&HARTMANN6_ARGMIN) - HARTMANN6_MIN).abs() < 1e-4);
        assert!(hartmann6(&[0.5; 6]) > HARTMANN6_MIN + 0.5);
    }
}
