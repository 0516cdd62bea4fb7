//! fANOVA importance on functions whose answer is known.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use serde_json::json;
use sweep::{importance, suggest, Trial, TrialState};

fn noisy_linear_trials(seed: u64) -> (sweep::SweepSpec, Vec<Trial>) {
    let spec = spec_with(
        json!({
            "x1": {"distribution": "uniform", "min": 0, "max": 1},
            "x2": {"distribution": "uniform", "min": 0, "max": 1},
            "k": {"value": 3}
        }),
        json!({"seed": seed}),
    );
    let mut noise = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let trials = (0..100)
        .map(|n| {
            let p = suggest(&spec, &[], n).unwrap();
            let y = 10.0 * f(&p, "x1") + 0.1 * f(&p, "x2") + 0.1 * (noise.random::<f64>() - 0.5);
            complete(n, p, y)
        })
        .collect();
    (spec, trials)
}

#[test]
fn the_parameter_that_drives_the_objective_is_by_far_the_most_important() {
    let (spec, trials) = noisy_linear_trials(5);
    let imp = importance(&spec, &trials);
    eprintln!("{imp:?}");
    assert!(imp["x1"] > 0.8, "{imp:?}");
    assert!(imp["x2"] < 0.05, "{imp:?}");
    assert!(imp["x1"] > 20.0 * imp["x2"], "{imp:?}");
    assert_eq!(imp["k"], 0.0);
    let sum: f64 = imp.values().sum();
    assert!(sum <= 1.0 + 1e-9, "{imp:?}");
}

#[test]
fn importance_is_deterministic_for_a_seed() {
    let (spec, trials) = noisy_linear_trials(9);
    assert_eq!(importance(&spec, &trials), importance(&spec, &trials));
}

#[test]
fn importance_needs_two_complete_trials_with_values() {
    let (spec, trials) = noisy_linear_trials(1);
    assert!(importance(&spec, &trials[..1]).is_empty());
    let mut few = trials[..3].to_vec();
    few[1].state = TrialState::Running;
    few[2].value = Some(f64::NAN);
    assert!(importance(&spec, &few).is_empty());
    assert!(!importance(&spec, &trials[..2]).is_empty());
}

#[test]
fn a_categorical_parameter_that_matters_outranks_a_continuous_one_that_does_not() {
    let spec = spec_with(
        json!({
            "opt": {"values": ["adam", "sgd", "lion", "adafactor"]},
            "lr": {"distribution": "log_uniform", "min": 1e-4, "max": 1e-1},
            "layers": {"distribution": "int_uniform", "min": 1, "max": 8}
        }),
        json!({"seed": 2}),
    );
    let trials: Vec<Trial> = (0..120)
        .map(|n| {
            let p = suggest(&spec, &[], n).unwrap();
            let by_opt = match p["opt"].as_str().unwrap() {
                "adam" => 0.0,
                "sgd" => 3.0,
                "lion" => 1.0,
                _ => 2.0,
            };
            let y = by_opt + 0.3 * p["layers"].as_f64().unwrap() + 0.01 * f(&p, "lr");
            complete(n, p, y)
        })
        .collect();
    let imp = importance(&spec, &trials);
    eprintln!("{imp:?}");
    assert!(
        imp["opt"] > imp["layers"] && imp["layers"] > 5.0 * imp["lr"],
        "{imp:?}"
    );
}
