//! The position-wise feed-forward network: GELU (GPT-2) or SwiGLU (LLaMA). MoE experts reuse it.

use candle_core::{Module, Result, Tensor, D};
use candle_nn::VarBuilder;

use super::{DropoutRng, Linear};
use crate::config::{Activation, LoraConfig, ModelConfig};
use crate::kernels;

#[derive(Debug, Clone)]
pub struct Mlp {
    /// d → d_ff (GELU) or d → 2·d_ff (SwiGLU: gate rows first, then up rows; one GEMM).
    c_fc: Linear,
    /// d_ff → d
    c_proj: Linear,
    activation: Activation,
    d_ff: usize,
}

impl Mlp {
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let (d, d_ff) = (cfg.d_model, cfg.d_ff);
        let fc_out = match cfg.activation {
            Activation::Gelu => d_ff,
            Activation::Swiglu => 2 * d_ff,
        };
        Ok(Mlp {
            c_fc: Linear::new(d, fc_out, cfg.bias, vb.pp("c_fc"))?,
            c_proj: Linear::new(d_ff, d, cfg.bias, vb.pp("c_proj"))?,
            activation: cfg.activation,
            d_ff,
        })
    }

    /// LoRA adapters on the input and/or output projection, as `inp` and `out` are targeted.
    pub fn adapt(
        &mut self,
        lora: &LoraConfig,
        inp: bool,
        out: bool,
        vb: &VarBuilder,
    ) -> Result<()> {
        if inp {
            self.c_fc.adapt(lora, &["in"], &vb.pp("c_fc"))?;
        }
        if out {
            self.c_proj.adapt(lora, &["out"], &vb.pp("c_proj"))?;
        }
        Ok(())
    }

    /// The same MLP without adapters (sharing the weights).
    pub fn without_adapters(&self) -> Self {
        Mlp {
            c_fc: self.c_fc.without_adapter(),
            c_proj: self.c_proj.without_adapter(),
            ..self.clone()
        }
    }

    /// (W_fc, b_fc, W_proj, b_proj) of a GELU MLP with biases and no adapters: the MLP is
    /// c_proj(gelu(c_fc(x))) and nothing more, so MoE experts can run as grouped ops.
    pub fn plain_gelu(&self) -> Option<[&Tensor; 4]> {
        match (self.activation, self.c_fc.plain()?, self.c_proj.plain()?) {
            (Activation::Gelu, (w_fc, Some(b_fc)), (w_proj, Some(b_proj))) => {
                Some([w_fc, b_fc, w_proj, b_proj])
            }
            _ => None,
        }
    }

    /// The MLP on `rows` rows as a step of a fused residual branch (`kernels::residual`): a
    /// GELU MLP with biases and no adapters only.
    pub fn step(&self, rows: usize) -> Result<Option<Box<dyn kernels::Step>>> {
        match self.plain_gelu() {
            Some(weights) => Ok(Some(kernels::gelu_mlp_step(weights, rows)?)),
            None => Ok(None),
        }
    }

    /// (.., d) → (.., d). With an rng (training), adapters get their dropout.
    pub fn forward_t(&self, x: &Tensor, mut rng: Option<&mut DropoutRng>) -> Result<Tensor> {
        if let Some(weights) = self.plain_gelu() {
            // One op on the fused CPU path (see `kernels::mlp`), the two layers' ops elsewhere.
            let rows = x.elem_count() / x.dim(D::Minus1)?.max(1);
            return kernels::gelu_mlp(x, &[weights], &[rows]); // (.., d)
        }
        let h = match self.activation {
            // tanh approximation, as GPT-2
            Activation::Gelu => self.c_fc.forward_gelu_t(x, rng.as_deref_mut())?, // (.., d_ff)
            Activation::Swiglu => {
                let h = self.c_fc.forward_t(x, rng.as_deref_mut())?; // (.., 2·d_ff)
                let gate = h.narrow(D::Minus1, 0, self.d_ff)?; // (.., d_ff)
                let up = h.narrow(D::Minus1, self.d_ff, self.d_ff)?;
                (gate.silu()? * up)?
            }
        };
        self.c_proj.forward_t(&h, rng) // (.., d)
    }
}

impl Module for Mlp {
    /// (.., d) → (.., d)
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_t(x, None)
    }
}
