//! A linear layer that flattens leading dimensions into one matmul (one GEMM instead of a
//! batched one over broadcast weights), for both the forward and the backward pass.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use super::{fused, fused_linear};

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

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let (lead, in_dim) = dims.split_at(dims.len() - 1);
        let out_dim = self.weight.dim(0)?;
        let x2 = x.reshape(((), in_dim[0]))?; // (N, in)
        let y = if fused::use_fused(&x2) && !super::autocast::is_active() {
            fused_linear::linear(&x2, &self.weight, self.bias.as_ref())? // (N, out)
        } else {
            let y = super::autocast::matmul(&x2, &self.weight.t()?)?; // (N, out)
            match &self.bias {
                Some(b) if fused::use_fused(&y) => fused::add_bias(&y, b)?,
                Some(b) => y.broadcast_add(b)?,
                None => y,
            }
        };
        let mut shape = lead.to_vec();
        shape.push(out_dim);
        y.reshape(shape)
    }
}
