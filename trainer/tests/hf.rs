//! Hugging Face interchange: exported directories checked against an independent NumPy forward
//! pass (`tests/reference/hf_forward.py`, reading the safetensors file as `transformers` does),
//! and export → `init_from: hf:DIR` round trips.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

mod kit;

use candle_core::Device;
use kit::{config, logits, max_diff, model, reference_logits, train, IDS};
use trainer::hf::export::export;
use trainer::train::Trainer;

#[test]
fn exported_models_give_the_logits_of_an_independent_numpy_forward_pass() {
    let cases = [
        ("gpt2", "GPT2LMHeadModel"),
        ("gpt2-nobias-untied", "GPT2LMHeadModel"),
        ("llama", "LlamaForCausalLM"),
        ("llama-bias-tied", "LlamaForCausalLM"),
        ("mixtral", "MixtralForCausalLM"),
    ];
    for (kind, class) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (trainer, ckpt) = train(config(model(kind), dir.path()), 3, dir.path());
        let out = dir.path().join("hf");
        export(&ckpt, &out, false).unwrap();
        let (arch, want) = reference_logits(&out, &IDS);
        assert_eq!(arch, class, "{kind}");
        let got = logits(trainer.model(), &IDS);
        let diff = max_diff(&got, &want);
        assert!(diff < 1e-4, "{kind}: logits differ by {diff}");
    }
}

#[test]
fn an_exported_model_imported_with_init_from_hf_gives_the_same_logits() {
    for kind in ["gpt2", "llama", "mixtral"] {
        let dir = tempfile::tempdir().unwrap();
        let (trainer, _) = train(config(model(kind), dir.path()), 3, dir.path());
        let out = dir.path().join("exported");
        // A run directory exports its latest checkpoint (no best one was written here).
        export(dir.path(), &out, false).unwrap();

        // The importing run starts from another shape: config.json replaces it.
        let mut cfg = config(model("gpt2"), dir.path());
        cfg.model.d_model = 16;
        cfg.training.init_from = Some(format!("hf:{}", out.display()));
        let imported = Trainer::new(cfg, Device::Cpu).unwrap();
        assert_eq!(imported.config().model.d_model, 32, "{kind}");
        assert_eq!(imported.config().model.moe.is_some(), kind == "mixtral");
        let diff = max_diff(
            &logits(imported.model(), &IDS),
            &logits(trainer.model(), &IDS),
        );
        assert!(
            diff < 1e-5,
            "{kind}: logits differ by {diff} after the round trip"
        );
    }
}

#[test]
fn the_export_directory_holds_what_transformers_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ckpt) = train(config(model("llama"), dir.path()), 1, dir.path());
    let out = dir.path().join("hf");
    export(&ckpt, &out, false).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "LlamaForCausalLM");
    assert_eq!(config["hidden_size"], 32);
    assert_eq!(config["num_key_value_heads"], 4);
    let tokenizer = trainer::data::TextTokenizer::load(&out.join("tokenizer.json")).unwrap();
    assert_eq!(tokenizer.encode("Hi!").unwrap(), [72, 105, 33]);
    // A second export replaces the first; a directory of other files is never replaced.
    export(&ckpt, &out, false).unwrap();
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    let err = export(&ckpt, &other, false).unwrap_err().to_string();
    assert!(
        err.contains("not empty") && err.contains("notes.txt"),
        "{err}"
    );
    assert!(other.join("notes.txt").is_file());
}

#[test]
fn a_model_no_architecture_fits_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = model("gpt2");
    m.norm = trainer::config::NormKind::RmsNorm;
    let (_, ckpt) = train(config(m, dir.path()), 1, dir.path());
    let err = export(&ckpt, &dir.path().join("hf"), false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot export to Hugging Face format") && err.contains("model.norm rmsnorm"),
        "{err}"
    );
    assert!(!dir.path().join("hf").exists());
}

#[test]
fn importing_an_unsupported_config_names_the_key_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ckpt) = train(config(model("llama"), dir.path()), 1, dir.path());
    let out = dir.path().join("hf");
    export(&ckpt, &out, false).unwrap();
    let path = out.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    json["num_key_value_heads"] = 2.into();
    std::fs::write(&path, json.to_string()).unwrap();
    let mut cfg = config(model("gpt2"), dir.path());
    cfg.training.init_from = Some(format!("hf:{}", out.display()));
    let err = format!("{:#}", Trainer::new(cfg, Device::Cpu).err().unwrap());
    assert!(
        err.starts_with("training.init_from") && err.contains("grouped-query attention"),
        "{err}"
    );
}
