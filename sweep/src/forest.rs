//! A random forest of regression trees on the unit cube, fitted for fANOVA: each tree is kept
//! as its axis-aligned partition so the importance code can integrate over it exactly.

use rand::seq::index::sample;
use rand::Rng;

pub(crate) struct ForestConfig {
    pub trees: usize,
    /// Features tried at each split (a random subset of this size, then the rest if none of
    /// those can split).
    pub max_features: usize,
    pub min_leaf: usize,
    pub max_depth: usize,
}

/// One leaf of a tree: its box in the unit cube and its prediction.
#[derive(Clone, Debug)]
pub(crate) struct Leaf {
    pub lo: Vec<f64>,
    pub hi: Vec<f64>,
    pub value: f64,
}

/// The training data: rows of features in [0, 1], targets, and for each feature the number of
/// equal cells its values sit in the middle of (categoricals and integers), so splits fall on
/// cell boundaries rather than through a cell no sample can be in.
pub(crate) struct Data<'a> {
    pub x: &'a [Vec<f64>],
    pub y: &'a [f64],
    pub cells: &'a [Option<usize>],
}

/// Fits a forest on bootstrap resamples and returns each tree's leaves.
pub(crate) fn fit<R: Rng>(data: &Data, cfg: &ForestConfig, rng: &mut R) -> Vec<Vec<Leaf>> {
    let n = data.y.len();
    let dims = data.cells.len();
    (0..cfg.trees)
        .map(|_| {
            let rows: Vec<usize> = (0..n).map(|_| rng.random_range(0..n)).collect();
            let mut leaves = Vec::new();
            grow(
                data,
                cfg,
                rng,
                rows,
                vec![0.0; dims],
                vec![1.0; dims],
                0,
                &mut leaves,
            );
            leaves
        })
        .collect()
}

struct Split {
    feature: usize,
    threshold: f64,
    sse: f64,
}

#[allow(clippy::too_many_arguments)]
fn grow<R: Rng>(
    data: &Data,
    cfg: &ForestConfig,
    rng: &mut R,
    rows: Vec<usize>,
    lo: Vec<f64>,
    hi: Vec<f64>,
    depth: usize,
    leaves: &mut Vec<Leaf>,
) {
    let mean = rows.iter().map(|&r| data.y[r]).sum::<f64>() / rows.len().max(1) as f64;
    let split = if depth < cfg.max_depth && rows.len() >= 2 * cfg.min_leaf {
        best_split(data, cfg, rng, &rows)
    } else {
        None
    };
    let Some(split) = split else {
        leaves.push(Leaf {
            lo,
            hi,
            value: mean,
        });
        return;
    };
    let (left, right): (Vec<usize>, Vec<usize>) = rows
        .iter()
        .partition(|&&r| data.x[r][split.feature] < split.threshold);
    let (mut left_hi, mut right_lo) = (hi.clone(), lo.clone());
    left_hi[split.feature] = split.threshold;
    right_lo[split.feature] = split.threshold;
    grow(data, cfg, rng, left, lo, left_hi, depth + 1, leaves);
    grow(data, cfg, rng, right, right_lo, hi, depth + 1, leaves);
}

fn best_split<R: Rng>(
    data: &Data,
    cfg: &ForestConfig,
    rng: &mut R,
    rows: &[usize],
) -> Option<Split> {
    let dims = data.cells.len();
    let total_sse = sse(rows.iter().map(|&r| data.y[r]));
    let order: Vec<usize> = sample(rng, dims, dims).into_vec();
    let first = cfg.max_features.clamp(1, dims);
    let mut best: Option<Split> = None;
    for (tried, &feature) in order.iter().enumerate() {
        if tried >= first && best.is_some() {
            break;
        }
        if let Some(s) = split_on(data, cfg, rows, feature) {
            if best.as_ref().is_none_or(|b| s.sse < b.sse) {
                best = Some(s);
            }
        }
    }
    // A split that explains nothing only adds leaves.
    best.filter(|b| b.sse < total_sse - 1e-12 * total_sse.abs().max(1e-300))
}

fn sse(ys: impl Iterator<Item = f64>) -> f64 {
    let (mut n, mut s, mut s2) = (0.0, 0.0, 0.0);
    for y in ys {
        n += 1.0;
        s += y;
        s2 += y * y;
    }
    if n == 0.0 {
        0.0
    } else {
        (s2 - s * s / n).max(0.0)
    }
}

/// The best variance-reducing cut along one feature, scanning the rows in feature order.
fn split_on(data: &Data, cfg: &ForestConfig, rows: &[usize], feature: usize) -> Option<Split> {
    let mut sorted: Vec<usize> = rows.to_vec();
    sorted.sort_by(|&a, &b| data.x[a][feature].total_cmp(&data.x[b][feature]));
    let n = sorted.len();
    let (total, total2) = sorted.iter().fold((0.0, 0.0), |(s, s2), &r| {
        (s + data.y[r], s2 + data.y[r] * data.y[r])
    });
    let (mut s, mut s2) = (0.0, 0.0);
    let mut best: Option<Split> = None;
    for i in 0..n - 1 {
        let y = data.y[sorted[i]];
        s += y;
        s2 += y * y;
        let (a, b) = (data.x[sorted[i]][feature], data.x[sorted[i + 1]][feature]);
        let left_n = i + 1;
        if a == b || left_n < cfg.min_leaf || n - left_n < cfg.min_leaf {
            continue;
        }
        let (ln, rn) = (left_n as f64, (n - left_n) as f64);
        let cost = (s2 - s * s / ln) + ((total2 - s2) - (total - s) * (total - s) / rn);
        if best.as_ref().is_none_or(|bs| cost < bs.sse) {
            let threshold = match data.cells[feature] {
                // The boundary right after the lower value's cell.
                Some(k) => ((a * k as f64).floor() + 1.0) / k as f64,
                None => 0.5 * (a + b),
            };
            best = Some(Split {
                feature,
                threshold,
                sse: cost.max(0.0),
            });
        }
    }
    best
}
