//! `trainyard export --format hf RUN_OR_CHECKPOINT OUT_DIR`: a directory `transformers` loads
//! with `AutoModelForCausalLM.from_pretrained(OUT_DIR)` and `AutoTokenizer.from_pretrained`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};

use super::{
    arch_for, pieces, tokenizer, Arch, CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
    WEIGHTS_FILE,
};
use crate::checkpoint;
use crate::config::ModelConfig;
use crate::model::lora;
use crate::sample::{self, LoadedModel};

/// The files an export writes; a re-export may replace a directory holding only these.
const EXPORT_FILES: [&str; 4] = [
    WEIGHTS_FILE,
    CONFIG_FILE,
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
];

/// Exports the checkpoint at `src` (a checkpoint directory, or a run directory: its best, else
/// latest, checkpoint) to `out`. A LoRA checkpoint needs `merge`: its adapters are folded into
/// the base weights. The directory appears whole or not at all.
pub fn export(src: &Path, out: &Path, merge: bool) -> Result<PathBuf> {
    let loaded = sample::load(src, Device::Cpu)?;
    let model = &loaded.config.model;
    let arch =
        arch_for(model).map_err(|why| anyhow!("cannot export to Hugging Face format: {why}"))?;
    let weights = trainer_weights(&loaded, merge)?;
    check_destination(out)?;
    let name = out
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: OUT_DIR needs a final directory name", out.display()))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (tokenizer_json, tokenizer_config) =
        tokenizer::files(&loaded.tokenizer, model.max_seq_len)?;
    let config = config_json(arch, model, loaded.tokenizer.eot_id());
    checkpoint::write_atomically(&parent, name, |dir| {
        write_safetensors(&dir.join(WEIGHTS_FILE), arch, model, &weights)?;
        std::fs::write(
            dir.join(CONFIG_FILE),
            serde_json::to_string_pretty(&config)?,
        )?;
        std::fs::write(dir.join(TOKENIZER_FILE), &tokenizer_json)?;
        std::fs::write(dir.join(TOKENIZER_CONFIG_FILE), &tokenizer_config)?;
        Ok(())
    })
}

/// The model's weights by Trainyard name: as trained, or with LoRA adapters merged.
fn trainer_weights(loaded: &LoadedModel, merge: bool) -> Result<HashMap<String, Tensor>> {
    match (&loaded.config.training.lora, merge) {
        (Some(lora), true) => Ok(lora::merged_weights(&loaded.varmap, lora)?),
        (Some(_), false) => bail!(
            "{} holds LoRA adapters: pass --merge to fold them into the base weights \
             (the Hugging Face layouts written here have no adapter tensors)",
            loaded.dir.display()
        ),
        (None, _) => Ok(checkpoint::varmap_tensors(&loaded.varmap)?),
    }
}

/// Refuses an existing `out` that holds anything an export does not write, so an export never
/// replaces a directory of other files.
fn check_destination(out: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(out) else {
        if out.exists() {
            bail!("{}: exists and is not a directory", out.display());
        }
        return Ok(());
    };
    for entry in entries {
        let name = entry?.file_name();
        if !EXPORT_FILES.iter().any(|f| name == *f) {
            bail!(
                "{}: not empty (it holds {}); choose a new directory or an earlier export",
                out.display(),
                name.to_string_lossy()
            );
        }
    }
    Ok(())
}

/// `config.json` as `transformers` reads it for `arch`.
pub fn config_json(arch: Arch, m: &ModelConfig, eot: u32) -> Value {
    let mut c = match arch {
        Arch::Gpt2 => json!({
            "vocab_size": m.vocab_size,
            "n_positions": m.max_seq_len,
            "n_embd": m.d_model,
            "n_layer": m.n_layers,
            "n_head": m.n_heads,
            "n_inner": m.d_ff,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": m.norm_eps,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "scale_attn_weights": true,
        }),
        Arch::Llama | Arch::Mixtral => json!({
            "vocab_size": m.vocab_size,
            "hidden_size": m.d_model,
            "intermediate_size": m.d_ff,
            "num_hidden_layers": m.n_layers,
            "num_attention_heads": m.n_heads,
            "num_key_value_heads": m.n_heads,
            "head_dim": m.d_model / m.n_heads,
            "hidden_act": "silu",
            "max_position_embeddings": m.max_seq_len,
            "rms_norm_eps": m.norm_eps,
            "rope_theta": m.rope_theta,
            "rope_scaling": null,
            "attention_dropout": 0.0,
        }),
    };
    let obj = c.as_object_mut();
    if let Some(obj) = obj {
        obj.insert("architectures".into(), json!([arch.class()]));
        obj.insert("model_type".into(), json!(arch.model_type()));
        obj.insert("tie_word_embeddings".into(), json!(m.tie_embeddings));
        obj.insert("initializer_range".into(), json!(m.init_std));
        obj.insert("bos_token_id".into(), json!(eot));
        obj.insert("eos_token_id".into(), json!(eot));
        obj.insert("torch_dtype".into(), json!("float32"));
        obj.insert("use_cache".into(), json!(true));
        match (arch, &m.moe) {
            (Arch::Llama, _) => {
                obj.insert("attention_bias".into(), json!(m.bias));
                obj.insert("mlp_bias".into(), json!(m.bias));
            }
            (Arch::Mixtral, Some(moe)) => {
                obj.insert("num_local_experts".into(), json!(moe.num_experts));
                obj.insert("num_experts_per_tok".into(), json!(moe.top_k));
                obj.insert("router_aux_loss_coef".into(), json!(moe.aux_loss_weight));
                obj.insert("output_router_logits".into(), json!(false));
                obj.insert("router_jitter_noise".into(), json!(0.0));
                obj.insert("sliding_window".into(), json!(null));
            }
            _ => {}
        }
    }
    c
}

/// Writes the `arch` tensors, f32, with the `{"format": "pt"}` metadata `transformers` checks.
fn write_safetensors(
    path: &Path,
    arch: Arch,
    model: &ModelConfig,
    weights: &HashMap<String, Tensor>,
) -> Result<()> {
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for p in pieces(arch, model) {
        let t = match &p.source {
            Some(name) => {
                let t = weights
                    .get(name)
                    .with_context(|| format!("the checkpoint has no `{name}`"))?;
                let t = match p.rows {
                    Some((start, n)) => t.narrow(0, start, n)?,
                    None => t.clone(),
                };
                if p.transpose {
                    t.t()?
                } else {
                    t
                }
            }
            None => Tensor::zeros(p.shape.as_slice(), DType::F32, &Device::Cpu)?,
        };
        if t.dims() != p.shape.as_slice() {
            bail!(
                "`{}` has shape {:?}, expected {:?}",
                p.hf,
                t.dims(),
                p.shape
            );
        }
        let values: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.push((p.hf, p.shape, bytes));
    }
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.as_str(), v))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::tensor::serialize_to_file(views, Some(metadata), path)?;
    Ok(())
}
