//! The spec: what parses, what it means, and what each mistake is reported as.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use sweep::{Command, EarlyTerminate, Goal, Method, Param, SweepSpec};

const EXAMPLE: &str = r#"
name: lr-and-experts
experiment: moe-search
base: {profile: small-moe, overrides: {training.max_steps: 2000}}
metric: {name: val/loss, goal: minimize}
method: tpe
parameters:
  training.learning_rate: {distribution: log_uniform, min: 1.0e-4, max: 3.0e-3}
  model.moe.num_experts: {values: [4, 8, 16]}
  model.moe.top_k: {distribution: int_uniform, min: 1, max: 2}
  model.dropout: {distribution: uniform, min: 0.0, max: 0.2}
early_terminate: {type: asha, min_steps: 200, reduction_factor: 3}
max_trials: 24
parallel: 4
resources: {gpus: 1}
seed: 7
"#;

fn valid() -> serde_json::Value {
    json!({
        "name": "s",
        "base": {"profile": "tiny"},
        "metric": {"name": "val/loss"},
        "method": "random",
        "parameters": {"training.learning_rate": {"distribution": "log_uniform", "min": 1e-4, "max": 1e-2}},
        "max_trials": 10
    })
}

#[test]
fn the_documented_example_parses_into_what_it_says() {
    let spec = SweepSpec::from_yaml_str(EXAMPLE).unwrap();
    assert_eq!(spec.name, "lr-and-experts");
    assert_eq!(spec.experiment.as_deref(), Some("moe-search"));
    assert_eq!(spec.base.profile.as_deref(), Some("small-moe"));
    assert_eq!(spec.base.overrides["training.max_steps"], json!(2000));
    assert_eq!(spec.metric.goal, Goal::Minimize);
    assert_eq!(spec.method, Method::Tpe);
    assert_eq!(
        spec.parameters["training.learning_rate"],
        Param::LogUniform {
            min: 1e-4,
            max: 3e-3
        }
    );
    assert_eq!(
        spec.parameters["model.moe.num_experts"],
        Param::Categorical {
            values: vec![json!(4), json!(8), json!(16)]
        }
    );
    assert_eq!(
        spec.parameters["model.moe.top_k"],
        Param::IntUniform { min: 1, max: 2 }
    );
    assert_eq!(
        spec.early_terminate,
        EarlyTerminate::Asha {
            min_steps: 200,
            reduction_factor: 3
        }
    );
    assert_eq!(
        (
            spec.max_trials,
            spec.parallel,
            spec.resources.gpus,
            spec.seed
        ),
        (24, 4, 1, 7)
    );
}

#[test]
fn a_stored_spec_reads_back_equal_through_serde_and_through_the_validating_parser() {
    let spec = SweepSpec::from_yaml_str(EXAMPLE).unwrap();
    let stored = serde_json::to_value(&spec).unwrap();
    assert_eq!(
        serde_json::from_value::<SweepSpec>(stored.clone()).unwrap(),
        spec
    );
    assert_eq!(SweepSpec::from_json_value(&stored).unwrap(), spec);
}

#[test]
fn defaults_fill_in_goal_parallel_resources_seed_and_early_terminate() {
    let spec = SweepSpec::from_json_value(&valid()).unwrap();
    assert_eq!(spec.metric.goal, Goal::Minimize);
    assert_eq!((spec.parallel, spec.resources.gpus, spec.seed), (1, 0, 0));
    assert_eq!(spec.early_terminate, EarlyTerminate::None);
}

