//! `model.layer_pattern`: the stack of a hybrid model as one string of letters.
//!
//! Grammar (one block after another, read left to right):
//!
//! ```text
//! pattern = block+
//! block   = mixer [mlp] | mlp
//! mixer   = "A" (causal self-attention) | "M" (Mamba-2)
//! mlp     = "F" (dense MLP) | "E" (Mixture-of-Experts MLP, shaped by model.moe)
//! ```
//!
//! A mixer takes the MLP letter that follows it into its block, so `MFMEAF` is three blocks
//! (Mamba + dense, Mamba + MoE, attention + dense), `MMAF` three (Mamba, Mamba, attention +
//! dense) and `MFF` two (Mamba + dense, dense alone). Every sublayer is pre-norm and residual:
//! x + mixer(norm(x)), then x + mlp(norm(x)).

use super::{ConfigError, ModelConfig};

/// What mixes information across positions in a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixerKind {
    Attention,
    Mamba,
}

/// The position-wise part of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnKind {
    Dense,
    Moe,
}

/// One residual block: a mixer, an MLP, or both (never neither).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockKind {
    pub mixer: Option<MixerKind>,
    pub mlp: Option<FfnKind>,
}

const KEY: &str = "model.layer_pattern";
const LETTERS: &str = "A (attention), M (Mamba-2), F (dense MLP), E (MoE MLP)";

/// Parses `pattern` (see the module docs); errors name the 1-based position of the letter.
pub fn parse(pattern: &str, has_moe: bool) -> Result<Vec<BlockKind>, ConfigError> {
    if pattern.is_empty() {
        return Err(ConfigError::invalid(
            KEY,
            format!("must have at least one letter: {LETTERS}"),
        ));
    }
    let mut blocks: Vec<BlockKind> = Vec::new();
    // Whether the last block has a mixer and no MLP yet, so an MLP letter joins it.
    let mut open = false;
    for (i, c) in pattern.chars().enumerate() {
        let at = i + 1;
        let mlp = match c {
            'A' | 'M' => {
                let mixer = if c == 'A' {
                    MixerKind::Attention
                } else {
                    MixerKind::Mamba
                };
                blocks.push(BlockKind {
                    mixer: Some(mixer),
                    mlp: None,
                });
                open = true;
                continue;
            }
            'F' => FfnKind::Dense,
            'E' if has_moe => FfnKind::Moe,
            'E' => {
                return Err(ConfigError::invalid(
                    KEY,
                    format!(
                        "position {at} is E (MoE MLP), but model.moe is not set; add a \
                         model.moe section or use F (dense MLP)"
                    ),
                ))
            }
            other => {
                return Err(ConfigError::invalid(
                    KEY,
                    format!("position {at}: unknown letter {other:?}; the letters are {LETTERS}"),
                ))
            }
        };
        match blocks.last_mut() {
            Some(last) if open => last.mlp = Some(mlp),
            _ => blocks.push(BlockKind {
                mixer: None,
                mlp: Some(mlp),
            }),
        }
        open = false;
    }
    Ok(blocks)
}

impl ModelConfig {
    /// The blocks in order: from model.layer_pattern, or attention + MLP per layer (MoE where
    /// model.moe.every_n_layers puts it) without one.
    pub fn blocks(&self) -> Result<Vec<BlockKind>, ConfigError> {
        if let Some(pattern) = &self.layer_pattern {
            return parse(pattern, self.moe.is_some());
        }
        Ok((0..self.n_layers)
            .map(|layer| {
                let moe = self
                    .moe
                    .as_ref()
                    .is_some_and(|m| (layer + 1).is_multiple_of(m.every_n_layers));
                BlockKind {
                    mixer: Some(MixerKind::Attention),
                    mlp: Some(if moe { FfnKind::Moe } else { FfnKind::Dense }),
                }
            })
            .collect())
    }

    /// Whether any block is a Mamba-2 mixer.
    pub fn has_mamba(&self) -> bool {
        self.layer_pattern
            .as_deref()
            .is_some_and(|p| p.contains('M'))
    }

    /// The Mamba-2 shape in force (model.mamba, or its defaults).
    pub fn mamba_or_default(&self) -> super::MambaConfig {
        self.mamba.clone().unwrap_or_default()
    }
}

impl super::Config {
    /// model.layer_pattern against model.n_layers and model.moe, and model.mamba's shape.
    pub(super) fn validate_hybrid(&self) -> Result<(), ConfigError> {
        let m = &self.model;
        if let Some(pattern) = &m.layer_pattern {
            let blocks = parse(pattern, m.moe.is_some())?;
            if blocks.len() != m.n_layers {
                return Err(ConfigError::invalid(
                    KEY,
                    format!(
                        "\"{pattern}\" describes {} blocks, but model.n_layers is {}",
                        blocks.len(),
                        m.n_layers
                    ),
                ));
            }
        }
        if m.mamba.is_none() && !m.has_mamba() {
            return Ok(());
        }
        let mamba = m.mamba_or_default();
        for (key, v) in [
            ("model.mamba.d_state", mamba.d_state),
            ("model.mamba.expand", mamba.expand),
            ("model.mamba.head_dim", mamba.head_dim),
            ("model.mamba.chunk_size", mamba.chunk_size),
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        if mamba.d_conv < 2 {
            return Err(ConfigError::invalid(
                "model.mamba.d_conv",
                format!(
                    "must be at least 2 (the current token and one before it), got {}",
                    mamba.d_conv
                ),
            ));
        }
        let inner = mamba.expand * m.d_model;
        if !inner.is_multiple_of(mamba.head_dim) {
            return Err(ConfigError::invalid(
                "model.mamba.head_dim",
                format!(
                    "must divide model.mamba.expand · model.d_model = {inner} ({inner} % {} = {})",
                    mamba.head_dim,
                    inner % mamba.head_dim
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(p: &str) -> Vec<(Option<MixerKind>, Option<FfnKind>)> {
        parse(p, true)
            .unwrap()
            .into_iter()
            .map(|b| (b.mixer, b.mlp))
            .collect()
    }

    #[test]
    fn a_mixer_takes_the_mlp_letter_after_it_and_a_lone_mlp_letter_is_a_block() {
        use FfnKind::*;
        use MixerKind::*;
        assert_eq!(
            kinds("MFMEAF"),
            vec![
                (Some(Mamba), Some(Dense)),
                (Some(Mamba), Some(Moe)),
                (Some(Attention), Some(Dense))
            ]
        );
        assert_eq!(
            kinds("MMAF"),
            vec![
                (Some(Mamba), None),
                (Some(Mamba), None),
                (Some(Attention), Some(Dense))
            ]
        );
        assert_eq!(
            kinds("MFF"),
            vec![(Some(Mamba), Some(Dense)), (None, Some(Dense))]
        );
        assert_eq!(kinds("E"), vec![(None, Some(Moe))]);
    }

    #[test]
    fn errors_name_the_position_of_the_offending_letter() {
        let err = parse("MFAx", true).unwrap_err().to_string();
        assert!(err.starts_with("model.layer_pattern: position 4"), "{err}");
        let err = parse("MFME", false).unwrap_err().to_string();
        assert!(
            err.contains("position 4 is E") && err.contains("model.moe"),
            "{err}"
        );
        let err = parse("", true).unwrap_err().to_string();
        assert!(err.contains("at least one letter"), "{err}");
    }
}
