//! Reading the `parameters` and `early_terminate` sections of a spec.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::parse::{bounded, describe, integer, join, number, text, Obj, Res};
use crate::spec::{EarlyTerminate, Param, SpecError};

pub(crate) const MAX_PARAMETERS: usize = 100;
pub(crate) const MAX_VALUES: usize = 1000;

const DISTRIBUTIONS: &str = "constant, categorical, uniform, log_uniform, int_uniform, \
                             int_log_uniform, q_uniform, q_log_uniform";

pub(crate) fn parse_parameters(v: &Value) -> Res<BTreeMap<String, Param>> {
    let obj = Obj::new(v, "parameters")?;
    if obj.map.is_empty() {
        return Err(SpecError::new("parameters", "needs at least one parameter"));
    }
    if obj.map.len() > MAX_PARAMETERS {
        return Err(SpecError::new(
            "parameters",
            format!(
                "has {} parameters, more than the limit of {MAX_PARAMETERS}",
                obj.map.len()
            ),
        ));
    }
    let mut out = BTreeMap::new();
    for (key, body) in obj.map {
        if key.trim().is_empty() {
            return Err(SpecError::new(
                "parameters",
                "a parameter name must not be empty",
            ));
        }
        out.insert(key.clone(), parse_param(body, &join("parameters", key))?);
    }
    Ok(out)
}

fn parse_param(v: &Value, path: &str) -> Res<Param> {
    let obj = Obj::new(v, path)?;
    let dist = obj.string("distribution")?;
    let dist = match dist {
        Some(d) => d,
        None if obj.has("value") => "constant".into(),
        None if obj.has("values") => "categorical".into(),
        // Like W&B: a range without a distribution is over integers when both bounds are.
        None if obj.has("min") && obj.has("max") => {
            let ints = ["min", "max"].iter().all(|k| obj.get(k).is_some_and(|b| b.is_i64() || b.is_u64()));
            if ints { "int_uniform".into() } else { "uniform".into() }
        }
        None if obj.has("parameters") => {
            return Err(SpecError::new(
                obj.field("parameters"),
                "nested parameters are not supported; name the parameter by its dotted config key instead",
            ))
        }
        None => {
            return Err(SpecError::new(path, "needs `value`, `values`, or a `distribution` with `min` and `max`"))
        }
    };
    let hint = |key: &str| {
        let h = match key {
            "probabilities" => {
                "weighted categoricals are not supported; values are drawn with equal chance"
            }
            "mu" | "sigma" => "normal distributions are not supported; use uniform or log_uniform",
            _ => return None,
        };
        Some(format!("unknown key `{key}`: {h}"))
    };
    match dist.as_str() {
        "constant" => {
            obj.check_keys(&["distribution", "value"], hint)?;
            let value = obj.require("value")?.clone();
            check_scalar(&value, &obj.field("value"))?;
            Ok(Param::Constant { value })
        }
        "categorical" => {
            obj.check_keys(&["distribution", "values"], hint)?;
            Ok(Param::Categorical {
                values: parse_values(obj.require("values")?, &obj.field("values"))?,
            })
        }
        "uniform" | "log_uniform" | "log_uniform_values" => {
            obj.check_keys(&["distribution", "min", "max"], hint)?;
            let (min, max) = float_bounds(&obj)?;
            if dist == "uniform" {
                Ok(Param::Uniform { min, max })
            } else {
                log_positive(&obj, min)?;
                Ok(Param::LogUniform { min, max })
            }
        }
        "int_uniform" | "int_log_uniform" => {
            obj.check_keys(&["distribution", "min", "max"], hint)?;
            let min = integer(obj.require("min")?, &obj.field("min"))?;
            let max = integer(obj.require("max")?, &obj.field("max"))?;
            if min >= max {
                return Err(SpecError::new(
                    obj.field("min"),
                    format!("min must be below max (got {min} and {max})"),
                ));
            }
            if dist == "int_uniform" {
                Ok(Param::IntUniform { min, max })
            } else {
                log_positive(&obj, min as f64)?;
                Ok(Param::IntLogUniform { min, max })
            }
        }
        "q_uniform" | "q_log_uniform" | "q_log_uniform_values" => {
            obj.check_keys(&["distribution", "min", "max", "q"], hint)?;
            let (min, max) = float_bounds(&obj)?;
            let q = number(obj.require("q")?, &obj.field("q"))?;
            if q <= 0.0 {
                return Err(SpecError::new(
                    obj.field("q"),
                    format!("q must be above 0 (got {q})"),
                ));
            }
            let (a, b) = crate::space::q_range(min, max, q);
            if a > b {
                return Err(SpecError::new(
                    obj.field("q"),
                    format!("no multiple of q = {q} lies between min and max ({min} and {max})"),
                ));
            }
            if dist == "q_uniform" {
                Ok(Param::QUniform { min, max, q })
            } else {
                log_positive(&obj, min)?;
                Ok(Param::QLogUniform { min, max, q })
            }
        }
        other => Err(SpecError::new(
            obj.field("distribution"),
            format!("unknown distribution `{other}`; expected one of: {DISTRIBUTIONS}"),
        )),
    }
}

