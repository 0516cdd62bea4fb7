//! One parameter's space: which values are valid, how they map to the internal numeric axis
//! the search algorithms work on (log scale for log parameters, indices for categoricals), how
//! to draw one at random and how to enumerate a finite one.

use rand::Rng;
use serde_json::Value;

use crate::spec::Param;

/// Relative slack when checking that a number is a multiple of `q` or inside a range: values
/// come back from a database as decimal text and may be off in the last bits.
const TOL: f64 = 1e-9;

/// The internal axis of a parameter, as the samplers and the importance forest see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Axis {
    /// A constant: nothing to search.
    Fixed,
    /// A categorical with this many choices; the internal value is the index.
    Choice(usize),
    /// A numeric axis `[lo, hi]` (already in log space for log parameters). `step` is set when
    /// the valid values are evenly spaced on this axis (integers, `q_uniform`); `lo`/`hi` then
    /// extend half a step beyond the first and last valid value so every value owns a cell of
    /// the same width.
    Num { lo: f64, hi: f64, step: Option<f64> },
}

/// A JSON number from a float, or null for the non-finite (validation keeps those out).
pub(crate) fn num(x: f64) -> Value {
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

/// A finite number out of a JSON value.
pub(crate) fn as_f64(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

/// Equality that treats `4` and `4.0` as the same value (the database may hand back either).
pub(crate) fn value_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y || (x - y).abs() <= TOL * x.abs().max(y.abs()),
            _ => x == y,
        },
        _ => a == b,
    }
}

/// Rounds away the binary noise of `k * q` (0.30000000000000004 -> 0.3) by keeping 12
/// significant digits.
fn clean(x: f64) -> f64 {
    format!("{x:.11e}").parse().unwrap_or(x)
}

fn integral(x: f64) -> bool {
    x.fract() == 0.0 && x.abs() < 9.0e15
}

/// The multiples of `q` inside `[min, max]`, as a range of multipliers.
pub(crate) fn q_range(min: f64, max: f64, q: f64) -> (i64, i64) {
    let lo = (min / q - TOL).ceil() as i64;
    let hi = (max / q + TOL).floor() as i64;
    (lo, hi)
}

/// The value `k * q`: an integer when q and both bounds are integers (a batch size drawn with
/// `q: 8` should reach the trainer as `64`, not `64.0`).
fn q_value(k: i64, min: f64, max: f64, q: f64) -> Value {
    let x = clean(k as f64 * q);
    if integral(q) && integral(min) && integral(max) && integral(x) {
        Value::from(x as i64)
    } else {
        num(x)
    }
}

fn within(x: f64, min: f64, max: f64) -> bool {
    let slack = TOL * min.abs().max(max.abs()).max(1.0);
    x >= min - slack && x <= max + slack
}

fn multiple_of(x: f64, q: f64) -> bool {
    let k = x / q;
    (k - k.round()).abs() <= 1e-6
}

pub(crate) fn axis(param: &Param) -> Axis {
    match *param {
        Param::Constant { .. } => Axis::Fixed,
        Param::Categorical { ref values } => Axis::Choice(values.len()),
        Param::Uniform { min, max } => Axis::Num {
            lo: min,
            hi: max,
            step: None,
        },
        Param::LogUniform { min, max } => Axis::Num {
            lo: min.ln(),
            hi: max.ln(),
            step: None,
        },
        Param::IntUniform { min, max } => Axis::Num {
            lo: min as f64 - 0.5,
            hi: max as f64 + 0.5,
            step: Some(1.0),
        },
        Param::IntLogUniform { min, max } => Axis::Num {
            lo: (min as f64 - 0.5).max(0.5).ln(),
            hi: (max as f64 + 0.5).ln(),
            step: None,
        },
        Param::QUniform { min, max, q } => {
            let (a, b) = q_range(min, max, q);
            Axis::Num {
                lo: (a as f64 - 0.5) * q,
                hi: (b as f64 + 0.5) * q,
                step: Some(q),
            }
        }
        Param::QLogUniform { min, max, q } => {
            let (a, b) = q_range(min, max, q);
            let lo = ((a as f64 - 0.5) * q).max(a as f64 * q * 0.5);
            Axis::Num {
                lo: lo.ln(),
                hi: ((b as f64 + 0.5) * q).ln(),
                step: None,
            }
        }
    }
}

/// A value of the space on its internal axis, or None when the value is not one the current
/// space can produce (the spec changed mid-sweep, or the history holds something else): such a
/// value is ignored for this parameter.
pub(crate) fn encode(param: &Param, v: &Value) -> Option<f64> {
    match *param {
        Param::Constant { ref value } => value_eq(value, v).then_some(0.0),
        Param::Categorical { ref values } => {
            values.iter().position(|c| value_eq(c, v)).map(|i| i as f64)
        }
        Param::Uniform { min, max } => as_f64(v).filter(|&x| within(x, min, max)),
        Param::LogUniform { min, max } => as_f64(v)
            .filter(|&x| within(x, min, max) && x > 0.0)
            .map(f64::ln),
        Param::IntUniform { min, max } => {
            as_f64(v).filter(|&x| integral(x) && within(x, min as f64, max as f64))
        }
        Param::IntLogUniform { min, max } => as_f64(v)
            .filter(|&x| integral(x) && within(x, min as f64, max as f64) && x > 0.0)
            .map(f64::ln),
        Param::QUniform { min, max, q } => {
            as_f64(v).filter(|&x| within(x, min, max) && multiple_of(x, q))
        }
        Param::QLogUniform { min, max, q } => as_f64(v)
            .filter(|&x| within(x, min, max) && multiple_of(x, q) && x > 0.0)
            .map(f64::ln),
    }
}