#[test]
fn wandb_aliases_are_accepted() {
    let spec = SweepSpec::from_yaml_str(
        r#"
name: wb
base: {command: [python, train.py]}
metric: {name: acc, goal: maximize}
method: bayes
run_cap: 30
parameters:
  lr: {distribution: log_uniform_values, min: 1e-5, max: 1e-1}
  wd: {distribution: q_log_uniform_values, min: 0.001, max: 0.1, q: 0.001}
  layers: {min: 2, max: 8}
  width: {min: 0.5, max: 2}
early_terminate: {type: hyperband, min_iter: 3, max_iter: 81, eta: 3}
"#,
    )
    .unwrap();
    assert_eq!(spec.method, Method::Bayes);
    assert_eq!(spec.max_trials, 30);
    assert_eq!(spec.metric.goal, Goal::Maximize);
    assert_eq!(
        spec.base.command,
        Some(Command::Argv(vec!["python".into(), "train.py".into()]))
    );
    assert_eq!(
        spec.parameters["lr"],
        Param::LogUniform {
            min: 1e-5,
            max: 1e-1
        }
    );
    assert_eq!(
        spec.parameters["wd"],
        Param::QLogUniform {
            min: 0.001,
            max: 0.1,
            q: 0.001
        }
    );
    assert_eq!(
        spec.parameters["layers"],
        Param::IntUniform { min: 2, max: 8 }
    );
    assert_eq!(
        spec.parameters["width"],
        Param::Uniform { min: 0.5, max: 2.0 }
    );
    assert_eq!(
        spec.early_terminate,
        EarlyTerminate::Hyperband {
            min_steps: 3,
            max_steps: 81,
            reduction_factor: 3
        }
    );
}

#[test]
fn a_grid_without_max_trials_runs_the_whole_grid() {
    let mut v = valid();
    v["method"] = json!("grid");
    v["parameters"] = json!({"a": {"values": [1, 2, 3]}, "b": {"distribution": "int_uniform", "min": 0, "max": 3}, "c": {"value": "x"}});
    v.as_object_mut().unwrap().remove("max_trials");
    assert_eq!(SweepSpec::from_json_value(&v).unwrap().max_trials, 12);
}

#[test]
fn probe_values_cover_both_ends_every_choice_and_the_constant() {
    let mut v = valid();
    v["parameters"] = json!({
        "a": {"values": ["x", "y"]},
        "b": {"distribution": "int_uniform", "min": 1, "max": 9},
        "c": {"value": true},
        "d": {"distribution": "q_uniform", "min": 3, "max": 50, "q": 8}
    });
    let probes = SweepSpec::from_json_value(&v).unwrap().probe_values();
    assert_eq!(
        probes,
        vec![
            ("a".into(), json!("x")),
            ("a".into(), json!("y")),
            ("b".into(), json!(1)),
            ("b".into(), json!(9)),
            ("c".into(), json!(true)),
            ("d".into(), json!(8)),
            ("d".into(), json!(48)),
        ]
    );
}

/// Applies `edit` to a valid spec and returns the error's field and reason.
fn error_of(edit: impl FnOnce(&mut serde_json::Value)) -> (String, String) {
    let mut v = valid();
    edit(&mut v);
    let err = SweepSpec::from_json_value(&v).expect_err("the spec should be rejected");
    (err.field, err.reason)
}

