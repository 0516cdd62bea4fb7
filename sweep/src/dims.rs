//! The searched dimensions of a space as the model-based samplers (TPE, the Gaussian process)
//! see them: each parameter that can take more than one value, on its internal axis (the log
//! scale for log parameters, the index for categoricals), with the cells of discrete values.

use serde_json::Value;

use crate::space;
use crate::spec::{Param, SweepSpec};
use crate::{Params, Trial};

/// Evenly spaced valid values `first + k * step` (k = 0 .. count) in value space; on a log
/// dimension the internal axis holds their logarithms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Grid {
    pub first: f64,
    pub step: f64,
    pub count: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    /// A categorical with this many choices (at least 2); the internal value is the index.
    Cat(usize),
    /// A numeric axis `[lo, hi]`. With a grid, `lo`/`hi` are the outer edges of the first and
    /// last value's cells, each value owning the cell `[v - step/2, v + step/2]` (on the log
    /// scale when `log`).
    Num {
        lo: f64,
        hi: f64,
        log: bool,
        grid: Option<Grid>,
    },
}

pub(crate) struct Dim<'a> {
    pub key: &'a str,
    pub param: &'a Param,
    pub kind: Kind,
}

fn num(lo: f64, hi: f64, log: bool, grid: Option<Grid>) -> Option<Kind> {
    (lo.is_finite() && hi.is_finite() && lo < hi).then_some(Kind::Num { lo, hi, log, grid })
}

/// A grid dimension from its first value, step and count, or None when it has a single value.
fn grid(first: f64, step: f64, count: u64, log: bool) -> Option<Kind> {
    if count < 2 || (log && first - 0.5 * step <= 0.0) {
        return None;
    }
    let last = first + (count - 1) as f64 * step;
    let (lo, hi) = (first - 0.5 * step, last + 0.5 * step);
    let g = Some(Grid { first, step, count });
    if log {
        num(lo.ln(), hi.ln(), true, g)
    } else {
        num(lo, hi, false, g)
    }
}

/// The dimension of one parameter, or None when it can take only one value.
pub(crate) fn kind(param: &Param) -> Option<Kind> {
    match *param {
        Param::Constant { .. } => None,
        Param::Categorical { ref values } => (values.len() >= 2).then_some(Kind::Cat(values.len())),
        Param::Uniform { min, max } => num(min, max, false, None),
        Param::LogUniform { min, max } => num(min.ln(), max.ln(), true, None),
        Param::IntUniform { min, max } => grid(min as f64, 1.0, max.abs_diff(min) + 1, false),
        Param::IntLogUniform { min, max } => grid(min as f64, 1.0, max.abs_diff(min) + 1, true),
        Param::QUniform { min, max, q } => {
            let (a, b) = space::q_range(min, max, q);
            grid(a as f64 * q, q, b.abs_diff(a).saturating_add(1), false)
        }
        Param::QLogUniform { min, max, q } => {
            // Zero has no logarithm: the first multiple on a log scale is q itself.
            let (a, b) = space::q_range(min, max, q);
            let a = a.max(1);
            if a > b {
                return None;
            }
            grid(a as f64 * q, q, b.abs_diff(a) + 1, true)
        }
    }
}

/// The searched dimensions of a spec, in key order.
pub(crate) fn dims(spec: &SweepSpec) -> Vec<Dim<'_>> {
    spec.parameters
        .iter()
        .filter_map(|(key, param)| {
            kind(param).map(|kind| Dim {
                key: key.as_str(),
                param,
                kind,
            })
        })
        .collect()
}

impl Dim<'_> {
    /// A trial's value on this dimension's axis, or None when the current space cannot
    /// produce it (the spec changed mid-sweep, or the value is missing).
    pub(crate) fn encode(&self, params: &Params) -> Option<f64> {
        let x = space::encode(self.param, params.get(self.key)?)?;
        match self.kind {
            Kind::Cat(k) => (x >= 0.0 && (x as usize) < k).then_some(x),
            Kind::Num { lo, hi, .. } => x.is_finite().then(|| x.clamp(lo, hi)),
        }
    }

    /// The value at a point of the axis (rounded to a valid value).
    pub(crate) fn decode(&self, x: f64) -> Value {
        space::decode(self.param, x)
    }

    /// The nearest point of the axis the space can produce: the index of a categorical, the
    /// nearest grid value, the point itself clamped into a continuous range.
    pub(crate) fn snap(&self, x: f64) -> f64 {
        match self.kind {
            Kind::Cat(k) => x.round().clamp(0.0, (k - 1) as f64),
            Kind::Num { lo, hi, log, grid } => match grid {
                None => x.clamp(lo, hi),
                Some(g) => g.internal(g.index_of(x, log), log),
            },
        }
    }
}

