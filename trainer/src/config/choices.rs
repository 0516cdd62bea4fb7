//! Settings that take one of a few spellings (`logging.progress`, `training.device`,
//! `training.lora.targets`): parsed into types once, when the config is read, and written back
//! in the spelling they were read in, so a stored `config.json` or `config.yaml` reads back
//! unchanged. A wrong spelling is a deserialisation error whose message the loader prefixes
//! with the key (`training.device: expected auto, cpu, cuda or cuda:N, got "gpu"`).

use std::fmt;
use std::str::FromStr;

/// Serde through the spelling: `Display` writes it, `FromStr` reads it and its error message
/// becomes the config error's (the loader adds the key).
macro_rules! serde_as_str {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <String as serde::Deserialize>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
pub(super) use serde_as_str;

/// `logging.progress`: whether the progress bar is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// When stderr is a terminal.
    #[default]
    Auto,
    Always,
    Never,
}

impl Progress {
    pub const ALL: [Progress; 3] = [Progress::Auto, Progress::Always, Progress::Never];

    pub fn as_str(self) -> &'static str {
        match self {
            Progress::Auto => "auto",
            Progress::Always => "always",
            Progress::Never => "never",
        }
    }

    /// Whether the bar is drawn when stderr `is_terminal`.
    pub fn shows(self, is_terminal: bool) -> bool {
        match self {
            Progress::Auto => is_terminal,
            Progress::Always => true,
            Progress::Never => false,
        }
    }
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Progress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Progress::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("must be auto, always or never, got \"{s}\""))
    }
}

serde_as_str!(Progress);

/// Where training runs, `training.device`: `auto`, `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The GPU when built with CUDA and one is present, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// A CUDA device: `cuda` (None, the first one) or `cuda:N` (Some(N)). The two are kept
    /// apart only so each is written back as it was spelled.
    Cuda(Option<usize>),
}

impl DeviceSpec {
    /// The CUDA ordinal asked for (`cuda` is 0); None for `auto` and `cpu`.
    pub fn cuda_ordinal(self) -> Option<usize> {
        match self {
            DeviceSpec::Cuda(n) => Some(n.unwrap_or(0)),
            DeviceSpec::Auto | DeviceSpec::Cpu => None,
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(None) => f.write_str("cuda"),
            DeviceSpec::Cuda(Some(n)) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(None)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(|n| DeviceSpec::Cuda(Some(n)))
                .ok_or_else(|| format!("expected auto, cpu, cuda or cuda:N, got \"{other}\"")),
        }
    }
}

serde_as_str!(DeviceSpec);

/// A projection `training.lora.targets` may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraTarget {
    /// The attention's query rows of `c_attn`.
    Q,
    /// Its key rows.
    K,
    /// Its value rows.
    V,
    /// The attention's output projection `c_proj`.
    O,
    /// A dense MLP's first projection (both gate and up for SwiGLU).
    MlpIn,
    /// A dense MLP's projection back to d_model.
    MlpOut,
    /// Every MoE expert's first projection (the shared expert's included).
    ExpertIn,
    /// Every MoE expert's projection back.
    ExpertOut,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 8] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::MlpIn,
        LoraTarget::MlpOut,
        LoraTarget::ExpertIn,
        LoraTarget::ExpertOut,
    ];

    /// The spelling in configs, also the adapter variables' suffix (`lora_a.q`).
    pub fn as_str(self) -> &'static str {
        match self {
            LoraTarget::Q => "q",
            LoraTarget::K => "k",
            LoraTarget::V => "v",
            LoraTarget::O => "o",
            LoraTarget::MlpIn => "mlp_in",
            LoraTarget::MlpOut => "mlp_out",
            LoraTarget::ExpertIn => "expert_in",
            LoraTarget::ExpertOut => "expert_out",
        }
    }

    /// Whether it adapts MoE experts (and so needs model.moe).
    pub fn is_expert(self) -> bool {
        matches!(self, LoraTarget::ExpertIn | LoraTarget::ExpertOut)
    }

    /// Whether it adapts dense MLPs (and so needs a block that has one).
    pub fn is_dense_mlp(self) -> bool {
        matches!(self, LoraTarget::MlpIn | LoraTarget::MlpOut)
    }

    /// The spellings, comma-separated, for messages.
    pub fn choices() -> String {
        LoraTarget::ALL.map(LoraTarget::as_str).join(", ")
    }
}

impl fmt::Display for LoraTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LoraTarget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LoraTarget::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown projection \"{s}\"; the choices are {}",
                    LoraTarget::choices()
                )
            })
    }
}

serde_as_str!(LoraTarget);
