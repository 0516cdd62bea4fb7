//! Hugging Face `transformers` checkpoints in and out: `trainyard export --format hf` writes a
//! directory `from_pretrained` loads, and `training.init_from: hf:PATH` starts from one.
//!
//! Which architecture a model is, and where each of its tensors goes, is decided here once
//! ([`arch_for`], [`pieces`]); export and import walk the same list in opposite directions.
//!
//! | Trainyard model | transformers class |
//! |---|---|
//! | learned positions, LayerNorm, GELU, dense | `GPT2LMHeadModel` (Conv1D weights stored (in, out)) |
//! | RoPE, RMSNorm, SwiGLU, dense | `LlamaForCausalLM` (q/k/v and gate/up split) |
//! | RoPE, RMSNorm, SwiGLU, MoE in every block, top-k ≥ 2, no drops | `MixtralForCausalLM` |

pub mod export;
pub mod import;
pub mod tokenizer;

use crate::config::{Activation, ModelConfig, NormKind, PositionKind};

/// The `hf:` prefix of `training.init_from` and `training.dpo.reference`.
pub const PREFIX: &str = "hf:";
pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// A `transformers` architecture a Trainyard model maps onto exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Gpt2,
    Llama,
    Mixtral,
}

impl Arch {
    /// The class name in `config.json`'s `architectures`.
    pub fn class(self) -> &'static str {
        match self {
            Arch::Gpt2 => "GPT2LMHeadModel",
            Arch::Llama => "LlamaForCausalLM",
            Arch::Mixtral => "MixtralForCausalLM",
        }
    }

    /// `config.json`'s `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Gpt2 => "gpt2",
            Arch::Llama => "llama",
            Arch::Mixtral => "mixtral",
        }
    }
}

/// The architecture `cfg` is, or why it is none of them (in words, naming the config keys).
pub fn arch_for(cfg: &ModelConfig) -> Result<Arch, String> {
    use Activation::*;
    use NormKind::*;
    use PositionKind::*;
    if let Some(pattern) = &cfg.layer_pattern {
        return Err(format!(
            "a hybrid stack (model.layer_pattern {pattern}) has no transformers architecture here"
        ));
    }
    let shape = |c: &ModelConfig| {
        format!(
            "this model has model.position {}, model.norm {}, model.activation {}",
            word(&c.position),
            word(&c.norm),
            word(&c.activation)
        )
    };
    match (cfg.position, cfg.norm, cfg.activation, &cfg.moe) {
        (Learned, LayerNorm, Gelu, None) => Ok(Arch::Gpt2),
        (Learned, LayerNorm, Gelu, Some(_)) => Err(
            "GPT-2 has no Mixture-of-Experts layers (model.moe is set); as \
                 MixtralForCausalLM it would need model.position rope, model.norm rmsnorm and \
                 model.activation swiglu, with MoE in every block (model.moe.every_n_layers 1), \
                 model.moe.capacity_factor 0, model.moe.top_k 2 or more, no shared expert and \
                 model.bias false"
                .to_string(),
        ),
        (Rope, RmsNorm, Swiglu, None) => Ok(Arch::Llama),
        (Rope, RmsNorm, Swiglu, Some(moe)) => {
            let refuse = |why: String| Err(format!("MixtralForCausalLM: {why}"));
            if moe.every_n_layers != 1 {
                return refuse(format!(
                    "every block is MoE there, model.moe.every_n_layers is {}",
                    moe.every_n_layers
                ));
            }
            if moe.shared_expert {
                return refuse("it has no shared expert (model.moe.shared_expert)".into());
            }
            if moe.capacity_factor > 0.0 {
                return refuse(
                    "it never drops tokens, model.moe.capacity_factor must be 0".to_string(),
                );
            }
            if moe.top_k < 2 {
                return refuse(
                    "it renormalizes a single expert's gate to 1 while this model keeps the \
                     router probability (model.moe.top_k is 1)"
                        .to_string(),
                );
            }
            if cfg.bias {
                return refuse("it has no bias terms (model.bias is true)".to_string());
            }
            Ok(Arch::Mixtral)
        }
        _ => Err(format!(
            "GPT2LMHeadModel needs learned positions, layernorm and gelu; LlamaForCausalLM and \
             MixtralForCausalLM need rope, rmsnorm and swiglu; {}",
            shape(cfg)
        )),
    }
}

/// A config enum as written in YAML.
fn word<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// One tensor of the Hugging Face checkpoint and where its values are in the Trainyard model.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    /// Name in `model.safetensors`.
    pub hf: String,
    /// The Trainyard variable; `None` for a tensor of zeros (a GPT-2 bias the model lacks).
    pub source: Option<String>,
    /// Rows (first, count) of the Trainyard tensor: q/k/v of `c_attn`, gate/up of `c_fc`.
    pub rows: Option<(usize, usize)>,
    /// Stored transposed, (in, out): GPT-2's Conv1D layers.
    pub transpose: bool,
    /// Shape in the Hugging Face file.
    pub shape: Vec<usize>,
}

