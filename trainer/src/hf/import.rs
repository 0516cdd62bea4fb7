//! `training.init_from: hf:PATH`: a local Hugging Face GPT-2, Llama or Mixtral directory as the
//! starting weights and tokenizer. Its `config.json` fixes the model's shape; what it does not
//! say (dropout, init_std, MoE loss weights) keeps the run's own settings.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use serde_json::Value;

use super::{arch_for, pieces, Arch, CONFIG_FILE, PREFIX, WEIGHTS_FILE};
use crate::config::{Activation, ModelConfig, MoeConfig, NormKind, PositionKind};

/// `hf:PATH` → `PATH`; `None` for anything else.
pub fn hf_path(spec: &str) -> Option<PathBuf> {
    spec.strip_prefix(PREFIX).map(|p| PathBuf::from(p.trim()))
}

/// One `config.json` field, with errors that say which and why.
struct Fields<'a> {
    json: &'a Value,
    file: PathBuf,
}

impl Fields<'_> {
    fn raw(&self, key: &str) -> Option<&Value> {
        self.json.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str) -> Result<usize> {
        self.raw(key)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .with_context(|| {
                format!(
                    "{}: `{key}` is missing or not a whole number",
                    self.file.display()
                )
            })
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.raw(key) {
            None => Ok(default),
            Some(_) => self.usize(key),
        }
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.raw(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .with_context(|| format!("{}: `{key}` is not a number", self.file.display())),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> bool {
        self.raw(key).and_then(Value::as_bool).unwrap_or(default)
    }

    fn str_or<'s>(&'s self, key: &str, default: &'s str) -> &'s str {
        self.raw(key).and_then(Value::as_str).unwrap_or(default)
    }

    fn refuse(&self, why: impl std::fmt::Display) -> anyhow::Error {
        anyhow::anyhow!("{}: {why}", self.file.display())
    }
}

/// The architecture and Trainyard model config of the checkpoint in `dir`; settings the
/// checkpoint does not fix come from `base`.
pub fn model_config(dir: &Path, base: &ModelConfig) -> Result<(Arch, ModelConfig)> {
    let file = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "reading {} (is it a Hugging Face model directory?)",
            file.display()
        )
    })?;
    let json: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
    let f = Fields { json: &json, file };
    let model_type = f.str_or("model_type", "");
    let cfg = match model_type {
        "gpt2" => {
            let d = f.usize("n_embd")?;
            let act = f.str_or("activation_function", "gelu_new");
            // Three names of the same tanh approximation the trainer computes.
            if !matches!(act, "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") {
                return Err(f.refuse(format!(
                    "activation_function {act} is not the tanh GELU this trainer computes"
                )));
            }
            if f.bool_or("scale_attn_by_inverse_layer_idx", false) {
                return Err(f.refuse("scale_attn_by_inverse_layer_idx is not supported"));
            }
            ModelConfig {
                vocab_size: f.usize("vocab_size")?,
                d_model: d,
                n_layers: f.usize("n_layer")?,
                n_heads: f.usize("n_head")?,
                d_ff: f.usize_or("n_inner", 4 * d)?,
                max_seq_len: f.usize("n_positions")?,
                position: PositionKind::Learned,
                norm: NormKind::LayerNorm,
                norm_eps: f.f64_or("layer_norm_epsilon", 1e-5)?,
                activation: Activation::Gelu,
                bias: true,
                tie_embeddings: f.bool_or("tie_word_embeddings", true),
                moe: None,
                ..base.clone()
            }
        }
        "llama" | "mixtral" => {
            let (d, heads) = (f.usize("hidden_size")?, f.usize("num_attention_heads")?);
            if f.usize_or("num_key_value_heads", heads)? != heads {
                return Err(f.refuse(
                    "grouped-query attention (num_key_value_heads below num_attention_heads) \
                     is not supported: every head needs its own keys and values here",
                ));
            }
            if heads == 0 || f.usize_or("head_dim", d / heads)? * heads != d {
                return Err(f.refuse("head_dim · num_attention_heads must equal hidden_size"));
            }
            if f.raw("rope_scaling").is_some() {
                return Err(f.refuse("rope_scaling is not supported (plain RoPE only)"));
            }
            if f.str_or("hidden_act", "silu") != "silu" {
                return Err(f.refuse("hidden_act must be silu (SwiGLU)"));
            }
            let attention_bias = f.bool_or("attention_bias", false);
            if attention_bias != f.bool_or("mlp_bias", false) {
                return Err(f.refuse(
                    "attention_bias and mlp_bias differ; this trainer has one bias switch \
                     (model.bias) for every projection",
                ));
            }
            let max_seq_len = f.usize("max_position_embeddings")?;
            let moe = if model_type == "mixtral" {
                if f.usize_or("sliding_window", max_seq_len)? < max_seq_len {
                    return Err(f.refuse("sliding-window attention is not supported"));
                }
                let defaults = base.moe.clone().unwrap_or_default();
                Some(MoeConfig {
                    num_experts: f.usize("num_local_experts")?,
                    top_k: f.usize("num_experts_per_tok")?,
                    every_n_layers: 1,
                    capacity_factor: 0.0,
                    aux_loss_weight: f.f64_or("router_aux_loss_coef", defaults.aux_loss_weight)?,
                    shared_expert: false,
                    ..defaults
                })
            } else {
                None
            };
            ModelConfig {
                vocab_size: f.usize("vocab_size")?,
                d_model: d,
                n_layers: f.usize("num_hidden_layers")?,
                n_heads: heads,
                d_ff: f.usize("intermediate_size")?,
                max_seq_len,
                position: PositionKind::Rope,
                rope_theta: f.f64_or("rope_theta", 10_000.0)?,
                norm: NormKind::RmsNorm,
                norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
                activation: Activation::Swiglu,
                bias: attention_bias,
                tie_embeddings: f.bool_or("tie_word_embeddings", false),
                moe,
                ..base.clone()
            }
        }
        other => {
            return Err(f.refuse(format!(
                "model_type \"{other}\" is not one this trainer reads (gpt2, llama, mixtral)"
            )))
        }
    };
    let arch = arch_for(&cfg).map_err(|why| f.refuse(why))?;
    Ok((arch, cfg))
}

