//! TPE against random search on analytic functions, and the constant liar.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::json;
use sweep::{suggest, testfns, Trial};

const SEEDS: u64 = 8;
const BUDGET: u32 = 60;

fn mean_best(space: serde_json::Value, method: &str, objective: fn(&sweep::Params) -> f64) -> f64 {
    let total: f64 = (0..SEEDS)
        .map(|seed| {
            let spec = spec_with(space.clone(), json!({"method": method, "seed": seed}));
            run_sequential(&spec, BUDGET, objective)
        })
        .sum();
    total / SEEDS as f64
}

#[test]
fn tpe_finds_a_better_branin_value_than_random_search_on_average() {
    let tpe = mean_best(branin_space(), "tpe", branin_of);
    let random = mean_best(branin_space(), "random", branin_of);
    eprintln!(
        "branin: tpe {tpe:.4} random {random:.4} (min {})",
        testfns::BRANIN_MIN
    );
    assert!(
        tpe - testfns::BRANIN_MIN < 0.5 * (random - testfns::BRANIN_MIN),
        "tpe {tpe} random {random}"
    );
}

#[test]
fn tpe_finds_a_better_hartmann6_value_than_random_search_on_average() {
    let tpe = mean_best(hartmann_space(), "tpe", hartmann_of);
    let random = mean_best(hartmann_space(), "random", hartmann_of);
    eprintln!(
        "hartmann6: tpe {tpe:.4} random {random:.4} (min {})",
        testfns::HARTMANN6_MIN
    );
    assert!(tpe < random - 0.4, "tpe {tpe} random {random}");
}

/// Spread of a set of 1-d points: their mean absolute distance from each other.
fn spread(xs: &[f64]) -> f64 {
    let mut total = 0.0;
    for (i, a) in xs.iter().enumerate() {
        for b in &xs[i + 1..] {
            total += (a - b).abs();
        }
    }
    total / (xs.len() * (xs.len() - 1) / 2) as f64
}

#[test]
fn running_trials_push_parallel_suggestions_apart_through_the_constant_liar() {
    let space = json!({"x": {"distribution": "uniform", "min": 0.0, "max": 1.0}});
    let (mut with_liar, mut without) = (0.0, 0.0);
    for seed in 0..6 {
        let spec = spec_with(space.clone(), json!({"method": "tpe", "seed": seed}));
        let mut done: Vec<Trial> = Vec::new();
        for n in 0..30 {
            let p = suggest(&spec, &done, n).unwrap();
            let v = (f(&p, "x") - 0.3).powi(2);
            done.push(complete(n, p, v));
        }
        // Eight trials started at once: each suggestion sees the earlier ones running.
        let mut history = done.clone();
        let mut parallel = Vec::new();
        for n in 30..38 {
            let p = suggest(&spec, &history, n).unwrap();
            parallel.push(f(&p, "x"));
            history.push(Trial::new(n, p));
        }
        let distinct = parallel
            .iter()
            .enumerate()
            .all(|(i, a)| parallel[i + 1..].iter().all(|b| a != b));
        assert!(distinct, "parallel suggestions repeat: {parallel:?}");
        // The same numbers asked without the running trials in view.
        let blind: Vec<f64> = (30..38)
            .map(|n| f(&suggest(&spec, &done, n).unwrap(), "x"))
            .collect();
        with_liar += spread(&parallel);
        without += spread(&blind);
    }
    eprintln!("spread with liar {with_liar:.4}, without {without:.4}");
    assert!(
        with_liar > 1.5 * without,
        "with liar {with_liar}, without {without}"
    );
}

#[test]
fn tpe_suggestions_are_deterministic_for_the_same_history() {
    let spec = spec_with(branin_space(), json!({"method": "tpe", "seed": 3}));
    let mut trials = Vec::new();
    for n in 0..20 {
        let p = suggest(&spec, &trials, n).unwrap();
        let v = branin_of(&p);
        trials.push(complete(n, p, v));
    }
    assert_eq!(suggest(&spec, &trials, 20), suggest(&spec, &trials, 20));
    // Trials numbered at or after the one asked about are not looked at.
    let mut later = trials.clone();
    later.push(complete(25, trials[0].params.clone(), -100.0));
    assert_eq!(suggest(&spec, &later, 20), suggest(&spec, &trials, 20));
}

#[test]
fn maximizing_finds_the_maximum_of_a_negated_function() {
    let spec = spec_with(
        branin_space(),
        json!({"method": "tpe", "seed": 1, "metric": {"name": "reward", "goal": "maximize"}}),
    );
    let mut trials = Vec::new();
    for n in 0..60 {
        let p = suggest(&spec, &trials, n).unwrap();
        let v = -branin_of(&p);
        trials.push(complete(n, p, v));
    }
    let best_late = trials[40..]
        .iter()
        .filter_map(|t| t.value)
        .fold(f64::NEG_INFINITY, f64::max);
    let mean_early = trials[..10].iter().filter_map(|t| t.value).sum::<f64>() / 10.0;
    assert!(
        best_late > mean_early + 10.0,
        "late best {best_late}, early mean {mean_early}"
    );
}
