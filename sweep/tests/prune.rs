//! ASHA, median and Hyperband decisions on hand-computed trial tables.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::json;
use sweep::{assign_bracket, judge, next_rung, SweepSpec, Trial, TrialState, Verdict};

fn spec(rule: serde_json::Value, goal: &str) -> SweepSpec {
    spec_with(
        json!({"x": {"distribution": "uniform", "min": 0, "max": 1}}),
        json!({"early_terminate": rule, "metric": {"name": "loss", "goal": goal}}),
    )
}

fn asha() -> SweepSpec {
    spec(
        json!({"type": "asha", "min_steps": 10, "reduction_factor": 3}),
        "minimize",
    )
}

fn running(number: u32, reports: &[(u64, f64)]) -> Trial {
    let mut t = Trial::new(number, Default::default());
    t.intermediate = reports.iter().copied().collect();
    t
}

fn pruned(v: &Verdict) -> bool {
    matches!(v, Verdict::Prune { .. })
}

/// Adds a trial with these reports and judges it.
fn arrive(spec: &SweepSpec, trials: &mut Vec<Trial>, reports: &[(u64, f64)]) -> Verdict {
    trials.push(running(trials.len() as u32, reports));
    let i = trials.len() - 1;
    judge(spec, trials, i)
}

#[test]
fn asha_keeps_only_the_top_third_at_the_first_rung_as_trials_arrive() {
    let spec = asha();
    let mut trials = Vec::new();
    // n = 1: the first trial at a rung always continues (nothing to compare with).
    assert_eq!(arrive(&spec, &mut trials, &[(10, 5.0)]), Verdict::Continue);
    // n = 2: keep max(1, 2/3) = 1; 4.0 beats 5.0.
    assert_eq!(arrive(&spec, &mut trials, &[(10, 4.0)]), Verdict::Continue);
    // n = 3: keep 1; 6.0 is third.
    let v = arrive(&spec, &mut trials, &[(10, 6.0)]);
    let Verdict::Prune { reason } = &v else {
        panic!("expected a prune, got {v:?}")
    };
    assert!(
        reason.contains("step 10") && reason.contains("ranks 3 of 3") && reason.contains("best 1"),
        "{reason}"
    );
    // n = 4: keep 1; 3.0 is the new best.
    assert_eq!(arrive(&spec, &mut trials, &[(10, 3.0)]), Verdict::Continue);
    // n = 5: keep 1; 4.5 is behind 3.0 and 4.0.
    assert!(pruned(&arrive(&spec, &mut trials, &[(10, 4.5)])));
    // n = 6: keep 2; 3.5 is behind only 3.0.
    assert_eq!(arrive(&spec, &mut trials, &[(10, 3.5)]), Verdict::Continue);
    // Every judged trial recorded its value at rung 0.
    let recorded: Vec<f64> = trials.iter().map(|t| t.rungs[&0]).collect();
    assert_eq!(recorded, vec![5.0, 4.0, 6.0, 3.0, 4.5, 3.5]);
}

#[test]
fn a_trial_that_passed_a_rung_is_never_judged_there_again() {
    let spec = asha();
    let mut trials = vec![running(0, &[(10, 5.0)])];
    assert_eq!(judge(&spec, &mut trials, 0), Verdict::Continue);
    for (n, v) in [(1, 1.0), (2, 1.5), (3, 2.0)] {
        trials.push(running(n, &[(10, v)]));
        trials[n as usize].rungs.insert(0, v);
    }
    // Trial 0 is now last of four at rung 0, but it passed that rung when it got there.
    trials[0].intermediate.insert(20, 5.5);
    assert_eq!(judge(&spec, &mut trials, 0), Verdict::Continue);
    assert_eq!(trials[0].rungs.len(), 1);
    assert_eq!(next_rung(&spec, &trials[0]), Some(30));
    // At rung 1 (step 30) it is the first to arrive, so it continues again.
    trials[0].intermediate.insert(30, 5.2);
    assert_eq!(judge(&spec, &mut trials, 0), Verdict::Continue);
    assert_eq!(trials[0].rungs[&1], 5.2);
    assert_eq!(next_rung(&spec, &trials[0]), Some(90));
}

#[test]
fn the_rung_value_is_the_last_report_at_or_before_the_rung_else_the_first_after() {
    let spec = asha();
    let mut trials = vec![running(0, &[(9, 2.0), (12, 1.0)]), running(1, &[(15, 7.0)])];
    judge(&spec, &mut trials, 0);
    judge(&spec, &mut trials, 1);
    assert_eq!(trials[0].rungs[&0], 2.0);
    assert_eq!(trials[1].rungs[&0], 7.0);
}