/// Copies the weights of the checkpoint in `dir` into `varmap`, a model built for `cfg`
/// (from [`model_config`]); adapter variables are left alone.
pub fn load_weights(dir: &Path, cfg: &ModelConfig, varmap: &VarMap, device: &Device) -> Result<()> {
    let arch = arch_for(cfg).map_err(|why| anyhow::anyhow!(why))?;
    let path = dir.join(WEIGHTS_FILE);
    let file = candle_core::safetensors::load(&path, device)
        .with_context(|| format!("reading {}", path.display()))?;
    let all = pieces(arch, cfg);
    let data = varmap
        .data()
        .lock()
        .map_err(|_| anyhow::anyhow!("model variables are poisoned by a panicked thread"))?;
    for (name, var) in data.iter() {
        if crate::model::lora::is_adapter(name) {
            continue;
        }
        let mut mine: Vec<_> = all
            .iter()
            .filter(|p| p.source.as_deref() == Some(name))
            .collect();
        if mine.is_empty() {
            bail!(
                "{}: nothing in the {} layout holds `{name}`",
                path.display(),
                arch.class()
            );
        }
        mine.sort_by_key(|p| p.rows.map_or(0, |r| r.0));
        let mut blocks = Vec::with_capacity(mine.len());
        for p in mine {
            // The public GPT-2 files name the body's tensors without `transformer.`.
            let t = file
                .get(&p.hf)
                .or_else(|| p.hf.strip_prefix("transformer.").and_then(|n| file.get(n)))
                .with_context(|| format!("{}: no tensor `{}`", path.display(), p.hf))?;
            if t.dims() != p.shape.as_slice() {
                bail!(
                    "{}: `{}` has shape {:?}, config.json implies {:?}",
                    path.display(),
                    p.hf,
                    t.dims(),
                    p.shape
                );
            }
            blocks.push(if p.transpose {
                t.t()?.contiguous()?
            } else {
                t.clone()
            });
        }
        let t = if blocks.len() == 1 {
            blocks.remove(0)
        } else {
            Tensor::cat(&blocks, 0)?
        };
        if t.dims() != var.dims() {
            bail!(
                "{}: `{name}` comes to shape {:?}, the model expects {:?}",
                path.display(),
                t.dims(),
                var.dims()
            );
        }
        var.set(&t.to_dtype(var.dtype())?)?;
    }
    Ok(())
}