impl Grid {
    /// The `k`-th value on the internal axis.
    pub(crate) fn internal(&self, k: u64, log: bool) -> f64 {
        let v = self.first + k as f64 * self.step;
        if log {
            v.ln()
        } else {
            v
        }
    }

    /// The index of the grid value nearest to internal point `x`.
    pub(crate) fn index_of(&self, x: f64, log: bool) -> u64 {
        let v = if log { x.exp() } else { x };
        let k = ((v - self.first) / self.step).round();
        if k.is_nan() || k <= 0.0 {
            0
        } else {
            (k as u64).min(self.count - 1)
        }
    }

    /// The cell of internal point `x` (a grid value) on the internal axis.
    pub(crate) fn cell(&self, x: f64, log: bool) -> (f64, f64) {
        if log {
            let v = x.exp();
            (
                (v - 0.5 * self.step).max(f64::MIN_POSITIVE).ln(),
                (v + 0.5 * self.step).ln(),
            )
        } else {
            (x - 0.5 * self.step, x + 0.5 * self.step)
        }
    }
}

/// A trial's point on the dimensions: one entry per dimension, None where its value does not
/// fit the current space.
pub(crate) fn point(dims: &[Dim], t: &Trial) -> Vec<Option<f64>> {
    dims.iter().map(|d| d.encode(&t.params)).collect()
}

/// The parameters of a point: each searched dimension decoded, every other parameter (the
/// constants and single-valued ranges, which decode to their one value from any point) at its
/// only value.
pub(crate) fn params_of(spec: &SweepSpec, dims: &[Dim], x: &[f64]) -> Params {
    let mut out: Params = spec
        .parameters
        .iter()
        .map(|(key, param)| (key.clone(), space::decode(param, 0.0)))
        .collect();
    for (d, &xi) in dims.iter().zip(x) {
        let only = match d.kind {
            Kind::Num { lo, hi, .. } => 0.5 * (lo + hi),
            Kind::Cat(_) => 0.0,
        };
        out.insert(
            d.key.to_string(),
            d.decode(if xi.is_finite() { xi } else { only }),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(v: serde_json::Value) -> Param {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn integer_and_quantized_ranges_become_grids_with_half_step_margins() {
        let k = kind(&param(
            json!({"distribution": "int_uniform", "min": 1, "max": 4}),
        ))
        .unwrap();
        let Kind::Num { lo, hi, log, grid } = k else {
            panic!("{k:?}")
        };
        assert_eq!((lo, hi, log), (0.5, 4.5, false));
        assert_eq!(grid.unwrap().count, 4);
        let k = kind(&param(
            json!({"distribution": "int_log_uniform", "min": 1, "max": 1000}),
        ))
        .unwrap();
        let Kind::Num { lo, hi, log, grid } = k else {
            panic!("{k:?}")
        };
        assert!(log && (lo - 0.5f64.ln()).abs() < 1e-12 && (hi - 1000.5f64.ln()).abs() < 1e-12);
        let g = grid.unwrap();
        assert_eq!(g.index_of(10f64.ln(), true), 9);
        let (a, b) = g.cell(10f64.ln(), true);
        assert!((a - 9.5f64.ln()).abs() < 1e-12 && (b - 10.5f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn single_valued_parameters_are_not_searched() {
        assert!(kind(&param(json!({"distribution": "constant", "value": 3}))).is_none());
        assert!(kind(&param(
            json!({"distribution": "categorical", "values": [1]})
        ))
        .is_none());
        assert!(kind(&param(
            json!({"distribution": "q_uniform", "min": 0.1, "max": 0.15, "q": 0.1})
        ))
        .is_none());
    }
}
