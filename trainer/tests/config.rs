//! Config loading, overrides and validation: every error names its key path.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use serde_json::json;
use trainer::config::{
    Config, ConfigError, DeviceSpec, LoraTarget, PositionKind, Progress, PROFILES,
};

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
    assert_eq!(cfg.training.device, DeviceSpec::Cuda(Some(1)));
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

/// A document that sets only `key` (dotted) to `value` (YAML).
fn doc(key: &str, value: &str) -> String {
    let parts: Vec<&str> = key.split('.').collect();
    let mut out = String::new();
    for (depth, part) in parts.iter().enumerate() {
        out.push_str(&format!("{}{part}:", "  ".repeat(depth)));
        if depth + 1 < parts.len() {
            out.push('\n');
        }
    }
    out + &format!(" {value}\n")
}

/// The config read from `key: value`, after checking that YAML and JSON both write `value`
/// back in the same spelling and read back to the same config, and that the server's way in
/// (a flattened `--set key=value`) reads the same.
fn read_back(key: &str, value: &str) -> Config {
    let cfg = Config::from_yaml_str(&doc(key, value)).unwrap_or_else(|e| panic!("{value}: {e}"));
    let given: serde_json::Value = serde_yaml_ng::from_str(value).unwrap();
    let at = format!("/{}", key.replace('.', "/"));
    let yaml = cfg.to_yaml().unwrap();
    let tree: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_eq!(
        tree.pointer(&at),
        Some(&given),
        "{key}: {value}, YAML:\n{yaml}"
    );
    assert_eq!(Config::from_yaml_str(&yaml).unwrap(), cfg, "{value}");
    let json = serde_json::to_value(&cfg).unwrap();
    assert_eq!(json.pointer(&at), Some(&given), "{key}: {value}, JSON");
    let stored = Config::from_json_value(&json).unwrap();
    assert_eq!(stored, cfg, "{value}");
    assert_eq!(serde_json::to_value(&stored).unwrap(), json, "{value}");
    let mut set = Config::default();
    let text = given
        .as_str()
        .map_or_else(|| value.to_string(), str::to_string);
    set.apply_overrides(&[format!("{key}={text}")]).unwrap();
    assert_eq!(set, cfg, "--set {key}={text}");
    cfg
}

#[test]
fn every_progress_spelling_reads_and_writes_back_the_same() {
    for (text, want) in [
        ("auto", Progress::Auto),
        ("always", Progress::Always),
        ("never", Progress::Never),
    ] {
        assert_eq!(read_back("logging.progress", text).logging.progress, want);
    }
    assert_eq!(Config::default().logging.progress, Progress::Auto);
    assert!(Progress::Always.shows(false) && !Progress::Never.shows(true));
    assert_eq!(
        (Progress::Auto.shows(true), Progress::Auto.shows(false)),
        (true, false)
    );
}

#[test]
fn every_device_spelling_reads_and_writes_back_the_same() {
    for (text, want, ordinal) in [
        ("auto", DeviceSpec::Auto, None),
        ("cpu", DeviceSpec::Cpu, None),
        ("cuda", DeviceSpec::Cuda(None), Some(0)),
        ("cuda:0", DeviceSpec::Cuda(Some(0)), Some(0)),
        ("cuda:3", DeviceSpec::Cuda(Some(3)), Some(3)),
    ] {
        let device = read_back("training.device", text).training.device;
        assert_eq!(device, want, "{text}");
        assert_eq!(device.cuda_ordinal(), ordinal, "{text}");
        assert_eq!(device.to_string(), text);
    }
    assert_eq!(Config::default().training.device, DeviceSpec::Auto);
}

#[test]
fn every_lora_target_reads_and_writes_back_the_same() {
    for target in LoraTarget::ALL {
        let cfg = read_back("training.lora.targets", &format!("[{target}]"));
        assert_eq!(cfg.training.lora.unwrap().targets, [target]);
    }
    let all = "[q, k, v, o, mlp_in, mlp_out, expert_in, expert_out]";
    let cfg = read_back("training.lora.targets", all);
    assert_eq!(cfg.training.lora.unwrap().targets, LoraTarget::ALL);
}

