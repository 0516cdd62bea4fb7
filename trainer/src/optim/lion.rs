//! Lion (Chen et al., 2023): the update is the sign of an interpolation between momentum and
//! gradient, with decoupled weight decay on `decay` parameters.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};

use super::{
    assign, grad_f32, load_buffers, load_step, state_map, zeros_like_f32, Optimizer, Param,
};

pub struct Lion {
    params: Vec<Param>,
    beta1: f64,
    beta2: f64,
    weight_decay: f64,
    /// Momentum (f32).
    m: Vec<Tensor>,
    step: u64,
}

impl Lion {
    pub fn new(params: Vec<Param>, beta1: f64, beta2: f64, weight_decay: f64) -> Result<Self> {
        let m = params
            .iter()
            .map(|p| zeros_like_f32(&p.var))
            .collect::<Result<Vec<_>>>()?;
        Ok(Lion {
            params,
            beta1,
            beta2,
            weight_decay,
            m,
            step: 0,
        })
    }
}

impl Optimizer for Lion {
    fn params(&self) -> &[Param] {
        &self.params
    }

    fn step(&mut self, grads: &[Option<Tensor>], lr: f64) -> Result<()> {
        self.step += 1;
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = grads.get(i).and_then(|g| g.as_ref()) else {
                continue;
            };
            let g = grad_f32(g)?;
            // c = β1·m + (1-β1)·g ; w ← w·(1 - lr·λ) - lr·sign(c) ; m ← β2·m + (1-β2)·g
            let c = (self.m[i].affine(self.beta1, 0.0)? + g.affine(1.0 - self.beta1, 0.0)?)?;
            let w = p.var.as_tensor().to_dtype(DType::F32)?;
            let w = if p.decay && self.weight_decay != 0.0 {
                w.affine(1.0 - lr * self.weight_decay, 0.0)?
            } else {
                w
            };
            assign(&p.var, &(w - c.sign()?.affine(lr, 0.0)?)?)?;
            self.m[i] = (self.m[i].affine(self.beta2, 0.0)? + g.affine(1.0 - self.beta2, 0.0)?)?;
        }
        Ok(())
    }

    fn step_count(&self) -> u64 {
        self.step
    }

    fn state(&self) -> Result<HashMap<String, Tensor>> {
        let device = self
            .m
            .first()
            .map(|t| t.device().clone())
            .unwrap_or(Device::Cpu);
        state_map(&self.params, &[("m", &self.m)], self.step, &device)
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>, device: &Device) -> Result<()> {
        self.m = load_buffers(&self.params, "m", state, device)?;
        self.step = load_step(state)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    #[test]
    fn lion_moves_each_weight_by_lr_in_the_sign_direction() {
        let p = Param {
            name: "w".into(),
            var: Var::new(&[1.0f32, -2.0, 0.5], &Device::Cpu).unwrap(),
            decay: false,
        };
        let mut opt = Lion::new(vec![p], 0.9, 0.99, 0.0).unwrap();
        let g = Tensor::new(&[0.3f32, -4.0, 0.0], &Device::Cpu).unwrap();
        opt.step(&[Some(g)], 0.01).unwrap();
        let w = opt.params()[0].var.as_tensor().to_vec1::<f32>().unwrap();
        for (got, want) in w.iter().zip([0.99f32, -1.99, 0.5]) {
            assert!((got - want).abs() < 1e-6, "{w:?}");
        }
        let m = opt.m[0].to_vec1::<f32>().unwrap();
        assert!(
            (m[0] - 0.003).abs() < 1e-7 && (m[1] + 0.04).abs() < 1e-7,
            "{m:?}"
        );
    }
}