#[test]
fn each_bad_spec_names_the_field_at_fault_in_plain_words() {
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let p = "parameters.training.learning_rate";
    let cases: Vec<(&str, Edit, &str, &str)> = vec![
        (
            "empty name",
            Box::new(|v| v["name"] = json!("  ")),
            "name",
            "empty",
        ),
        (
            "long name",
            Box::new(|v| v["name"] = json!("x".repeat(201))),
            "name",
            "200",
        ),
        (
            "no name",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("name");
            }),
            "name",
            "required",
        ),
        (
            "unknown top key",
            Box::new(|v| v["lr"] = json!(1)),
            "lr",
            "unknown key `lr`",
        ),
        (
            "wandb program",
            Box::new(|v| v["program"] = json!("train.py")),
            "program",
            "base.command",
        ),
        (
            "misspelt method",
            Box::new(|v| v["method"] = json!("bays")),
            "method",
            "unknown method `bays`; expected grid, random, tpe, bayes or auto",
        ),
        (
            "metric without name",
            Box::new(|v| v["metric"] = json!({"name": ""})),
            "metric.name",
            "empty",
        ),
        (
            "bad goal",
            Box::new(|v| v["metric"]["goal"] = json!("lowest")),
            "metric.goal",
            "minimize or maximize",
        ),
        (
            "no base kind",
            Box::new(|v| v["base"] = json!({})),
            "base",
            "one of profile, config or command",
        ),
        (
            "two base kinds",
            Box::new(|v| v["base"]["command"] = json!("run.sh")),
            "base",
            "exactly one",
        ),
        (
            "overrides with command",
            Box::new(|v| v["base"] = json!({"command": "run.sh", "overrides": {"a": 1}})),
            "base.overrides",
            "command",
        ),
        (
            "config as number",
            Box::new(|v| v["base"] = json!({"config": 3})),
            "base.config",
            "YAML text or a mapping",
        ),
        (
            "parameter also overridden",
            Box::new(|v| v["base"]["overrides"] = json!({"training.learning_rate": 0.1})),
            p,
            "base.overrides",
        ),
        (
            "no parameters",
            Box::new(|v| v["parameters"] = json!({})),
            "parameters",
            "at least one",
        ),
        (
            "min above max",
            Box::new(|v| v["parameters"]["training.learning_rate"]["min"] = json!(0.1)),
            "parameters.training.learning_rate.min",
            "min must be below max (got 0.1 and 0.01)",
        ),
        (
            "log bound zero",
            Box::new(|v| v["parameters"]["training.learning_rate"]["min"] = json!(0)),
            "parameters.training.learning_rate.min",
            "above 0",
        ),
        (
            "bound is text",
            Box::new(|v| v["parameters"]["training.learning_rate"]["max"] = json!("big")),
            "parameters.training.learning_rate.max",
            "must be a number (got the text `big`)",
        ),
        (
            "unknown distribution",
            Box::new(|v| {
                v["parameters"]["training.learning_rate"]["distribution"] = json!("normal")
            }),
            "parameters.training.learning_rate.distribution",
            "unknown distribution `normal`",
        ),
        (
            "unknown parameter key",
            Box::new(|v| v["parameters"]["training.learning_rate"]["step"] = json!(2)),
            "parameters.training.learning_rate.step",
            "unknown key `step`",
        ),
        (
            "fractional int bound",
            Box::new(|v| {
                v["parameters"]["n"] = json!({"distribution": "int_uniform", "min": 1.5, "max": 4})
            }),
            "parameters.n.min",
            "whole number",
        ),
        (
            "empty values",
            Box::new(|v| v["parameters"]["n"] = json!({"values": []})),
            "parameters.n.values",
            "at least one",
        ),
        (
            "duplicate value",
            Box::new(|v| v["parameters"]["n"] = json!({"values": [1, 2, 1.0]})),
            "parameters.n.values[2]",
            "twice",
        ),
        (
            "list as a value",
            Box::new(|v| v["parameters"]["n"] = json!({"values": [1, [2]]})),
            "parameters.n.values[1]",
            "number, text or true/false",
        ),
        (
            "zero q",
            Box::new(|v| {
                v["parameters"]["n"] =
                    json!({"distribution": "q_uniform", "min": 0, "max": 1, "q": 0})
            }),
            "parameters.n.q",
            "above 0",
        ),
        (
            "no multiple of q",
            Box::new(|v| {
                v["parameters"]["n"] =
                    json!({"distribution": "q_uniform", "min": 1, "max": 2, "q": 5})
            }),
            "parameters.n.q",
            "no multiple",
        ),
        (
            "no distribution",
            Box::new(|v| v["parameters"]["n"] = json!({"min": 1})),
            "parameters.n",
            "needs `value`",
        ),
        (
            "too many trials",
            Box::new(|v| v["max_trials"] = json!(10001)),
            "max_trials",
            "between 1 and 10000",
        ),
        (
            "zero trials via alias",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("max_trials");
                v["run_cap"] = json!(0);
            }),
            "run_cap",
            "between 1 and 10000",
        ),
        (
            "both trial keys",
            Box::new(|v| v["run_cap"] = json!(5)),
            "run_cap",
            "not both",
        ),
        (
            "missing max_trials",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("max_trials");
            }),
            "max_trials",
            "required",
        ),
        (
            "parallel zero",
            Box::new(|v| v["parallel"] = json!(0)),
            "parallel",
            "between 1 and 256",
        ),
        (
            "parallel too high",
            Box::new(|v| v["parallel"] = json!(257)),
            "parallel",
            "between 1 and 256",
        ),
        (
            "negative gpus",
            Box::new(|v| v["resources"] = json!({"gpus": -1})),
            "resources.gpus",
            "between",
        ),
        (
            "grid over a continuous range",
            Box::new(|v| v["method"] = json!("grid")),
            p,
            "finite set of values",
        ),
        (
            "grid too big",
            Box::new(|v| {
                v["method"] = json!("grid");
                v["parameters"] = json!({"a": {"distribution": "int_uniform", "min": 1, "max": 200}, "b": {"distribution": "int_uniform", "min": 1, "max": 100}});
            }),
            "parameters",
            "20000 points",
        ),
        (
            "unknown rule",
            Box::new(|v| v["early_terminate"] = json!({"type": "bohb"})),
            "early_terminate.type",
            "unknown early-termination rule `bohb`",
        ),
        (
            "reduction factor one",
            Box::new(|v| {
                v["early_terminate"] =
                    json!({"type": "asha", "min_steps": 10, "reduction_factor": 1})
            }),
            "early_terminate.reduction_factor",
            "between 2",
        ),
        (
            "eta one",
            Box::new(|v| v["early_terminate"] = json!({"type": "asha", "min_iter": 10, "eta": 1})),
            "early_terminate.eta",
            "between 2",
        ),
        (
            "min_steps zero",
            Box::new(|v| v["early_terminate"] = json!({"type": "median", "min_steps": 0})),
            "early_terminate.min_steps",
            "between 1",
        ),
        (
            "asha without min_steps",
            Box::new(|v| v["early_terminate"] = json!({"type": "asha"})),
            "early_terminate.min_steps",
            "required",
        ),
        (
            "hyperband max below min",
            Box::new(|v| {
                v["early_terminate"] =
                    json!({"type": "hyperband", "min_steps": 10, "max_steps": 10})
            }),
            "early_terminate.max_steps",
            "above min_steps",
        ),
        (
            "unknown rule key",
            Box::new(|v| {
                v["early_terminate"] = json!({"type": "asha", "min_steps": 1, "grace": 2})
            }),
            "early_terminate.grace",
            "unknown key `grace`",
        ),
    ];
    for (what, edit, field, reason) in cases {
        let (got_field, got_reason) = error_of(edit);
        assert_eq!(got_field, field, "{what}: reason was {got_reason:?}");
        assert!(
            got_reason.contains(reason),
            "{what}: reason {got_reason:?} lacks {reason:?}"
        );
        for rust_word in [
            "f64",
            "i64",
            "u32",
            "u64",
            "usize",
            "Value",
            "invalid type",
            "struct",
            "enum",
        ] {
            assert!(
                !got_reason.contains(rust_word),
                "{what}: reason {got_reason:?} mentions {rust_word}"
            );
        }
    }
}

#[test]
fn invalid_yaml_is_an_error_not_a_panic() {
    let err = SweepSpec::from_yaml_str("name: [unclosed").unwrap_err();
    assert_eq!(err.field, "spec");
    let err = SweepSpec::from_yaml_str("- just\n- a list").unwrap_err();
    assert_eq!(err.field, "spec");
    assert!(err.to_string().starts_with("spec: must be a mapping"));
}

#[test]
fn numbers_written_without_a_dot_in_exponent_form_are_read_as_numbers() {
    let spec = SweepSpec::from_yaml_str(
        "name: n\nbase: {profile: p}\nmetric: {name: m}\nmethod: random\nmax_trials: 3\nparameters:\n  lr: {distribution: log_uniform, min: 1e-5, max: 1e-3}\n",
    )
    .unwrap();
    assert_eq!(
        spec.parameters["lr"],
        Param::LogUniform {
            min: 1e-5,
            max: 1e-3
        }
    );
}
