//! LayerNorm and RMSNorm written from primitive ops: candle's fused versions have no backward.

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{Init, VarBuilder};

use super::{fused, fused_norm};
use crate::config::NormKind;

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
    pub fn new(kind: NormKind, dim: usize, eps: f64, bias: bool, vb: VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(dim, "weight", Init::Const(1.0))?;
        let bias = if bias && kind == NormKind::LayerNorm {
            Some(vb.get_with_hints(dim, "bias", Init::Const(0.0))?)
        } else {
            None
        };
        Ok(Norm {
            kind,
            weight,
            bias,
            eps,
        })
    }
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let (NormKind::LayerNorm, Some(bias)) = (self.kind, &self.bias) {
            if fused::use_fused(x) {
                // One pass each way instead of ~9 ops forward and ~25 backward.
                return fused_norm::layer_norm(x, &self.weight, bias, self.eps);
            }
        }
        let in_dtype = x.dtype();
        // Statistics in f32 at least, whatever the activations' dtype.
        let x = match in_dtype {
            DType::F64 | DType::F32 => x.clone(),
            _ => x.to_dtype(DType::F32)?,
        };
        let y = match self.kind {
            NormKind::LayerNorm => {
                let mean = x.mean_keepdim(D::Minus1)?; // (.., 1)
                let xc = x.broadcast_sub(&mean)?; // (.., d)
                let var = xc.sqr()?.mean_keepdim(D::Minus1)?; // (.., 1)
                xc.broadcast_div(&(var + self.eps)?.sqrt()?)?
            }
            NormKind::RmsNorm => {
                let ms = x.sqr()?.mean_keepdim(D::Minus1)?; // (.., 1)
                x.broadcast_div(&(ms + self.eps)?.sqrt()?)?
            }
        };
        let y = y.to_dtype(in_dtype)?.broadcast_mul(&self.weight)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}