fn float_bounds(obj: &Obj) -> Res<(f64, f64)> {
    let min = number(obj.require("min")?, &obj.field("min"))?;
    let max = number(obj.require("max")?, &obj.field("max"))?;
    if min >= max {
        return Err(SpecError::new(
            obj.field("min"),
            format!("min must be below max (got {min} and {max})"),
        ));
    }
    Ok((min, max))
}

fn log_positive(obj: &Obj, min: f64) -> Res<()> {
    if min <= 0.0 {
        return Err(SpecError::new(
            obj.field("min"),
            format!(
                "a log-scale range needs min above 0 (got {min}); min and max are the values \
                 themselves, not their logarithms"
            ),
        ));
    }
    Ok(())
}

/// Parameter values reach the trainer's config: numbers, text and true/false only.
fn check_scalar(v: &Value, field: &str) -> Res<()> {
    match v {
        Value::Number(_) | Value::String(_) | Value::Bool(_) => Ok(()),
        other => Err(SpecError::new(
            field,
            format!(
                "must be a number, text or true/false (got {})",
                describe(other)
            ),
        )),
    }
}

fn parse_values(v: &Value, field: &str) -> Res<Vec<Value>> {
    let Value::Array(items) = v else {
        return Err(SpecError::new(
            field,
            format!("must be a list (got {})", describe(v)),
        ));
    };
    if items.is_empty() {
        return Err(SpecError::new(field, "must list at least one value"));
    }
    if items.len() > MAX_VALUES {
        return Err(SpecError::new(
            field,
            format!(
                "has {} values, more than the limit of {MAX_VALUES}",
                items.len()
            ),
        ));
    }
    for (i, item) in items.iter().enumerate() {
        let f = format!("{field}[{i}]");
        check_scalar(item, &f)?;
        if items[..i]
            .iter()
            .any(|earlier| crate::space::value_eq(earlier, item))
        {
            return Err(SpecError::new(
                f,
                format!("{} is listed twice", describe(item)),
            ));
        }
    }
    Ok(items.clone())
}

pub(crate) fn parse_early_terminate(v: &Value) -> Res<EarlyTerminate> {
    let obj = Obj::new(v, "early_terminate")?;
    let kind = text(obj.require("type")?, "early_terminate.type")?;
    let min_steps = |obj: &Obj| -> Res<u64> {
        match obj.aliased("min_steps", "min_iter")? {
            Some((v, f)) => Ok(bounded(v, &f, 1, i64::MAX)? as u64),
            None => Err(SpecError::new(obj.field("min_steps"), "is required")),
        }
    };
    let rf = |obj: &Obj| -> Res<u64> {
        match obj.aliased("reduction_factor", "eta")? {
            Some((v, f)) => Ok(bounded(v, &f, 2, 1_000_000)? as u64),
            None => Ok(3),
        }
    };
    match kind.as_str() {
        "none" => {
            obj.check_keys(&["type"], |_| None)?;
            Ok(EarlyTerminate::None)
        }
        "asha" => {
            obj.check_keys(&["type", "min_steps", "min_iter", "reduction_factor", "eta"], |_| None)?;
            Ok(EarlyTerminate::Asha { min_steps: min_steps(&obj)?, reduction_factor: rf(&obj)? })
        }
        "median" => {
            obj.check_keys(&["type", "min_steps", "min_iter", "startup_trials"], |_| None)?;
            let startup_trials = match obj.get("startup_trials") {
                Some(v) => bounded(v, &obj.field("startup_trials"), 0, 1_000_000)? as u32,
                None => 5,
            };
            Ok(EarlyTerminate::Median { min_steps: min_steps(&obj)?, startup_trials })
        }
        "hyperband" => {
            obj.check_keys(
                &["type", "min_steps", "min_iter", "max_steps", "max_iter", "reduction_factor", "eta"],
                |_| None,
            )?;
            let min_steps = min_steps(&obj)?;
            let max_steps = match obj.aliased("max_steps", "max_iter")? {
                Some((v, f)) => {
                    let m = bounded(v, &f, 1, i64::MAX)? as u64;
                    if m <= min_steps {
                        return Err(SpecError::new(
                            f,
                            format!("max_steps must be above min_steps (got {m} and {min_steps})"),
                        ));
                    }
                    m
                }
                None => return Err(SpecError::new(obj.field("max_steps"), "is required for hyperband")),
            };
            Ok(EarlyTerminate::Hyperband { min_steps, max_steps, reduction_factor: rf(&obj)? })
        }
        other => Err(SpecError::new(
            "early_terminate.type",
            format!("unknown early-termination rule `{other}`; expected asha, median, hyperband or none"),
        )),
    }
}
