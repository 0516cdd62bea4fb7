//! The sweep spec: what a user writes (YAML or JSON, close to W&B's sweep file) and what the
//! server stores. Parsing lives in `parse.rs`; this file holds the types and the questions the
//! server asks of a parsed spec.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::space;

/// A validated sweep. The serde form (what `serde_json::to_value` writes) is itself a valid spec
/// that `from_json_value` reads back unchanged, so the server may store either.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SweepSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
    pub base: Base,
    pub metric: Metric,
    pub method: Method,
    pub parameters: BTreeMap<String, Param>,
    #[serde(default)]
    pub early_terminate: EarlyTerminate,
    pub max_trials: u32,
    #[serde(default = "one")]
    pub parallel: u32,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub seed: u64,
}

fn one() -> u32 {
    1
}

/// What each trial starts from; exactly one of `profile`, `config` and `command` is set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Base {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// YAML text (a string) or a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Command>,
    /// Dotted config keys set on every trial (not allowed with `command`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
}

/// A command line: one shell string or an argument vector.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum Command {
    Shell(String),
    Argv(Vec<String>),
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Metric {
    pub name: String,
    pub goal: Goal,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Goal {
    Minimize,
    Maximize,
}

/// Budgets up to which `auto` picks the Gaussian process (its fit grows with the cube of the
/// trials, and TPE catches up with it as trials accumulate).
pub const AUTO_BAYES_MAX_TRIALS: u32 = 200;
/// Searched parameters up to which `auto` picks the Gaussian process.
pub const AUTO_BAYES_MAX_PARAMS: usize = 20;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Grid,
    Random,
    /// The multivariate Tree-structured Parzen Estimator.
    Tpe,
    /// Gaussian-process Bayesian optimization (Matérn-5/2, log expected improvement).
    Bayes,
    /// `bayes` or `tpe`, chosen per suggestion from the budget and the space (`Method::resolve`).
    Auto,
}

impl Method {
    /// `auto`'s choice: `bayes` for budgets of at most `AUTO_BAYES_MAX_TRIALS` trials over at
    /// most `AUTO_BAYES_MAX_PARAMS` searched parameters of which at most half are categorical
    /// (a GP's strength: few trials, mostly ordered parameters); `tpe` otherwise (many trials,
    /// many parameters, or mostly unordered choices). Other methods are themselves.
    pub fn resolve(self, spec: &SweepSpec) -> Method {
        if self != Method::Auto {
            return self;
        }
        let searched: Vec<&Param> = spec
            .parameters
            .values()
            .filter(|p| crate::dims::kind(p).is_some())
            .collect();
        let categorical = searched
            .iter()
            .filter(|p| matches!(p, Param::Categorical { .. }))
            .count();
        if spec.max_trials <= AUTO_BAYES_MAX_TRIALS
            && searched.len() <= AUTO_BAYES_MAX_PARAMS
            && 2 * categorical <= searched.len()
        {
            Method::Bayes
        } else {
            Method::Tpe
        }
    }
}

/// One parameter's distribution. Bounds are inclusive and are the values themselves (also for
/// the log distributions).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "distribution", rename_all = "snake_case")]
pub enum Param {
    Constant {
        value: Value,
    },
    Categorical {
        values: Vec<Value>,
    },
    Uniform {
        min: f64,
        max: f64,
    },
    LogUniform {
        min: f64,
        max: f64,
    },
    IntUniform {
        min: i64,
        max: i64,
    },
    IntLogUniform {
        min: i64,
        max: i64,
    },
    /// Multiples of `q` inside `[min, max]`.
    QUniform {
        min: f64,
        max: f64,
        q: f64,
    },
    /// Multiples of `q` inside `[min, max]`, drawn on a log scale.
    QLogUniform {
        min: f64,
        max: f64,
        q: f64,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EarlyTerminate {
    #[default]
    None,
    Asha {
        min_steps: u64,
        reduction_factor: u64,
    },
    Median {
        min_steps: u64,
        startup_trials: u32,
    },
    Hyperband {
        min_steps: u64,
        max_steps: u64,
        reduction_factor: u64,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Resources {
    #[serde(default)]
    pub gpus: usize,
}

/// A spec mistake: `field` is the path of the offending key (`parameters.model.dropout.min`),
/// `reason` says what is wrong in plain words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct SpecError {
    pub field: String,
    pub reason: String,
}

impl SpecError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> SpecError {
        SpecError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl SweepSpec {
    /// Parses and validates a YAML spec (JSON is YAML too).
    pub fn from_yaml_str(text: &str) -> Result<SweepSpec, SpecError> {
        let value: Value = serde_yaml_ng::from_str(text)
            .map_err(|e| SpecError::new("spec", format!("not valid YAML or JSON: {e}")))?;
        SweepSpec::from_json_value(&value)
    }

    /// Parses and validates a spec already read as JSON.
    pub fn from_json_value(v: &Value) -> Result<SweepSpec, SpecError> {
        crate::parse::parse_spec(v)
    }

    /// For each parameter, the values that matter for checking the space against the trainer's
    /// config validation: both ends of a range (as the space produces them), every categorical
    /// value, the constant.
    pub fn probe_values(&self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for (key, param) in &self.parameters {
            for v in space::probe(param) {
                out.push((key.clone(), v));
            }
        }
        out
    }

    /// The number of grid points (the product of each parameter's count), or None when some
    /// parameter is continuous or the product overflows.
    pub fn grid_size(&self) -> Option<u64> {
        let mut size: u64 = 1;
        for param in self.parameters.values() {
            size = size.checked_mul(space::grid_count(param)?)?;
        }
        Some(size)
    }

    /// The method `auto` stands for with this spec (any other method is itself).
    pub fn resolved_method(&self) -> Method {
        self.method.resolve(self)
    }

    /// Whether a larger metric value is better.
    pub fn maximize(&self) -> bool {
        self.metric.goal == Goal::Maximize
    }
}
