//! SGD with momentum (optionally Nesterov) and L2 weight decay on `decay` parameters, with
//! PyTorch's semantics (`buf = μ·buf + g`, no dampening).

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};

use super::{
    assign, grad_f32, load_buffers, load_step, state_map, zeros_like_f32, Optimizer, Param,
};

pub struct Sgd {
    params: Vec<Param>,
    momentum: f64,
    nesterov: bool,
    weight_decay: f64,
    /// Momentum buffers (f32).
    buf: Vec<Tensor>,
    step: u64,
}

impl Sgd {
    pub fn new(
        params: Vec<Param>,
        momentum: f64,
        nesterov: bool,
        weight_decay: f64,
    ) -> Result<Self> {
        let buf = params
            .iter()
            .map(|p| zeros_like_f32(&p.var))
            .collect::<Result<Vec<_>>>()?;
        Ok(Sgd {
            params,
            momentum,
            nesterov,
            weight_decay,
            buf,
            step: 0,
        })
    }
}

impl Optimizer for Sgd {
    fn params(&self) -> &[Param] {
        &self.params
    }

    fn step(&mut self, grads: &[Option<Tensor>], lr: f64) -> Result<()> {
        self.step += 1;
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = grads.get(i).and_then(|g| g.as_ref()) else {
                continue;
            };
            let w = p.var.as_tensor().to_dtype(DType::F32)?;
            let mut g = grad_f32(g)?;
            if p.decay && self.weight_decay != 0.0 {
                g = (g + w.affine(self.weight_decay, 0.0)?)?;
            }
            let d = if self.momentum != 0.0 {
                let buf = (self.buf[i].affine(self.momentum, 0.0)? + &g)?;
                let d = if self.nesterov {
                    (g + buf.affine(self.momentum, 0.0)?)?
                } else {
                    buf.clone()
                };
                self.buf[i] = buf;
                d
            } else {
                g
            };
            assign(&p.var, &(w - d.affine(lr, 0.0)?)?)?;
        }
        Ok(())
    }

    fn step_count(&self) -> u64 {
        self.step
    }

    fn state(&self) -> Result<HashMap<String, Tensor>> {
        let device = self
            .buf
            .first()
            .map(|t| t.device().clone())
            .unwrap_or(Device::Cpu);
        state_map(&self.params, &[("momentum", &self.buf)], self.step, &device)
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>, device: &Device) -> Result<()> {
        self.buf = load_buffers(&self.params, "momentum", state, device)?;
        self.step = load_step(state)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    fn param() -> Param {
        Param {
            name: "w".into(),
            var: Var::new(&[1.0f32, -2.0], &Device::Cpu).unwrap(),
            decay: true,
        }
    }

    fn run(nesterov: bool) -> Vec<f32> {
        let mut opt = Sgd::new(vec![param()], 0.9, nesterov, 0.0).unwrap();
        let g = Tensor::new(&[1.0f32, 2.0], &Device::Cpu).unwrap();
        opt.step(&[Some(g.clone())], 0.1).unwrap();
        opt.step(&[Some(g)], 0.1).unwrap();
        opt.params()[0].var.as_tensor().to_vec1::<f32>().unwrap()
    }

    #[test]
    fn momentum_accumulates_over_steps() {
        // buf1 = g, buf2 = 0.9·g + g = 1.9·g ⇒ w = w0 − 0.1·(1 + 1.9)·g
        let w = run(false);
        assert!((w[0] - (1.0 - 0.29)).abs() < 1e-6, "{w:?}");
        assert!((w[1] - (-2.0 - 0.58)).abs() < 1e-6, "{w:?}");
    }

    #[test]
    fn nesterov_looks_ahead_along_the_momentum() {
        // d1 = g + 0.9·g = 1.9·g, d2 = g + 0.9·1.9·g = 2.71·g ⇒ w = w0 − 0.1·4.61·g
        let w = run(true);
        assert!((w[0] - (1.0 - 0.461)).abs() < 1e-6, "{w:?}");
        assert!((w[1] - (-2.0 - 0.922)).abs() < 1e-5, "{w:?}");
    }

    #[test]
    fn weight_decay_adds_an_l2_gradient() {
        let mut opt = Sgd::new(vec![param()], 0.0, false, 0.5).unwrap();
        let g = Tensor::new(&[0.0f32, 0.0], &Device::Cpu).unwrap();
        opt.step(&[Some(g)], 0.1).unwrap();
        let w = opt.params()[0].var.as_tensor().to_vec1::<f32>().unwrap();
        assert!(
            (w[0] - 0.95).abs() < 1e-6 && (w[1] + 1.9).abs() < 1e-6,
            "{w:?}"
        );
    }
}
