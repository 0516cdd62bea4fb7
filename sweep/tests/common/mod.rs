//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use sweep::{suggest, Params, SweepSpec, Trial, TrialState};

/// A spec from a `parameters` mapping and a few top-level settings merged in.
pub fn spec_with(parameters: Value, extra: Value) -> SweepSpec {
    let mut v = json!({
        "name": "test",
        "base": {"profile": "tiny"},
        "metric": {"name": "loss"},
        "method": "random",
        "parameters": parameters,
        "max_trials": 10000
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    SweepSpec::from_json_value(&v).unwrap()
}

pub fn f(params: &Params, key: &str) -> f64 {
    params[key].as_f64().unwrap()
}

pub fn complete(number: u32, params: Params, value: f64) -> Trial {
    Trial {
        state: TrialState::Complete,
        value: Some(value),
        ..Trial::new(number, params)
    }
}

/// Runs `n` trials one after another on `objective` and returns the best value found.
pub fn run_sequential(spec: &SweepSpec, n: u32, objective: impl Fn(&Params) -> f64) -> f64 {
    let mut trials: Vec<Trial> = Vec::new();
    for number in 0..n {
        let params = suggest(spec, &trials, number).unwrap();
        let value = objective(&params);
        trials.push(complete(number, params, value));
    }
    trials
        .iter()
        .filter_map(|t| t.value)
        .fold(f64::INFINITY, f64::min)
}

pub fn branin_space() -> Value {
    json!({
        "x1": {"distribution": "uniform", "min": -5.0, "max": 10.0},
        "x2": {"distribution": "uniform", "min": 0.0, "max": 15.0}
    })
}

pub fn hartmann_space() -> Value {
    let mut m = serde_json::Map::new();
    for i in 0..6 {
        m.insert(
            format!("x{i}"),
            json!({"distribution": "uniform", "min": 0.0, "max": 1.0}),
        );
    }
    Value::Object(m)
}

pub fn branin_of(p: &Params) -> f64 {
    sweep::testfns::branin(f(p, "x1"), f(p, "x2"))
}

pub fn hartmann_of(p: &Params) -> f64 {
    let x: [f64; 6] = std::array::from_fn(|i| f(p, &format!("x{i}")));
    sweep::testfns::hartmann6(&x)
}
