//! The config keys of the guides' training options: label smoothing, the restart schedule, the
//! curriculum, the instability guard and per-layer norms, each refused with its key path.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use trainer::config::{Config, ConfigError, LrSchedule};

/// The key and message of the error `yaml` (merged over the defaults) gets, from loading or
/// validating.
fn refusal(yaml: &str) -> (String, String) {
    let err: ConfigError = match Config::from_yaml_str(yaml) {
        Ok(cfg) => cfg.validate().expect_err("the config should be refused"),
        Err(e) => e,
    };
    (err.key().unwrap_or_default().to_string(), err.to_string())
}

#[test]
fn the_guide_options_load_from_yaml_with_their_values() {
    let cfg = Config::from_yaml_str(
        "training:\n  lr_schedule: sgdr\n  lr_restart_period: 50\n  lr_restart_mult: 2\n  \
         label_smoothing: 0.1\n  curriculum:\n    - {seq_len: 16, steps: 100}\n    - \
         {seq_len: 32, steps: 50}\n  instability_guard: {rollback_after: 5}\n\
         logging:\n  layer_norms_every: 25\n",
    )
    .unwrap();
    cfg.validate().unwrap();
    let t = &cfg.training;
    assert_eq!(t.lr_schedule, LrSchedule::Sgdr);
    assert_eq!((t.lr_restart_period, t.lr_restart_mult), (50, 2.0));
    assert_eq!(t.label_smoothing, 0.1);
    assert_eq!(t.curriculum[1].seq_len, 32);
    let guard = t.instability_guard.as_ref().unwrap();
    assert_eq!(guard.rollback_after, 5);
    assert_eq!(guard.lr_scale, 0.5, "keys left out take their defaults");
    assert_eq!(cfg.logging.layer_norms_every, 25);
    assert!(
        Config::default().training.instability_guard.is_none(),
        "off by default"
    );
}

#[test]
fn a_guard_set_by_one_override_turns_the_section_on() {
    let mut cfg = Config::default();
    cfg.apply_overrides(&["training.instability_guard.spike_factor=4".to_string()])
        .unwrap();
    assert_eq!(cfg.training.instability_guard.unwrap().spike_factor, 4.0);
}

#[test]
fn out_of_range_values_are_refused_naming_their_key_paths() {
    let cases = [
        ("training: {label_smoothing: 1.0}", "training.label_smoothing", "[0, 1)"),
        ("training: {label_smoothing: -0.1}", "training.label_smoothing", "[0, 1)"),
        ("training: {lr_restart_period: 0}", "training.lr_restart_period", "at least 1"),
        ("training: {lr_restart_mult: 0.5}", "training.lr_restart_mult", ">= 1"),
        (
            "training: {seq_len: 64, curriculum: [{seq_len: 16, steps: 10}, {seq_len: 128, steps: 10}]}",
            "training.curriculum[1].seq_len",
            "<= training.seq_len",
        ),
        (
            "training: {curriculum: [{seq_len: 16, steps: 0}]}",
            "training.curriculum[0].steps",
            "at least 1",
        ),
        (
            "training: {instability_guard: {spike_factor: 1.0}}",
            "training.instability_guard.spike_factor",
            "> 1",
        ),
        (
            "training: {instability_guard: {rollback_after: 0}}",
            "training.instability_guard.rollback_after",
            "at least 1",
        ),
        (
            "training: {instability_guard: {lr_scale: 0}}",
            "training.instability_guard.lr_scale",
            "(0, 1]",
        ),
    ];
    for (yaml, key, words) in cases {
        let (got_key, message) = refusal(yaml);
        assert_eq!(got_key, key, "{yaml}: {message}");
        assert!(message.contains(words), "{yaml}: {message}");
    }
}

#[test]
fn a_misspelt_guard_key_is_refused_with_the_nearest_one() {
    let (key, message) = refusal("training: {instability_guard: {rollback_afterr: 2}}");
    assert_eq!(key, "training.instability_guard.rollback_afterr");
    assert!(
        message.contains("did you mean training.instability_guard.rollback_after"),
        "{message}"
    );
}

#[test]
fn the_lm_only_options_are_refused_for_dpo_naming_the_key() {
    for (extra, key) in [
        ("label_smoothing: 0.1", "training.label_smoothing"),
        (
            "curriculum: [{seq_len: 8, steps: 5}]",
            "training.curriculum",
        ),
        ("instability_guard: {}", "training.instability_guard"),
    ] {
        let yaml =
            format!("training: {{objective: dpo, {extra}}}\ndata: {{dataset: pairs.jsonl}}\n");
        let (got, message) = refusal(&yaml);
        assert_eq!(got, key, "{message}");
        assert!(message.contains("training.objective lm"), "{message}");
    }
}