#[test]
fn a_report_that_jumps_past_several_rungs_is_judged_at_each_lowest_first() {
    let spec = asha();
    let mut trials = vec![
        running(0, &[(10, 1.0), (30, 1.0)]),
        running(1, &[(10, 2.0)]),
        running(2, &[(10, 3.0)]),
    ];
    for t in &mut trials {
        let v = t.intermediate[&10];
        t.rungs.insert(0, v);
    }
    trials[0].rungs.insert(1, 1.0);
    // Trial 3 reports only at step 35: with 0.5 it leads rung 0 (n = 4, keep 1) and then
    // rung 1 (n = 2, keep 1).
    let v = arrive(&spec, &mut trials, &[(35, 0.5)]);
    assert_eq!(v, Verdict::Continue, "0.5 leads both rungs");
    assert_eq!((trials[3].rungs[&0], trials[3].rungs[&1]), (0.5, 0.5));
    // Trial 4 also jumps to 35 but is pruned at rung 0 and never recorded at rung 1.
    let v = arrive(&spec, &mut trials, &[(35, 2.5)]);
    assert!(pruned(&v));
    assert!(trials[4].rungs.contains_key(&0) && !trials[4].rungs.contains_key(&1));
    // Its reason names the step it reached first (what a trials table shows beside it), then
    // the rung it was judged at.
    let Verdict::Prune { reason } = &v else {
        panic!("expected a prune, got {v:?}")
    };
    assert!(
        reason.starts_with("pruned at step 35:") && reason.contains("at step 10 (rung 0)"),
        "{reason}"
    );
}

#[test]
fn judge_is_a_pure_function_of_its_arguments() {
    let spec = asha();
    let mut trials = vec![
        running(0, &[(10, 1.0)]),
        running(1, &[(10, 2.0)]),
        running(2, &[(10, 3.0)]),
    ];
    trials[0].rungs.insert(0, 1.0);
    trials[1].rungs.insert(0, 2.0);
    let mut a = trials.clone();
    let mut b = trials.clone();
    let va = judge(&spec, &mut a, 2);
    let vb = judge(&spec, &mut b, 2);
    assert!(pruned(&va));
    assert_eq!(va, vb);
    assert_eq!(a[2].rungs, b[2].rungs);
    // A trial the server marked pruned stays pruned when asked again.
    a[2].state = TrialState::Pruned;
    assert!(pruned(&judge(&spec, &mut a, 2)));
}

#[test]
fn asha_ranks_the_other_way_when_maximizing_and_ignores_nan_reports() {
    let spec = spec(
        json!({"type": "asha", "min_steps": 10, "eta": 2}),
        "maximize",
    );
    let mut trials = Vec::new();
    assert_eq!(arrive(&spec, &mut trials, &[(10, 0.9)]), Verdict::Continue);
    // n = 2, keep 1: 0.8 is behind 0.9 when larger is better.
    assert!(pruned(&arrive(&spec, &mut trials, &[(10, 0.8)])));
    // A NaN at the rung step is skipped: the last finite report before it counts (and a NaN
    // alone does not count as reaching the rung).
    assert_eq!(
        arrive(&spec, &mut trials, &[(5, 0.95), (10, f64::NAN)]),
        Verdict::Continue
    );
    assert!(trials[2].rungs.is_empty());
    trials[2].intermediate.insert(12, 0.5);
    assert_eq!(judge(&spec, &mut trials, 2), Verdict::Continue);
    assert_eq!(trials[2].rungs[&0], 0.95);
}

fn median_spec() -> SweepSpec {
    spec(
        json!({"type": "median", "min_steps": 10, "startup_trials": 2}),
        "minimize",
    )
}

fn finished(number: u32, reports: &[(u64, f64)]) -> Trial {
    let mut t = running(number, reports);
    t.state = TrialState::Complete;
    t.value = reports.last().map(|r| r.1);
    t
}

#[test]
fn the_median_rule_prunes_a_trial_whose_best_is_worse_than_the_median_at_its_step() {
    let spec = median_spec();
    let base = vec![
        finished(0, &[(10, 1.0), (20, 0.8)]),
        finished(1, &[(10, 2.0), (20, 1.2)]),
    ];
    // Median at step 10 of 1.0 and 2.0 is 1.5.
    let mut t = base.clone();
    t.push(running(2, &[(10, 1.8)]));
    let v = judge(&spec, &mut t, 2);
    let Verdict::Prune { reason } = &v else {
        panic!("expected a prune, got {v:?}")
    };
    assert!(reason.contains("1.8") && reason.contains("1.5"), "{reason}");
    let mut t = base.clone();
    t.push(running(2, &[(10, 1.4)]));
    assert_eq!(judge(&spec, &mut t, 2), Verdict::Continue);
    // Its best so far counts, not its latest: at step 20 the others' median is 1.0 (0.8 and
    // 1.2); its latest 1.3 is worse, but its best 1.0 is not worse, so it continues.
    let mut t = base.clone();
    t.push(running(2, &[(10, 1.0), (20, 1.3)]));
    assert_eq!(judge(&spec, &mut t, 2), Verdict::Continue);
    // A step between reports: others count with their last value at or before it (1.0, 2.0).
    let mut t = base.clone();
    t.push(running(2, &[(15, 1.6)]));
    assert!(pruned(&judge(&spec, &mut t, 2)));
}

