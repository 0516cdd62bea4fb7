//! Search quality of the library alone, one trial after another, for bench/sweep_quality.py
//! (which runs Optuna's samplers on the same functions, budgets and seeds beside it), and the
//! time one suggestion takes on a large history.
//!
//! cargo run --release -p trainyard-sweep --example search -- [--trials 50] [--seeds 10]
//!     [--first-seed 0] [--methods random,tpe,bayes] [--functions branin,hartmann6,mixed]
//! prints one JSON line per (function, method, seed): the best value after each trial.
//!
//! cargo run --release -p trainyard-sweep --example search -- --timing
//! prints the time of one suggestion after 200 (`--finished N`: N) finished trials over 10
//! parameters.

use std::time::Instant;

use serde_json::{json, Value};
use sweep::{suggest, testfns, Params, SweepSpec, Trial, TrialState};

fn get(p: &Params, key: &str) -> f64 {
    p.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn space(function: &str) -> Option<Value> {
    let unit = json!({"distribution": "uniform", "min": 0.0, "max": 1.0});
    Some(match function {
        "branin" => json!({"x1": {"distribution": "uniform", "min": -5.0, "max": 10.0},
                           "x2": {"distribution": "uniform", "min": 0.0, "max": 15.0}}),
        "hartmann6" => Value::Object((0..6).map(|i| (format!("x{i}"), unit.clone())).collect()),
        "mixed" => json!({
            "optimizer": {"values": testfns::MIXED_OPTIMIZERS.iter().map(|o| o.0).collect::<Vec<_>>()},
            "lr": {"distribution": "log_uniform", "min": 1e-5, "max": 1.0},
            "depth": {"distribution": "int_uniform", "min": 1, "max": 8},
            "width": {"distribution": "int_log_uniform", "min": 8, "max": 1024},
            "dropout": {"distribution": "uniform", "min": 0.0, "max": 0.6}
        }),
        _ => return None,
    })
}

fn objective(function: &str, p: &Params) -> f64 {
    match function {
        "branin" => testfns::branin(get(p, "x1"), get(p, "x2")),
        "hartmann6" => testfns::hartmann6(&std::array::from_fn(|i| get(p, &format!("x{i}")))),
        _ => {
            let name = p.get("optimizer").and_then(Value::as_str).unwrap_or("");
            let opt = testfns::MIXED_OPTIMIZERS
                .iter()
                .position(|o| o.0 == name)
                .unwrap_or(0);
            let int = |k: &str| p.get(k).and_then(Value::as_i64).unwrap_or(0);
            testfns::mixed(
                opt,
                get(p, "lr"),
                int("depth"),
                int("width"),
                get(p, "dropout"),
            )
        }
    }
}

fn spec(parameters: Value, method: &str, trials: u32, seed: u64) -> Result<SweepSpec, String> {
    SweepSpec::from_json_value(&json!({
        "name": "search", "base": {"profile": "none"},
        "metric": {"name": "loss", "goal": "minimize"}, "method": method,
        "parameters": parameters, "max_trials": trials, "seed": seed
    }))
    .map_err(|e| e.to_string())
}

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

fn timing() -> Result<(), String> {
    let unit = json!({"distribution": "uniform", "min": 0.0, "max": 1.0});
    let parameters = Value::Object((0..10).map(|i| (format!("x{i}"), unit.clone())).collect());
    for method in ["tpe", "bayes"] {
        let spec = spec(parameters.clone(), method, 10_000, 0)?;
        let random = self::spec(parameters.clone(), "random", 10_000, 0)?;
        let finished: u32 = std::env::args()
            .skip_while(|a| a != "--finished")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(200);
        let trials: Vec<Trial> = (0..finished)
            .map(|n| {
                let params = suggest(&random, &[], n).unwrap_or_default();
                // A 10-d Hartmann-like bowl with noise-free values.
                let x: Vec<f64> = (0..10).map(|i| get(&params, &format!("x{i}"))).collect();
                let value = x
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (v - 0.1 * i as f64).powi(2))
                    .sum();
                Trial {
                    state: TrialState::Complete,
                    value: Some(value),
                    ..Trial::new(n, params)
                }
            })
            .collect();
        let mut times = Vec::new();
        for number in finished..finished + 3 {
            let start = Instant::now();
            let s = suggest(&spec, &trials, number);
            times.push(start.elapsed().as_secs_f64());
            if s.is_none() {
                return Err("no suggestion".into());
            }
        }
        println!(
            "{}",
            json!({"method": method, "finished": finished, "parameters": 10, "seconds": times})
        );
    }
    Ok(())
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--timing") {
        return timing();
    }
    let trials: u32 = arg(&args, "--trials", "50")
        .parse()
        .map_err(|_| "bad --trials")?;
    let seeds: u64 = arg(&args, "--seeds", "10")
        .parse()
        .map_err(|_| "bad --seeds")?;
    let first: u64 = arg(&args, "--first-seed", "0")
        .parse()
        .map_err(|_| "bad --first-seed")?;
    let methods = arg(&args, "--methods", "random,tpe,bayes");
    let functions = arg(&args, "--functions", "branin,hartmann6,mixed");
    for function in functions.split(',') {
        let parameters = space(function).ok_or(format!("unknown function {function}"))?;
        for method in methods.split(',') {
            for seed in first..first + seeds {
                let spec = spec(parameters.clone(), method, trials, seed)?;
                let mut history: Vec<Trial> = Vec::new();
                let mut best = f64::INFINITY;
                let mut bests = Vec::new();
                let start = Instant::now();
                for number in 0..trials {
                    let params = suggest(&spec, &history, number).ok_or("no suggestion")?;
                    let value = objective(function, &params);
                    best = best.min(value);
                    bests.push(best);
                    history.push(Trial {
                        state: TrialState::Complete,
                        value: Some(value),
                        ..Trial::new(number, params)
                    });
                }
                println!(
                    "{}",
                    json!({"function": function, "method": method, "seed": seed,
                           "best": bests, "seconds": start.elapsed().as_secs_f64()})
                );
            }
        }
    }
    Ok(())
}
