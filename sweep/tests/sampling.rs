//! Random search's distributions, determinism, grid enumeration, and a space changed mid-sweep.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::{json, Value};
use sweep::{suggest, Trial, TrialState};

fn draws(parameters: Value, n: u32) -> Vec<Value> {
    let spec = spec_with(parameters, json!({}));
    (0..n)
        .map(|i| suggest(&spec, &[], i).unwrap()["p"].clone())
        .collect()
}

fn numbers(vs: &[Value]) -> Vec<f64> {
    vs.iter().map(|v| v.as_f64().unwrap()).collect()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[test]
fn uniform_samples_stay_in_range_and_spread_over_it() {
    let xs = numbers(&draws(
        json!({"p": {"distribution": "uniform", "min": -2.0, "max": 3.0}}),
        2000,
    ));
    assert!(xs.iter().all(|x| (-2.0..=3.0).contains(x)));
    assert!((median(xs.clone()) - 0.5).abs() < 0.25);
    assert!(xs.iter().any(|&x| x < -1.8) && xs.iter().any(|&x| x > 2.8));
}

#[test]
fn log_uniform_samples_have_their_median_near_the_geometric_mean() {
    let xs = numbers(&draws(
        json!({"p": {"distribution": "log_uniform", "min": 1e-5, "max": 1e-1}}),
        2000,
    ));
    assert!(xs.iter().all(|x| (1e-5..=1e-1).contains(x)));
    // The arithmetic midpoint would be 0.05; the geometric mean is 1e-3.
    let m = median(xs);
    assert!((m.log10() + 3.0).abs() < 0.15, "median {m}");
}

#[test]
fn int_uniform_samples_are_integers_covering_both_ends() {
    let vs = draws(
        json!({"p": {"distribution": "int_uniform", "min": 1, "max": 4}}),
        400,
    );
    assert!(vs.iter().all(|v| v.is_i64()));
    let seen: BTreeSet<i64> = vs.iter().map(|v| v.as_i64().unwrap()).collect();
    assert_eq!(seen, BTreeSet::from([1, 2, 3, 4]));
}

#[test]
fn int_log_uniform_samples_are_integers_in_range_favouring_small_ones() {
    let vs = draws(
        json!({"p": {"distribution": "int_log_uniform", "min": 1, "max": 1000}}),
        2000,
    );
    let xs: Vec<i64> = vs.iter().map(|v| v.as_i64().unwrap()).collect();
    assert!(xs.iter().all(|x| (1..=1000).contains(x)));
    let m = median(xs.iter().map(|&x| x as f64).collect());
    assert!(
        (15.0..=65.0).contains(&m),
        "median {m} (geometric mean about 32)"
    );
}

#[test]
fn q_uniform_samples_are_multiples_of_q_inside_the_range() {
    let vs = draws(
        json!({"p": {"distribution": "q_uniform", "min": 0.05, "max": 1.0, "q": 0.1}}),
        1000,
    );
    let xs = numbers(&vs);
    assert!(xs.iter().all(|x| (0.05..=1.0).contains(x)));
    assert!(
        xs.iter()
            .all(|x| ((x / 0.1) - (x / 0.1).round()).abs() < 1e-9),
        "{xs:?}"
    );
    let seen: BTreeSet<String> = xs.iter().map(|x| format!("{x}")).collect();
    // Cleaned decimals: 0.3, not 0.30000000000000004.
    assert!(
        seen.contains("0.3") && seen.contains("0.1") && seen.contains("1"),
        "{seen:?}"
    );
    assert_eq!(seen.len(), 10);
}

#[test]
fn q_uniform_over_integers_gives_integers() {
    let vs = draws(
        json!({"p": {"distribution": "q_uniform", "min": 16, "max": 128, "q": 16}}),
        300,
    );
    assert!(vs
        .iter()
        .all(|v| v.is_i64() && v.as_i64().unwrap() % 16 == 0));
}

#[test]
fn q_log_uniform_samples_are_multiples_of_q_on_a_log_scale() {
    let vs = draws(
        json!({"p": {"distribution": "q_log_uniform", "min": 1, "max": 10000, "q": 1}}),
        2000,
    );
    let xs: Vec<i64> = vs.iter().map(|v| v.as_i64().unwrap()).collect();
    assert!(xs.iter().all(|x| (1..=10000).contains(x)));
    let m = median(xs.iter().map(|&x| x as f64).collect());
    assert!(
        (50.0..=200.0).contains(&m),
        "median {m} (geometric mean 100)"
    );
}

#[test]
fn categorical_samples_cover_every_value_and_constants_stay_constant() {
    let spec = spec_with(
        json!({"c": {"values": ["adam", 3, true]}, "k": {"value": "fixed"}}),
        json!({}),
    );
    let mut seen = BTreeSet::new();
    for i in 0..200 {
        let p = suggest(&spec, &[], i).unwrap();
        assert_eq!(p["k"], json!("fixed"));
        seen.insert(p["c"].to_string());
    }
    assert_eq!(
        seen,
        BTreeSet::from(["\"adam\"".to_string(), "3".to_string(), "true".to_string()])
    );
}

#[test]
fn the_same_seed_and_number_give_the_same_params_and_other_numbers_or_seeds_do_not() {
    let space = json!({"a": {"distribution": "uniform", "min": 0, "max": 1}, "b": {"distribution": "log_uniform", "min": 1e-4, "max": 1}});
    let spec = spec_with(space.clone(), json!({"seed": 11}));
    let other_seed = spec_with(space, json!({"seed": 12}));
    assert_eq!(suggest(&spec, &[], 4), suggest(&spec, &[], 4));
    assert_ne!(suggest(&spec, &[], 4), suggest(&spec, &[], 5));
    assert_ne!(suggest(&spec, &[], 4), suggest(&other_seed, &[], 4));
}

#[test]
fn no_suggestion_is_made_past_max_trials() {
    let spec = spec_with(
        json!({"a": {"distribution": "uniform", "min": 0, "max": 1}}),
        json!({"max_trials": 3}),
    );
    assert!(suggest(&spec, &[], 2).is_some());
    assert!(suggest(&spec, &[], 3).is_none());
}

fn grid_spec(max_trials: Option<u32>) -> sweep::SweepSpec {
    let mut extra = json!({"method": "grid", "max_trials": null});
    if let Some(m) = max_trials {
        extra["max_trials"] = json!(m);
    }
    spec_with(
        json!({
            "a": {"values": ["x", "y"]},
            "b": {"distribution": "int_uniform", "min": 1, "max": 3},
            "c": {"distribution": "q_uniform", "min": 0.0, "max": 0.2, "q": 0.1},
            "d": {"value": 7}
        }),
        extra,
    )
}

#[test]
fn grid_enumerates_exactly_the_product_without_repeats_then_stops() {
    let mut spec = grid_spec(None);
    spec.max_trials = 100; // ask past the end: the grid itself must say it is done
    let mut trials: Vec<Trial> = Vec::new();
    let mut seen = BTreeSet::new();
    for n in 0..18 {
        let p = suggest(&spec, &trials, n).expect("the grid has 18 points");
        assert_eq!(p["d"], json!(7));
        assert!(
            seen.insert(serde_json::to_string(&p).unwrap()),
            "repeated {p:?}"
        );
        trials.push(Trial {
            state: TrialState::Failed,
            ..Trial::new(n, p)
        });
    }
    let mut expected = BTreeSet::new();
    for a in ["x", "y"] {
        for b in 1..=3 {
            for c in [json!(0.0), json!(0.1), json!(0.2)] {
                let p: sweep::Params = [
                    ("a", json!(a)),
                    ("b", json!(b)),
                    ("c", c.clone()),
                    ("d", json!(7)),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
                expected.insert(serde_json::to_string(&p).unwrap());
            }
        }
    }
    assert_eq!(seen, expected);
    assert_eq!(suggest(&spec, &trials, 18), None);
}

#[test]
fn grid_fills_the_first_gap_and_its_size_defaults_max_trials() {
    let spec = grid_spec(None);
    assert_eq!(spec.max_trials, 18);
    let first = suggest(&spec, &[], 0).unwrap();
    let second = suggest(&spec, &[Trial::new(0, first.clone())], 1).unwrap();
    // Only the second point is taken: the first is suggested again (the last key turns fastest).
    let taken = Trial::new(0, second.clone());
    assert_eq!(suggest(&spec, &[taken], 1).unwrap(), first);
    assert_eq!(first["c"], json!(0.0));
    assert_eq!(second["c"], json!(0.1));
    assert_eq!(grid_spec(Some(5)).max_trials, 5);
}

#[test]
fn a_range_changed_mid_sweep_still_yields_values_inside_the_new_range() {
    let wide = spec_with(
        json!({"lr": {"distribution": "log_uniform", "min": 1e-5, "max": 1.0}, "opt": {"values": ["adam", "sgd", "lion"]}, "n": {"distribution": "int_uniform", "min": 1, "max": 100}}),
        json!({"method": "tpe"}),
    );
    let mut trials = Vec::new();
    for n in 0..40 {
        let p = suggest(&wide, &trials, n).unwrap();
        let v = (f(&p, "lr").log10() + 1.0).abs() + f(&p, "n") / 100.0;
        trials.push(complete(n, p, v));
    }
    // Some history the current space cannot produce at all.
    let mut odd = Trial::new(
        40,
        [
            ("lr".to_string(), json!("fast")),
            ("n".to_string(), json!(2.5)),
        ]
        .into_iter()
        .collect(),
    );
    odd.state = TrialState::Complete;
    odd.value = Some(f64::NAN);
    trials.push(odd);
    let narrow = spec_with(
        json!({"lr": {"distribution": "log_uniform", "min": 1e-3, "max": 1e-2}, "opt": {"values": ["sgd", "adafactor"]}, "n": {"distribution": "int_uniform", "min": 50, "max": 60}, "new": {"distribution": "uniform", "min": 0, "max": 1}}),
        json!({"method": "tpe"}),
    );
    for n in 41..60 {
        let p = suggest(&narrow, &trials, n).unwrap();
        assert!((1e-3..=1e-2).contains(&f(&p, "lr")), "{p:?}");
        assert!(["sgd", "adafactor"].contains(&p["opt"].as_str().unwrap()));
        assert!((50..=60).contains(&p["n"].as_i64().unwrap()));
        assert!((0.0..=1.0).contains(&f(&p, "new")));
        trials.push(complete(n, p, 1.0));
    }
}
