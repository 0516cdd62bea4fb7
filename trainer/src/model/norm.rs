//! LayerNorm (GPT-2, with or without bias) and RMSNorm (LLaMA) over the model dim.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use crate::config::{ModelConfig, NormKind};
use crate::kernels;

#[derive(Debug, Clone)]
pub struct Norm {
    kind: NormKind,
    /// (d,)
    weight: Tensor,
    /// (d,), LayerNorm with bias only.
    bias: Option<Tensor>,
    eps: f64,
}

impl Norm {
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(cfg.d_model, "weight", Init::Const(1.0))?;
        let bias = if cfg.bias && cfg.norm == NormKind::LayerNorm {
            Some(vb.get_with_hints(cfg.d_model, "bias", Init::Const(0.0))?)
        } else {
            None
        };
        Ok(Norm {
            kind: cfg.norm,
            weight,
            bias,
            eps: cfg.norm_eps,
        })
    }
}

impl Norm {
    /// The norm as a step of a fused residual branch (`kernels::residual`): LayerNorm with a
    /// bias only.
    pub fn step(&self) -> Result<Option<Box<dyn kernels::Step>>> {
        match (self.kind, &self.bias) {
            (NormKind::LayerNorm, Some(b)) => {
                Ok(Some(kernels::layer_norm_step(&self.weight, b, self.eps)?))
            }
            _ => Ok(None),
        }
    }
}

impl Module for Norm {
    /// (.., d) → (.., d)
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.kind {
            NormKind::LayerNorm => {
                kernels::layer_norm(x, &self.weight, self.bias.as_ref(), self.eps)
            }
            NormKind::RmsNorm => kernels::rms_norm(x, &self.weight, self.eps),
        }
    }
}
