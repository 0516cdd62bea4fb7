//! Config loading, overrides and validation: every error names its key path.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use trainer::config::{Config, ConfigError, DeviceSpec, PositionKind, PROFILES};

fn set(cfg: &mut Config, args: &[&str]) -> Result<(), ConfigError> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    cfg.apply_overrides(&args)
}

#[test]
fn every_profile_loads_and_validates() {
    assert_eq!(PROFILES.len(), 8);
    for (name, _) in PROFILES {
        let cfg = Config::from_profile(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        cfg.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn profiles_have_the_documented_shapes() {
    let tiny = Config::from_profile("tiny").unwrap();
    assert_eq!(tiny, Config::default());
    let small = Config::from_profile("small").unwrap();
    assert_eq!(
        (
            small.model.d_model,
            small.model.n_layers,
            small.model.n_heads,
            small.model.d_ff
        ),
        (512, 6, 8, 2048)
    );
    assert_eq!(small.model.max_seq_len, 512);
    let medium = Config::from_profile("medium").unwrap();
    assert_eq!(
        (
            medium.model.vocab_size,
            medium.model.d_model,
            medium.model.n_layers
        ),
        (50304, 768, 12)
    );
    assert_eq!((medium.model.n_heads, medium.model.max_seq_len), (12, 1024));
    assert_eq!(medium.data.tokenizer, "bpe");
    let large = Config::from_profile("large").unwrap();
    assert_eq!(
        (
            large.model.d_model,
            large.model.n_layers,
            large.model.n_heads
        ),
        (1024, 24, 16)
    );
    for name in ["tiny-moe", "small-moe"] {
        let moe = Config::from_profile(name).unwrap().model.moe.unwrap();
        assert_eq!((moe.num_experts, moe.top_k), (8, 2), "{name}");
    }
}

#[test]
fn an_unknown_key_names_its_path_and_the_nearest_valid_key() {
    let err = Config::from_yaml_str("training:\n  learnig_rate: 0.1\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "training.learnig_rate: unknown key; did you mean training.learning_rate?"
    );
    assert_eq!(err.key(), Some("training.learnig_rate"));
}

#[test]
fn a_key_in_the_wrong_section_suggests_the_right_section() {
    let err = Config::from_yaml_str("model:\n  learning_rate: 0.1\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "model.learning_rate: unknown key; did you mean training.learning_rate?"
    );
}

#[test]
fn an_unknown_key_inside_moe_is_rejected() {
    let err = Config::from_yaml_str("model:\n  moe:\n    num_expert: 4\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "model.moe.num_expert: unknown key; did you mean model.moe.num_experts?"
    );
}

#[test]
fn an_unknown_section_is_rejected() {
    let err = Config::from_yaml_str("trainng:\n  seed: 1\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "trainng: unknown key; did you mean training?"
    );
}

#[test]
fn a_value_of_the_wrong_type_in_a_file_names_the_key_and_the_expected_type() {
    let cases = [
        (
            "training:\n  learning_rate: abc\n",
            "training.learning_rate",
            "expected a number",
        ),
        (
            "model:\n  n_layers: -2\n",
            "model.n_layers",
            "expected a whole number (0 or more)",
        ),
        ("model:\n  norm: batchnorm\n", "model.norm", "layernorm"),
        ("data:\n  dedup: maybe\n", "data.dedup", "bool"),
        ("model: 3\n", "model", "mapping"),
    ];
    for (yaml, key, expected) in cases {
        let err = Config::from_yaml_str(yaml).unwrap_err();
        assert_eq!(err.key(), Some(key), "{yaml}: {err}");
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("{key}: ")), "{msg}");
        assert!(msg.contains(expected), "{msg} should mention {expected}");
        for rust in ["usize", "f64", "Some(", "struct "] {
            assert!(!msg.contains(rust), "{msg} names a Rust type");
        }
    }
}

#[test]
fn overrides_set_nested_keys_with_typed_values() {
    let mut cfg = Config::default();
    set(
        &mut cfg,
        &[
            "training.learning_rate=3e-4",
            "model.n_layers=3",
            "model.position=rope",
            "training.device=cuda:1",
            "data.dataset=2024",
            "model.moe.top_k=1",
            "training.init_from=ckpt/step-10",
            "data.line_filters.min_words=3",
            "data.line_filters.boilerplate=true",
            "logging.heartbeat_interval_secs=5",
        ],
    )
    .unwrap();
    assert_eq!(cfg.data.line_filters.min_words, 3);
    assert!(cfg.data.line_filters.boilerplate && !cfg.data.line_filters.symbol_lines);
    assert_eq!(cfg.logging.heartbeat_interval_secs, 5);
    assert_eq!(cfg.training.learning_rate, 3e-4);
    assert_eq!(cfg.model.n_layers, 3);
    assert_eq!(cfg.model.position, PositionKind::Rope);
    assert_eq!(cfg.training.device, "cuda:1");
    assert_eq!(cfg.data.dataset, "2024");
    // Setting one MoE key turns MoE on with defaults for the rest.
    let moe = cfg.model.moe.clone().unwrap();
    assert_eq!((moe.top_k, moe.num_experts), (1, 8));
    assert_eq!(cfg.training.init_from.as_deref(), Some("ckpt/step-10"));
    set(&mut cfg, &["model.moe=null", "training.init_from=null"]).unwrap();
    assert_eq!(cfg.model.moe, None);
    assert_eq!(cfg.training.init_from, None);
}

#[test]
fn invalid_overrides_name_the_key() {
    let cases = [
        ("training.lr=abc", "training.lr", "did you mean"),
        (
            "training.learning_rate=abc",
            "training.learning_rate",
            "expected a number",
        ),
        (
            "training.learnig_rate=0.1",
            "training.learnig_rate",
            "training.learning_rate",
        ),
        (
            "model.n_heads=four",
            "model.n_heads",
            "expected a whole number",
        ),
        ("model.d_model=", "model.d_model", "expected"),
        ("model.moe.topk=2", "model.moe.topk", "model.moe.top_k"),
        ("model.d_model.x=1", "model.d_model.x", "unknown key"),
    ];
    for (arg, key, needle) in cases {
        let err = set(&mut Config::default(), &[arg]).unwrap_err();
        assert_eq!(err.key(), Some(key), "{arg}: {err}");
        assert!(err.to_string().contains(needle), "{arg}: {err}");
    }
    let err = set(&mut Config::default(), &["training.seed"]).unwrap_err();
    assert!(err.to_string().contains("KEY=VALUE"), "{err}");
}

#[test]
fn each_rule_violation_names_its_key() {
    let cases: &[(&[&str], &str)] = &[
        (&["model.d_model=100", "model.n_heads=3"], "model.d_model"),
        (&["training.seq_len=128"], "training.seq_len"),
        (&["training.warmup_steps=200"], "training.warmup_steps"),
        (&["model.vocab_size=100"], "model.vocab_size"),
        (
            &["model.moe.num_experts=2", "model.moe.top_k=3"],
            "model.moe.top_k",
        ),
        (&["model.moe.every_n_layers=3"], "model.moe.every_n_layers"),
        (&["model.moe.router_jitter=1.5"], "model.moe.router_jitter"),
        (&["model.dropout=1.0"], "model.dropout"),
        (&["model.dropout=-0.1"], "model.dropout"),
        (&["data.val_fraction=1"], "data.val_fraction"),
        (&["model.d_model=0"], "model.d_model"),
        (&["training.batch_size=0"], "training.batch_size"),
        (&["training.learning_rate=0"], "training.learning_rate"),
        (&["training.min_lr=1"], "training.min_lr"),
        (&["training.beta2=1"], "training.beta2"),
        (
            &["model.d_model=12", "model.n_heads=4", "model.position=rope"],
            "model.position",
        ),
        (&["training.device=gpu"], "training.device"),
        (&["training.device=cuda:x"], "training.device"),
        (&["logging.progress=sometimes"], "logging.progress"),
        (
            &["logging.heartbeat_interval_secs=0"],
            "logging.heartbeat_interval_secs",
        ),
        (
            &["training.grad_accum_steps=0"],
            "training.grad_accum_steps",
        ),
    ];
    for (args, key) in cases {
        let mut cfg = Config::default();
        set(&mut cfg, args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let err = cfg.validate().unwrap_err();
        assert_eq!(err.key(), Some(*key), "{args:?}: {err}");
        assert!(err.to_string().starts_with(&format!("{key}: ")), "{err}");
    }
}

#[test]
fn the_resolved_config_round_trips_through_yaml_and_json() {
    let mut cfg = Config::from_profile("small-moe").unwrap();
    set(&mut cfg, &["training.seed=7"]).unwrap();
    let yaml = cfg.to_yaml().unwrap();
    assert_eq!(Config::from_yaml_str(&yaml).unwrap(), cfg);
    let json = serde_json::to_value(&cfg).unwrap();
    assert_eq!(Config::from_json_value(&json).unwrap(), cfg);
    let bad = serde_json::json!({"training": {"seed": 1, "warmup": 3}});
    let err = Config::from_json_value(&bad).unwrap_err();
    assert_eq!(err.key(), Some("training.warmup"));
}

#[test]
fn load_accepts_a_file_or_a_profile_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.yaml");
    std::fs::write(&path, "model:\n  n_layers: 3\n").unwrap();
    assert_eq!(
        Config::load(path.to_str().unwrap()).unwrap().model.n_layers,
        3
    );
    assert_eq!(Config::load("large").unwrap().model.n_layers, 24);
    let err = Config::load("huge").unwrap_err();
    assert!(err.to_string().contains("tiny, small"), "{err}");
    let cfg = Config::resolve("tiny", &["training.max_steps=5".to_string()]);
    assert!(cfg.is_err(), "warmup 10 >= max_steps 5 must be rejected");
}

#[test]
fn device_strings_parse() {
    assert_eq!("auto".parse::<DeviceSpec>(), Ok(DeviceSpec::Auto));
    assert_eq!("cpu".parse::<DeviceSpec>(), Ok(DeviceSpec::Cpu));
    assert_eq!("cuda".parse::<DeviceSpec>(), Ok(DeviceSpec::Cuda(0)));
    assert_eq!("cuda:3".parse::<DeviceSpec>(), Ok(DeviceSpec::Cuda(3)));
    assert!("cuda:".parse::<DeviceSpec>().is_err());
}