fn piece(hf: String, source: Option<String>, shape: &[usize]) -> Piece {
    Piece {
        hf,
        source,
        rows: None,
        transpose: false,
        shape: shape.to_vec(),
    }
}

/// Every tensor of the `arch` checkpoint of `cfg`, in a fixed order.
pub fn pieces(arch: Arch, cfg: &ModelConfig) -> Vec<Piece> {
    let (v, d, f, t) = (cfg.vocab_size, cfg.d_model, cfg.d_ff, cfg.max_seq_len);
    let mut out = Vec::new();
    match arch {
        Arch::Gpt2 => {
            let src = |name: String, is_bias: bool| (!is_bias || cfg.bias).then_some(name);
            out.push(piece(
                "transformer.wte.weight".into(),
                Some("wte.weight".into()),
                &[v, d],
            ));
            out.push(piece(
                "transformer.wpe.weight".into(),
                Some("wpe.weight".into()),
                &[t, d],
            ));
            for i in 0..cfg.n_layers {
                let (p, h) = (format!("transformer.h.{i}"), format!("h.{i}"));
                let conv = |name: &str, n_in: usize, n_out: usize| {
                    [
                        Piece {
                            transpose: true,
                            ..piece(
                                format!("{p}.{name}.weight"),
                                Some(format!("{h}.{name}.weight")),
                                &[n_in, n_out],
                            )
                        },
                        piece(
                            format!("{p}.{name}.bias"),
                            src(format!("{h}.{name}.bias"), true),
                            &[n_out],
                        ),
                    ]
                };
                let norm = |name: &str| {
                    [
                        piece(
                            format!("{p}.{name}.weight"),
                            Some(format!("{h}.{name}.weight")),
                            &[d],
                        ),
                        piece(
                            format!("{p}.{name}.bias"),
                            src(format!("{h}.{name}.bias"), true),
                            &[d],
                        ),
                    ]
                };
                out.extend(norm("ln_1"));
                out.extend(conv("attn.c_attn", d, 3 * d));
                out.extend(conv("attn.c_proj", d, d));
                out.extend(norm("ln_2"));
                out.extend(conv("mlp.c_fc", d, f));
                out.extend(conv("mlp.c_proj", f, d));
            }
            out.push(piece(
                "transformer.ln_f.weight".into(),
                Some("ln_f.weight".into()),
                &[d],
            ));
            out.push(piece(
                "transformer.ln_f.bias".into(),
                src("ln_f.bias".into(), true),
                &[d],
            ));
        }
        Arch::Llama | Arch::Mixtral => {
            out.push(piece(
                "model.embed_tokens.weight".into(),
                Some("wte.weight".into()),
                &[v, d],
            ));
            for i in 0..cfg.n_layers {
                let (p, h) = (format!("model.layers.{i}"), format!("h.{i}"));
                // A block of rows of one Trainyard linear layer (weight and, with bias, bias).
                let split =
                    |out: &mut Vec<Piece>, hf: &str, ty: &str, rows: (usize, usize), n_in| {
                        out.push(Piece {
                            rows: Some(rows),
                            ..piece(
                                format!("{p}.{hf}.weight"),
                                Some(format!("{h}.{ty}.weight")),
                                &[rows.1, n_in],
                            )
                        });
                        if cfg.bias {
                            out.push(Piece {
                                rows: Some(rows),
                                ..piece(
                                    format!("{p}.{hf}.bias"),
                                    Some(format!("{h}.{ty}.bias")),
                                    &[rows.1],
                                )
                            });
                        }
                    };
                out.push(piece(
                    format!("{p}.input_layernorm.weight"),
                    Some(format!("{h}.ln_1.weight")),
                    &[d],
                ));
                split(&mut out, "self_attn.q_proj", "attn.c_attn", (0, d), d);
                split(&mut out, "self_attn.k_proj", "attn.c_attn", (d, d), d);
                split(&mut out, "self_attn.v_proj", "attn.c_attn", (2 * d, d), d);
                split(&mut out, "self_attn.o_proj", "attn.c_proj", (0, d), d);
                out.push(piece(
                    format!("{p}.post_attention_layernorm.weight"),
                    Some(format!("{h}.ln_2.weight")),
                    &[d],
                ));
                match (&cfg.moe, arch) {
                    (Some(moe), Arch::Mixtral) => {
                        let m = format!("{p}.block_sparse_moe");
                        out.push(piece(
                            format!("{m}.gate.weight"),
                            Some(format!("{h}.mlp.router.weight")),
                            &[moe.num_experts, d],
                        ));
                        for e in 0..moe.num_experts {
                            let (x, ex) =
                                (format!("{m}.experts.{e}"), format!("{h}.mlp.experts.{e}"));
                            for (name, rows) in [("w1", 0), ("w3", f)] {
                                out.push(Piece {
                                    rows: Some((rows, f)),
                                    ..piece(
                                        format!("{x}.{name}.weight"),
                                        Some(format!("{ex}.c_fc.weight")),
                                        &[f, d],
                                    )
                                });
                            }
                            out.push(piece(
                                format!("{x}.w2.weight"),
                                Some(format!("{ex}.c_proj.weight")),
                                &[d, f],
                            ));
                        }
                    }
                    _ => {
                        split(&mut out, "mlp.gate_proj", "mlp.c_fc", (0, f), d);
                        split(&mut out, "mlp.up_proj", "mlp.c_fc", (f, f), d);
                        split(&mut out, "mlp.down_proj", "mlp.c_proj", (0, d), f);
                    }
                }
            }
            out.push(piece(
                "model.norm.weight".into(),
                Some("ln_f.weight".into()),
                &[d],
            ));
        }
    }
    if !cfg.tie_embeddings {
        out.push(piece(
            "lm_head.weight".into(),
            Some("lm_head.weight".into()),
            &[v, d],
        ));
    }
    // Row blocks covering a whole Trainyard tensor are plain copies.
    for p in &mut out {
        if p.rows
            .is_some_and(|(start, n)| start == 0 && Some(n) == full_rows(cfg, p))
        {
            p.rows = None;
        }
    }
    out
}

