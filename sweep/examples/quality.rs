//! Measures the search library directly on analytic functions: random search, TPE and the GP, with
//! and without ASHA pruning, on Branin and Hartmann-6. Each trial "trains" for 100 steps,
//! reporting every 10 a value that approaches f(x) like 1/sqrt(step), so pruning has a real
//! curve to judge and its saving in steps shows.
//!
//! cargo run --release -p trainyard-sweep --example quality

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use sweep::{judge, suggest, testfns, Params, SweepSpec, Trial, TrialState, Verdict};

const TRIALS: u32 = 50;
const SEEDS: u64 = 10;
const STEPS: u64 = 100;
const EVERY: u64 = 10;

struct Problem {
    name: &'static str,
    space: Value,
    f: fn(&Params) -> f64,
    /// The size of the training-curve term: comparable to the spread of f over its domain's
    /// better half, so early values rank trials imperfectly.
    curve: f64,
    minimum: f64,
}

fn get(p: &Params, key: &str) -> f64 {
    p.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn branin(p: &Params) -> f64 {
    testfns::branin(get(p, "x1"), get(p, "x2"))
}

fn hartmann(p: &Params) -> f64 {
    let x: [f64; 6] = std::array::from_fn(|i| get(p, &format!("x{i}")));
    testfns::hartmann6(&x)
}

fn spec(
    problem: &Problem,
    method: &str,
    prune: bool,
    seed: u64,
) -> Result<SweepSpec, sweep::SpecError> {
    let rule = if prune {
        json!({"type": "asha", "min_steps": 10, "reduction_factor": 3})
    } else {
        json!({"type": "none"})
    };
    SweepSpec::from_json_value(&json!({
        "name": "quality",
        "base": {"profile": "none"},
        "metric": {"name": "loss", "goal": "minimize"},
        "method": method,
        "parameters": problem.space,
        "early_terminate": rule,
        "max_trials": TRIALS,
        "seed": seed
    }))
}

/// One sweep; returns (best final value among complete trials, f(x) of that trial, steps spent).
fn run(problem: &Problem, spec: &SweepSpec, seed: u64) -> (f64, f64, u64) {
    let mut trials: Vec<Trial> = Vec::new();
    let mut steps = 0;
    for number in 0..TRIALS {
        let Some(params) = suggest(spec, &trials, number) else {
            break;
        };
        let fx = (problem.f)(&params);
        // Deterministic per-trial learning speed and noise.
        let mut rng =
            ChaCha8Rng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(number.into()));
        let h: f64 = rng.random();
        trials.push(Trial::new(number, params));
        let index = trials.len() - 1;
        let mut step = EVERY;
        loop {
            let noise = 0.05 * problem.curve * (rng.random::<f64>() - 0.5);
            let value = fx + problem.curve * (1.0 + h) / (step as f64).sqrt() + noise;
            trials[index].intermediate.insert(step, value);
            steps += EVERY;
            if step == STEPS {
                trials[index].state = TrialState::Complete;
                trials[index].value = Some(value);
                break;
            }
            if let Verdict::Prune { .. } = judge(spec, &mut trials, index) {
                trials[index].state = TrialState::Pruned;
                trials[index].value = Some(value);
                break;
            }
            step += EVERY;
        }
    }
    let best = trials
        .iter()
        .filter(|t| t.state == TrialState::Complete)
        .filter_map(|t| Some((t.value?, (problem.f)(&t.params))))
        .fold((f64::INFINITY, f64::INFINITY), |a, b| {
            if b.0 < a.0 {
                b
            } else {
                a
            }
        });
    (best.0, best.1, steps)
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len() as f64 - 1.0).max(1.0);
    (mean, var.sqrt())
}

fn main() -> Result<(), sweep::SpecError> {
    let mut hartmann_space = serde_json::Map::new();
    for i in 0..6 {
        hartmann_space.insert(
            format!("x{i}"),
            json!({"distribution": "uniform", "min": 0.0, "max": 1.0}),
        );
    }
    let problems = [
        Problem {
            name: "Branin",
            space: json!({"x1": {"distribution": "uniform", "min": -5.0, "max": 10.0},
                          "x2": {"distribution": "uniform", "min": 0.0, "max": 15.0}}),
            f: branin,
            curve: 5.0,
            minimum: testfns::BRANIN_MIN,
        },
        Problem {
            name: "Hartmann-6",
            space: Value::Object(hartmann_space),
            f: hartmann,
            curve: 0.5,
            minimum: testfns::HARTMANN6_MIN,
        },
    ];
    println!("{TRIALS} trials per sweep, {SEEDS} seeds; each trial reports every {EVERY} steps up to {STEPS}.");
    println!("Best value: the best final (step {STEPS}) value among the sweep's complete trials;");
    println!("f(x): the function itself at that trial's parameters (the final value less the curve term).\n");
    println!("| function | method | pruning | best value (mean ± std) | f(x) of the best (mean ± std) | mean steps used |");
    println!("|---|---|---|---|---|---|");
    for problem in &problems {
        for method in ["random", "tpe", "bayes"] {
            for prune in [false, true] {
                let mut bests = Vec::new();
                let mut fxs = Vec::new();
                let mut steps = 0u64;
                for seed in 0..SEEDS {
                    let (best, fx, used) = run(problem, &spec(problem, method, prune, seed)?, seed);
                    bests.push(best);
                    fxs.push(fx);
                    steps += used;
                }
                let (mean, std) = mean_std(&bests);
                let (fx_mean, fx_std) = mean_std(&fxs);
                println!(
                    "| {} (min {:.4}) | {method} | {} | {mean:.4} ± {std:.4} | {fx_mean:.4} ± {fx_std:.4} | {:.0} |",
                    problem.name,
                    problem.minimum,
                    if prune { "ASHA (10, rf 3)" } else { "none" },
                    steps as f64 / SEEDS as f64
                );
            }
        }
    }
    Ok(())
}