/// The value at a point of the internal axis: rounded to the nearest valid value and clamped
/// into the range, so whatever a sampler proposes is a value the space can produce.
pub(crate) fn decode(param: &Param, x: f64) -> Value {
    match *param {
        Param::Constant { ref value } => value.clone(),
        Param::Categorical { ref values } => {
            let i = (x.round().max(0.0) as usize).min(values.len().saturating_sub(1));
            values.get(i).cloned().unwrap_or(Value::Null)
        }
        Param::Uniform { min, max } => num(x.clamp(min, max)),
        Param::LogUniform { min, max } => num(x.exp().clamp(min, max)),
        Param::IntUniform { min, max } => Value::from((x.round() as i64).clamp(min, max)),
        Param::IntLogUniform { min, max } => Value::from((x.exp().round() as i64).clamp(min, max)),
        Param::QUniform { min, max, q } => {
            let (a, b) = q_range(min, max, q);
            q_value(((x / q).round() as i64).clamp(a, b), min, max, q)
        }
        Param::QLogUniform { min, max, q } => {
            let (a, b) = q_range(min, max, q);
            q_value(((x.exp() / q).round() as i64).clamp(a, b), min, max, q)
        }
    }
}

/// A value drawn from the parameter's own distribution: uniform on the internal axis, which is
/// the log scale for log parameters. Quantized parameters round a continuous draw (so the two
/// end multiples get half a cell each, as in W&B).
pub(crate) fn sample<R: Rng>(param: &Param, rng: &mut R) -> Value {
    match *param {
        Param::Constant { ref value } => value.clone(),
        Param::Categorical { ref values } => values
            .get(rng.random_range(0..values.len().max(1)))
            .cloned()
            .unwrap_or(Value::Null),
        Param::IntUniform { min, max } => Value::from(rng.random_range(min..=max)),
        Param::Uniform { min, max } | Param::QUniform { min, max, .. } => {
            decode(param, min + rng.random::<f64>() * (max - min))
        }
        Param::LogUniform { min, max } | Param::QLogUniform { min, max, .. } => decode(
            param,
            min.ln() + rng.random::<f64>() * (max.ln() - min.ln()),
        ),
        Param::IntLogUniform { .. } => match axis(param) {
            Axis::Num { lo, hi, .. } => decode(param, lo + rng.random::<f64>() * (hi - lo)),
            _ => Value::Null,
        },
    }
}

/// How many values a grid over this parameter has; None for continuous parameters.
pub(crate) fn grid_count(param: &Param) -> Option<u64> {
    match *param {
        Param::Constant { .. } => Some(1),
        Param::Categorical { ref values } => Some(values.len() as u64),
        Param::IntUniform { min, max } => Some(max.abs_diff(min).saturating_add(1)),
        Param::QUniform { min, max, q } => {
            let (a, b) = q_range(min, max, q);
            Some(b.abs_diff(a).saturating_add(1))
        }
        _ => None,
    }
}

/// The `i`-th grid value of a finite parameter (in increasing order for ranges).
pub(crate) fn grid_value(param: &Param, i: u64) -> Value {
    match *param {
        Param::Constant { ref value } => value.clone(),
        Param::Categorical { ref values } => values.get(i as usize).cloned().unwrap_or(Value::Null),
        Param::IntUniform { min, .. } => Value::from(min.saturating_add(i as i64)),
        Param::QUniform { min, max, q } => q_value(q_range(min, max, q).0 + i as i64, min, max, q),
        _ => Value::Null,
    }
}

/// Which grid value `v` is, or None when the current grid does not contain it.
pub(crate) fn grid_index(param: &Param, v: &Value) -> Option<u64> {
    match *param {
        Param::Constant { ref value } => value_eq(value, v).then_some(0),
        Param::Categorical { ref values } => {
            values.iter().position(|c| value_eq(c, v)).map(|i| i as u64)
        }
        Param::IntUniform { min, .. } => encode(param, v).map(|x| (x as i64).abs_diff(min)),
        Param::QUniform { min, max, q } => {
            encode(param, v).map(|x| ((x / q).round() as i64).abs_diff(q_range(min, max, q).0))
        }
        _ => None,
    }
}

/// The representative values the server checks against the trainer's config validation.
pub(crate) fn probe(param: &Param) -> Vec<Value> {
    match *param {
        Param::Constant { ref value } => vec![value.clone()],
        Param::Categorical { ref values } => values.clone(),
        Param::Uniform { min, max } | Param::LogUniform { min, max } => vec![num(min), num(max)],
        Param::IntUniform { min, max } | Param::IntLogUniform { min, max } => {
            vec![Value::from(min), Value::from(max)]
        }
        Param::QUniform { min, max, q } | Param::QLogUniform { min, max, q } => {
            let (a, b) = q_range(min, max, q);
            vec![q_value(a, min, max, q), q_value(b, min, max, q)]
        }
    }
}