/// Rows of the Trainyard tensor a piece comes from, when it is one of the split layers.
fn full_rows(cfg: &ModelConfig, p: &Piece) -> Option<usize> {
    let src = p.source.as_deref()?;
    Some(if src.contains("c_attn") {
        3 * cfg.d_model
    } else if src.contains("c_fc") {
        crate::model::lora::mlp_in_rows(cfg)
    } else {
        return Some(p.shape[0]);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MoeConfig;

    fn llama() -> ModelConfig {
        ModelConfig {
            position: PositionKind::Rope,
            norm: NormKind::RmsNorm,
            activation: Activation::Swiglu,
            bias: false,
            tie_embeddings: false,
            ..ModelConfig::default()
        }
    }

    #[test]
    fn each_model_shape_maps_to_its_architecture_or_is_refused_with_the_reason() {
        assert_eq!(arch_for(&ModelConfig::default()), Ok(Arch::Gpt2));
        assert_eq!(arch_for(&llama()), Ok(Arch::Llama));
        let mixtral = ModelConfig {
            moe: Some(MoeConfig::default()),
            ..llama()
        };
        assert_eq!(arch_for(&mixtral), Ok(Arch::Mixtral));

        let mixed = ModelConfig {
            position: PositionKind::Rope,
            ..ModelConfig::default()
        };
        let err = arch_for(&mixed).unwrap_err();
        assert!(
            err.contains("model.position rope, model.norm layernorm"),
            "{err}"
        );
        let top1 = ModelConfig {
            moe: Some(MoeConfig {
                top_k: 1,
                ..MoeConfig::default()
            }),
            ..llama()
        };
        assert!(arch_for(&top1)
            .unwrap_err()
            .contains("model.moe.top_k is 1"));
        let sparse = ModelConfig {
            moe: Some(MoeConfig {
                every_n_layers: 2,
                ..MoeConfig::default()
            }),
            ..llama()
        };
        assert!(arch_for(&sparse)
            .unwrap_err()
            .contains("every_n_layers is 2"));
        let gpt_moe = ModelConfig {
            moe: Some(MoeConfig::default()),
            ..ModelConfig::default()
        };
        let why = arch_for(&gpt_moe).unwrap_err();
        assert!(why.contains("GPT-2 has no Mixture-of-Experts"), "{why}");
        // It says what would make the model exportable as Mixtral.
        assert!(
            why.contains("MixtralForCausalLM") && why.contains("model.position rope"),
            "{why}"
        );
    }

    #[test]
    fn llama_pieces_split_the_fused_projections_into_row_blocks() {
        let cfg = llama();
        let ps = pieces(Arch::Llama, &cfg);
        let k = ps
            .iter()
            .find(|p| p.hf == "model.layers.1.self_attn.k_proj.weight")
            .unwrap();
        assert_eq!(k.source.as_deref(), Some("h.1.attn.c_attn.weight"));
        assert_eq!(k.rows, Some((64, 64)));
        let up = ps
            .iter()
            .find(|p| p.hf == "model.layers.0.mlp.up_proj.weight")
            .unwrap();
        assert_eq!(up.rows, Some((256, 256)));
        let o = ps
            .iter()
            .find(|p| p.hf == "model.layers.0.self_attn.o_proj.weight")
            .unwrap();
        assert_eq!(o.rows, None, "a whole tensor is a plain copy");
        assert!(ps.iter().any(|p| p.hf == "lm_head.weight"), "untied head");
    }
}
