//! A linear layer, y = x·Wᵀ + b, over the last dim of any input.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use crate::kernels;

#[derive(Debug, Clone)]
pub struct Linear {
    /// (out, in), PyTorch layout.
    weight: Tensor,
    /// (out,)
    bias: Option<Tensor>,
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
        Ok(Linear { weight, bias })
    }

    /// A bias-free layer on an existing (out, in) weight, e.g. an output head tied to the
    /// token embedding table (the same variable, so both uses add to its gradient).
    pub fn tied(weight: &Tensor) -> Self {
        Linear {
            weight: weight.clone(),
            bias: None,
        }
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Module for Linear {
    /// (.., in) → (.., out)
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        kernels::linear(x, &self.weight, self.bias.as_ref())
    }
}