#[test]
fn the_median_rule_waits_for_startup_trials_min_steps_and_comparable_trials() {
    let spec = median_spec();
    // Only one complete trial: too early to judge.
    let mut t = vec![finished(0, &[(10, 1.0)]), running(1, &[(10, 9.0)])];
    assert_eq!(judge(&spec, &mut t, 1), Verdict::Continue);
    let base = vec![
        finished(0, &[(10, 1.0), (20, 0.8)]),
        finished(1, &[(10, 2.0), (20, 1.2)]),
    ];
    // Before min_steps.
    let mut t = base.clone();
    t.push(running(2, &[(5, 9.0)]));
    assert_eq!(judge(&spec, &mut t, 2), Verdict::Continue);
    assert_eq!(next_rung(&spec, &t[2]), Some(10));
    // Nobody else reached step 30.
    let mut t = base.clone();
    t.push(running(2, &[(30, 9.0)]));
    assert_eq!(judge(&spec, &mut t, 2), Verdict::Continue);
}

fn hyperband() -> SweepSpec {
    spec(
        json!({"type": "hyperband", "min_steps": 1, "max_steps": 27, "reduction_factor": 3}),
        "minimize",
    )
}

#[test]
fn hyperband_assigns_brackets_deterministically_in_proportion_to_their_sizes() {
    let spec = hyperband();
    // s_max = 3; brackets start ceil(4/4*27) = 27, ceil(4/3*9) = 12, ceil(4/2*3) = 6 and 4
    // configurations: 49 in all.
    let mut counts = [0usize; 4];
    for n in 0..4900 {
        let b = assign_bracket(&spec, n).unwrap();
        assert_eq!(assign_bracket(&spec, n), Some(b));
        counts[b as usize] += 1;
    }
    for (b, expected) in [(0, 2700.0), (1, 1200.0), (2, 600.0), (3, 400.0)] {
        let got = counts[b] as f64;
        assert!(
            (got - expected).abs() < 0.15 * expected,
            "bracket {b}: {got} vs {expected}"
        );
    }
    assert_eq!(assign_bracket(&asha(), 0), None);
}

fn in_bracket(number: u32, bracket: u32, reports: &[(u64, f64)]) -> Trial {
    Trial {
        bracket: Some(bracket),
        ..running(number, reports)
    }
}

#[test]
fn hyperband_compares_trials_only_within_a_bracket_starting_at_its_own_first_rung() {
    let spec = hyperband();
    // Bracket 0 rungs at steps 1, 3, 9; bracket 1 at 3, 9; bracket 3 has none (27 is the end).
    let mut trials = vec![in_bracket(0, 0, &[(1, 1.0)]), in_bracket(1, 0, &[(1, 1.1)])];
    trials[0].rungs.insert(0, 1.0);
    trials[1].rungs.insert(0, 1.1);
    // A bracket-1 trial at step 1 has reached none of its rungs.
    trials.push(in_bracket(2, 1, &[(1, 9.0)]));
    assert_eq!(judge(&spec, &mut trials, 2), Verdict::Continue);
    assert!(trials[2].rungs.is_empty());
    assert_eq!(next_rung(&spec, &trials[2]), Some(3));
    // At step 3 it is the first of bracket 1 at its rung 0: bracket 0's rung-0 records (steps
    // of another schedule) do not count against it.
    trials[2].intermediate.insert(3, 9.0);
    assert_eq!(judge(&spec, &mut trials, 2), Verdict::Continue);
    // A second bracket-1 trial, worse, is pruned (n = 2, keep 1).
    trials.push(in_bracket(3, 1, &[(3, 10.0)]));
    assert!(pruned(&judge(&spec, &mut trials, 3)));
    // A bracket-3 trial is never judged.
    trials.push(in_bracket(4, 3, &[(26, 100.0)]));
    assert_eq!(judge(&spec, &mut trials, 4), Verdict::Continue);
    assert_eq!(next_rung(&spec, &trials[4]), None);
}

#[test]
fn no_rule_means_no_rung_and_no_pruning() {
    let spec = spec_with(
        json!({"x": {"distribution": "uniform", "min": 0, "max": 1}}),
        json!({}),
    );
    let mut trials = vec![running(0, &[(10, 1.0)]), running(1, &[(10, 100.0)])];
    assert_eq!(judge(&spec, &mut trials, 1), Verdict::Continue);
    assert_eq!(next_rung(&spec, &trials[1]), None);
    assert_eq!(judge(&spec, &mut trials, 7), Verdict::Continue);
}
