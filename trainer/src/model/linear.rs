//! A linear layer, y = x·Wᵀ + b, over the last dim of any input, optionally with LoRA adapters.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use super::lora::Adapter;
use super::DropoutRng;
use crate::config::LoraConfig;
use crate::kernels;

#[derive(Debug, Clone)]
pub struct Linear {
    /// (out, in), PyTorch layout.
    weight: Tensor,
    /// (out,)
    bias: Option<Tensor>,
    /// Low-rank updates beside the (then frozen) weight.
    adapter: Option<Adapter>,
}

impl Linear {
    pub fn new(in_dim: usize, out_dim: usize, bias: bool, vb: VarBuilder) -> Result<Self> {
        // Placeholder init; `init_weights` sets the real, seeded values.
        let weight = vb.get_with_hints(
            (out_dim, in_dim),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: 0.02,
            },
        )?;
        let bias = if bias {
            Some(vb.get_with_hints(out_dim, "bias", Init::Const(0.0))?)
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            adapter: None,
        })
    }

    /// A bias-free layer on an existing (out, in) weight, e.g. an output head tied to the
    /// token embedding table (the same variable, so both uses add to its gradient).
    pub fn tied(weight: &Tensor) -> Self {
        Linear {
            weight: weight.clone(),
            bias: None,
            adapter: None,
        }
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Weight and bias, when the layer has no adapter (so it is x·Wᵀ + b and nothing more).
    pub fn plain(&self) -> Option<(&Tensor, Option<&Tensor>)> {
        match self.adapter {
            Some(_) => None,
            None => Some((&self.weight, self.bias.as_ref())),
        }
    }

    /// Adds LoRA adapters for `parts` (target names) under `vb`, the layer's own path.
    pub fn adapt(&mut self, lora: &LoraConfig, parts: &[&str], vb: &VarBuilder) -> Result<()> {
        if parts.is_empty() {
            return Ok(());
        }
        let (out_dim, in_dim) = self.weight.dims2()?;
        self.adapter = Some(Adapter::new(lora, parts, in_dim, out_dim, vb)?);
        Ok(())
    }

    /// The same layer without its adapters (sharing the weights): the base model.
    pub fn without_adapter(&self) -> Self {
        Linear {
            adapter: None,
            ..self.clone()
        }
    }

    /// (.., in) → (.., out). With an rng (training), the adapters' input gets LoRA dropout.
    pub fn forward_t(&self, x: &Tensor, rng: Option<&mut DropoutRng>) -> Result<Tensor> {
        let y = kernels::linear(x, &self.weight, self.bias.as_ref())?;
        match &self.adapter {
            Some(adapter) => y + adapter.forward(x, rng)?,
            None => Ok(y),
        }
    }

    /// tanh-GELU of the layer's output (a GELU MLP's first layer): one op when there is no
    /// adapter (see `kernels::linear_gelu`).
    pub fn forward_gelu_t(&self, x: &Tensor, rng: Option<&mut DropoutRng>) -> Result<Tensor> {
        match &self.adapter {
            Some(_) => kernels::gelu_tanh(&self.forward_t(x, rng)?),
            None => kernels::linear_gelu(x, &self.weight, self.bias.as_ref()),
        }
    }
}

impl Module for Linear {
    /// (.., in) → (.., out)
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_t(x, None)
    }
}