#[test]
fn every_layer_pattern_reads_and_writes_back_the_same() {
    for (text, blocks) in [
        ("AF", 1),
        ("MFMEAF", 3),
        ("MMAF", 3),
        ("MFF", 2),
        ("E", 1),
        ("AEMEM", 3),
    ] {
        let cfg = read_back("model.layer_pattern", text);
        assert_eq!(cfg.model.layer_pattern.unwrap().len(), blocks, "{text}");
    }
}

#[test]
fn a_wrong_spelling_is_refused_as_the_config_is_read_naming_the_key() {
    let cases = [
        (
            "training.device",
            "gpu",
            "expected auto, cpu, cuda or cuda:N, got \"gpu\"",
        ),
        (
            "training.device",
            "cuda:x",
            "expected auto, cpu, cuda or cuda:N, got \"cuda:x\"",
        ),
        ("training.device", "\"cuda:\"", "got \"cuda:\""),
        ("training.device", "CPU", "got \"CPU\""),
        ("training.device", "3", "expected a string"),
        (
            "logging.progress",
            "sometimes",
            "must be auto, always or never, got \"sometimes\"",
        ),
        ("logging.progress", "true", "expected a string"),
        (
            "model.layer_pattern",
            "MFAx",
            "position 4: unknown letter 'x'",
        ),
        ("model.layer_pattern", "\"\"", "at least one letter"),
    ];
    let says = |err: &ConfigError, key: &str, message: &str| {
        let text = err.to_string();
        text.starts_with(&format!("{key}: ")) && text.contains(message)
    };
    for (key, value, message) in cases {
        let yaml = doc(key, value);
        let from_yaml = Config::from_yaml_str(&yaml).unwrap_err();
        assert_eq!(from_yaml.key(), Some(key), "{yaml}");
        assert!(says(&from_yaml, key, message), "{from_yaml}");
        let json: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        let from_json = Config::from_json_value(&json).unwrap_err();
        assert_eq!(from_json.to_string(), from_yaml.to_string(), "{json}");
        // `--set` takes the text of a string setting as it is: `3` is the spelling "3".
        let text: serde_json::Value = serde_yaml_ng::from_str(value).unwrap();
        let arg = format!("{key}={}", text.as_str().unwrap_or(value));
        let from_set = set(&mut Config::default(), &[&arg]).unwrap_err();
        assert_eq!(from_set.key(), Some(key), "{arg}");
        if text.is_string() {
            assert!(says(&from_set, key, message), "{from_set}");
        }
    }
}

#[test]
fn a_wrong_lora_target_is_refused_naming_its_place_in_the_list() {
    let want = "training.lora.targets[1]: unknown projection \"qq\"; the choices are q, k, v, o, \
                mlp_in, mlp_out, expert_in, expert_out";
    let err = Config::from_yaml_str("training:\n  lora:\n    targets: [q, qq, v]\n").unwrap_err();
    assert_eq!(err.key(), Some("training.lora.targets[1]"));
    assert_eq!(err.to_string(), want);
    let json = json!({"training": {"lora": {"targets": ["q", "qq", "v"]}}});
    assert_eq!(
        Config::from_json_value(&json).unwrap_err().to_string(),
        want
    );
    let err = set(&mut Config::default(), &["training.lora.targets=[q, qq]"]).unwrap_err();
    assert_eq!(err.to_string(), want);
    let err = set(&mut Config::default(), &["training.lora.targets=[1]"]).unwrap_err();
    assert_eq!(err.key(), Some("training.lora.targets[0]"), "{err}");
}

#[test]
fn device_strings_parse() {
    assert_eq!("auto".parse::<DeviceSpec>(), Ok(DeviceSpec::Auto));
    assert_eq!("cpu".parse::<DeviceSpec>(), Ok(DeviceSpec::Cpu));
    assert_eq!("cuda".parse::<DeviceSpec>(), Ok(DeviceSpec::Cuda(None)));
    assert_eq!(
        "cuda:3".parse::<DeviceSpec>(),
        Ok(DeviceSpec::Cuda(Some(3)))
    );
    assert!("cuda:".parse::<DeviceSpec>().is_err());
}
