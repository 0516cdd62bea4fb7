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

use std::fmt;
use std::str::FromStr;

use super::choices::serde_as_str;
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

impl BlockKind {
    /// The block's letters: its mixer's, then its MLP's.
    fn letters(self) -> impl Iterator<Item = char> {
        let mixer = self.mixer.map(|m| match m {
            MixerKind::Attention => 'A',
            MixerKind::Mamba => 'M',
        });
        let mlp = self.mlp.map(|f| match f {
            FfnKind::Dense => 'F',
            FfnKind::Moe => 'E',
        });
        mixer.into_iter().chain(mlp)
    }
}

/// `model.layer_pattern` parsed: the blocks in order. Written back as the letters it was read
/// from (the grammar gives each list of blocks one spelling).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerPattern(pub(super) Vec<BlockKind>);

impl LayerPattern {
    pub fn blocks(&self) -> &[BlockKind] {
        &self.0
    }

    /// The 1-based position of the first `E` (MoE MLP) letter, if any.
    fn first_moe_letter(&self) -> Option<usize> {
        let mut at = 0;
        for block in &self.0 {
            at += block.letters().count();
            if block.mlp == Some(FfnKind::Moe) {
                return Some(at);
            }
        }
        None
    }
}

impl std::ops::Deref for LayerPattern {
    type Target = [BlockKind];

    fn deref(&self) -> &[BlockKind] {
        &self.0
    }
}

impl fmt::Display for LayerPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0
            .iter()
            .flat_map(|b| b.letters())
            .try_for_each(|c| write!(f, "{c}"))
    }
}

const KEY: &str = "model.layer_pattern";
const LETTERS: &str = "A (attention), M (Mamba-2), F (dense MLP), E (MoE MLP)";

/// Parses the letters (see the module docs); errors name the 1-based position of the letter.
/// Whether an `E` has a model.moe to shape it is checked with the rest of the config
/// ([`super::Config::validate`]).
impl FromStr for LayerPattern {
    type Err = String;

    fn from_str(pattern: &str) -> Result<Self, Self::Err> {
        if pattern.is_empty() {
            return Err(format!("must have at least one letter: {LETTERS}"));
        }
        let mut blocks: Vec<BlockKind> = Vec::new();
        // Whether the last block has a mixer and no MLP yet, so an MLP letter joins it.
        let mut open = false;
        for (i, c) in pattern.chars().enumerate() {
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
                'E' => FfnKind::Moe,
                other => {
                    return Err(format!(
                        "position {}: unknown letter {other:?}; the letters are {LETTERS}",
                        i + 1
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
        Ok(LayerPattern(blocks))
    }
}

serde_as_str!(LayerPattern);

impl ModelConfig {
    /// The blocks in order: model.layer_pattern's, or attention + MLP per layer (MoE where
    /// model.moe.every_n_layers puts it) without one.
    pub fn blocks(&self) -> Vec<BlockKind> {
        if let Some(pattern) = &self.layer_pattern {
            return pattern.blocks().to_vec();
        }
        (0..self.n_layers)
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
            .collect()
    }

    /// Whether any block is a Mamba-2 mixer.
    pub fn has_mamba(&self) -> bool {
        self.layer_pattern
            .as_ref()
            .is_some_and(|p| p.iter().any(|b| b.mixer == Some(MixerKind::Mamba)))
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
            if let (Some(at), None) = (pattern.first_moe_letter(), &m.moe) {
                return Err(ConfigError::invalid(
                    KEY,
                    format!(
                        "position {at} is E (MoE MLP), but model.moe is not set; add a \
                         model.moe section or use F (dense MLP)"
                    ),
                ));
            }
            if pattern.len() != m.n_layers {
                return Err(ConfigError::invalid(
                    KEY,
                    format!(
                        "\"{pattern}\" describes {} blocks, but model.n_layers is {}",
                        pattern.len(),
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
        p.parse::<LayerPattern>()
            .unwrap()
            .iter()
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
    fn a_pattern_is_written_back_as_the_letters_it_was_read_from() {
        for p in ["AF", "MFMEAF", "MMAF", "MFF", "E", "FFA", "AEMEM"] {
            assert_eq!(p.parse::<LayerPattern>().unwrap().to_string(), p);
        }
    }

    #[test]
    fn errors_name_the_position_of_the_offending_letter() {
        let err = "MFAx".parse::<LayerPattern>().unwrap_err();
        assert!(err.starts_with("position 4: unknown letter 'x'"), "{err}");
        let err = "".parse::<LayerPattern>().unwrap_err();
        assert!(err.contains("at least one letter"), "{err}");
        let mut cfg = super::super::Config::default();
        cfg.model.n_layers = 3;
        cfg.model.layer_pattern = Some("MFMEAF".parse().unwrap());
        let err = cfg.validate().unwrap_err().to_string();
        assert!(
            err.starts_with("model.layer_pattern: position 4 is E") && err.contains("model.moe"),
            "{err}"
        );
    }
}
