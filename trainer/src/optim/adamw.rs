//! AdamW (Loshchilov & Hutter): Adam with bias correction and decoupled weight decay, applied only
//! to parameters marked `decay`.

use std::collections::HashMap;

use candle_core::{Device, Result, Tensor};

use crate::kernels::adamw;

use super::{
    assign, grad_f32, load_buffers, load_step, state_map, zeros_like_f32, Optimizer, Param,
};

#[derive(Debug, Clone, Copy)]
pub struct AdamWParams {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

pub struct AdamW {
    params: Vec<Param>,
    hp: AdamWParams,
    /// First moments, one per parameter (f32).
    m: Vec<Tensor>,
    /// Second moments, one per parameter (f32).
    v: Vec<Tensor>,
    step: u64,
}

impl AdamW {
    pub fn new(params: Vec<Param>, hp: AdamWParams) -> Result<Self> {
        // Separate buffers for m and v: the CUDA and CPU kernels update them in place.
        let zeros = || {
            params
                .iter()
                .map(|p| zeros_like_f32(&p.var))
                .collect::<Result<Vec<_>>>()
        };
        let (m, v) = (zeros()?, zeros()?);
        Ok(AdamW {
            params,
            hp,
            m,
            v,
            step: 0,
        })
    }
}

#[cfg(feature = "cuda")]
impl AdamW {
    /// The same update as [`Optimizer::step`], one in-place CUDA kernel per tensor.
    fn step_cuda(&mut self, grads: &[Option<Tensor>], lr: f64, bc1: f64, bc2: f64) -> Result<()> {
        use crate::kernels::cuda::{adamw_update, AdamWStep};
        let hp = self.hp;
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = grads.get(i).and_then(|g| g.as_ref()) else {
                continue;
            };
            let shrink = if p.decay {
                1.0 - lr * hp.weight_decay
            } else {
                1.0
            };
            let k = AdamWStep {
                beta1: hp.beta1 as f32,
                beta2: hp.beta2 as f32,
                eps: hp.eps as f32,
                lr_bc1: (lr / bc1) as f32,
                inv_sqrt_bc2: (1.0 / bc2.sqrt()) as f32,
                shrink: shrink as f32,
            };
            adamw_update(p.var.as_tensor(), &grad_f32(g)?, &self.m[i], &self.v[i], k)?;
        }
        Ok(())
    }
}

impl Optimizer for AdamW {
    fn params(&self) -> &[Param] {
        &self.params
    }

    fn step(&mut self, grads: &[Option<Tensor>], lr: f64) -> Result<()> {
        self.step += 1;
        let AdamWParams {
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.hp;
        let t = self.step as i32;
        let bc1 = 1.0 - beta1.powi(t);
        let bc2 = 1.0 - beta2.powi(t);
        #[cfg(feature = "cuda")]
        if self.params.first().is_some_and(|p| {
            crate::kernels::use_cuda_kernel(p.var.as_tensor(), crate::kernels::CudaKernel::AdamW)
        }) {
            return self.step_cuda(grads, lr, bc1, bc2);
        }
        // f32 CPU tensors in place, in groups (see `kernels::adamw`); anything else with
        // candle ops below.
        let grads: Vec<Option<Tensor>> = grads
            .iter()
            .map(|g| g.as_ref().map(grad_f32).transpose())
            .collect::<Result<_>>()?;
        let mut in_place = Vec::new();
        let mut rest = Vec::new();
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = grads.get(i).and_then(|g| g.as_ref()) else {
                continue;
            };
            let w = p.var.as_tensor();
            if adamw::available(w, g, &self.m[i], &self.v[i]) {
                let step = adamw::AdamWStep {
                    beta1,
                    beta2,
                    eps,
                    lr_bc1: lr / bc1,
                    inv_sqrt_bc2: 1.0 / bc2.sqrt(),
                    shrink: (p.decay && weight_decay != 0.0).then_some(1.0 - lr * weight_decay),
                };
                in_place.push(adamw::Update {
                    w,
                    g,
                    m: &self.m[i],
                    v: &self.v[i],
                    step,
                });
            } else {
                rest.push((i, g));
            }
        }
        adamw::update_all(&in_place)?;
        drop(in_place);
        for (i, g) in rest {
            let p = &self.params[i];
            // m ← β1·m + (1-β1)·g ;  v ← β2·v + (1-β2)·g²
            let m = (self.m[i].affine(beta1, 0.0)? + g.affine(1.0 - beta1, 0.0)?)?;
            let v = (self.v[i].affine(beta2, 0.0)? + g.sqr()?.affine(1.0 - beta2, 0.0)?)?;
            // step = lr·m̂ / (√v̂ + ε) with m̂ = m/bc1, v̂ = v/bc2 folded into two affines.
            let denom = v.sqrt()?.affine(1.0 / bc2.sqrt(), eps)?;
            let update = (m.affine(lr / bc1, 0.0)? / denom)?;
            let w = p.var.as_tensor();
            let w = if w.dtype() == candle_core::DType::F32 {
                w.clone()
            } else {
                w.to_dtype(candle_core::DType::F32)?
            };
            let decayed = if p.decay && weight_decay != 0.0 {
                w.affine(1.0 - lr * weight_decay, 0.0)?
            } else {
                w
            };
            assign(&p.var, &(decayed - update)?)?;
            self.m[i] = m;
            self.v[i] = v;
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
        state_map(
            &self.params,
            &[("m", &self.m), ("v", &self.v)],
            self.step,
            &device,
        )
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>, device: &Device) -> Result<()> {
        self.m = load_buffers(&self.params, "m", state, device)?;
        self.v = load_buffers(&self.params, "v", state, device)?;
        self.step = load_step(state)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Var};

    fn one_param(decay: bool) -> Param {
        Param {
            name: "w".into(),
            var: Var::new(&[1.0f32, -2.0], &Device::Cpu).unwrap(),
            decay,
        }
    }

    fn hp() -> AdamWParams {
        AdamWParams {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }

    fn values(p: &Param) -> Vec<f32> {
        p.var.as_tensor().to_vec1::<f32>().unwrap()
    }

    fn assert_close(got: &[f32], want: &[f64]) {
        for (g, w) in got.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-5, "got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn two_adamw_steps_match_hand_computed_values() {
        // Expected numbers from the textbook update in plain f64 Python:
        //   m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g**2
        //   p = p*(1 - lr*wd) - lr * (m/(1-b1**t)) / (sqrt(v/(1-b2**t)) + eps)
        // with lr = 0.1, wd = 0.1, g1 = [0.5, 0.1], g2 = [-0.5, 0.3].
        let mut opt = AdamW::new(vec![one_param(true)], hp()).unwrap();
        let g1 = Tensor::new(&[0.5f32, 0.1], &Device::Cpu).unwrap();
        opt.step(&[Some(g1)], 0.1).unwrap();
        assert_close(&values(&opt.params()[0]), &[0.890000002, -2.07999999]);
        let g2 = Tensor::new(&[-0.5f32, 0.3], &Device::Cpu).unwrap();
        opt.step(&[Some(g2)], 0.1).unwrap();
        assert_close(
            &values(&opt.params()[0]),
            &[0.8863631597694736, -2.15097809789441],
        );
        let m = opt.m[0].to_vec1::<f32>().unwrap();
        assert_close(&m, &[-0.005, 0.039]);
        let v = opt.v[0].to_vec1::<f32>().unwrap();
        assert_close(&v, &[0.00049975, 0.00009999]);
        assert_eq!(opt.step_count(), 2);
    }

    #[test]
    fn parameters_without_decay_are_not_shrunk() {
        let mut opt = AdamW::new(vec![one_param(false)], hp()).unwrap();
        let g = Tensor::new(&[0.5f32, 0.1], &Device::Cpu).unwrap();
        opt.step(&[Some(g)], 0.1).unwrap();
        // Without decay, the first step moves each weight by lr·sign(g).
        assert_close(&values(&opt.params()[0]), &[0.9, -2.1]);
    }

    #[test]
    fn a_missing_gradient_leaves_the_parameter_unchanged() {
        let mut opt = AdamW::new(vec![one_param(true)], hp()).unwrap();
        opt.step(&[None], 0.1).unwrap();
        assert_close(&values(&opt.params()[0]), &[1.0, -2.0]);
    }

    #[test]
    fn saved_state_restores_the_same_trajectory() {
        let g = |a: f32, b: f32| Tensor::new(&[a, b], &Device::Cpu).unwrap();
        let mut a = AdamW::new(vec![one_param(true)], hp()).unwrap();
        a.step(&[Some(g(0.5, 0.1))], 0.1).unwrap();
        let state = a.state().unwrap();

        let restored_param = Param {
            name: "w".into(),
            // A copy: `from_tensor` of a variable would share its storage, which both
            // optimizers then update in place.
            var: Var::from_tensor(&a.params()[0].var.as_tensor().copy().unwrap()).unwrap(),
            decay: true,
        };
        let mut b = AdamW::new(vec![restored_param], hp()).unwrap();
        b.load_state(&state, &Device::Cpu).unwrap();
        a.step(&[Some(g(-0.5, 0.3))], 0.1).unwrap();
        b.step(&[Some(g(-0.5, 0.3))], 0.1).unwrap();
        assert_eq!(values(&a.params()[0]), values(&b.params()[0]));
        assert_eq!(b.step_count(), 2);
        assert_eq!(state["m.w"].dtype(), DType::F32);
    }

    /// `n` values of a sine wave.
    fn wave(n: usize, phase: f64, scale: f64) -> Tensor {
        let v: Vec<f32> = (0..n)
            .map(|i| ((i as f64 * 0.37 + phase).sin() * scale) as f32)
            .collect();
        Tensor::from_vec(v, n, &Device::Cpu).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec1::<f32>()
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect()
    }

    /// Step t of the update as candle tensor ops (the path other devices and dtypes take):
    /// (w, m, v) → the new (w, m, v).
    fn tensor_op_step(
        (w, m, v): (Tensor, Tensor, Tensor),
        g: &Tensor,
        (lr, t, decay): (f64, i32, bool),
    ) -> (Tensor, Tensor, Tensor) {
        let AdamWParams {
            beta1,
            beta2,
            eps,
            weight_decay,
        } = hp();
        let (bc1, bc2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
        let m = (m.affine(beta1, 0.0).unwrap() + g.affine(1.0 - beta1, 0.0).unwrap()).unwrap();
        let g2 = g.sqr().unwrap().affine(1.0 - beta2, 0.0).unwrap();
        let v = (v.affine(beta2, 0.0).unwrap() + g2).unwrap();
        let denom = v.sqrt().unwrap().affine(1.0 / bc2.sqrt(), eps).unwrap();
        let update = (m.affine(lr / bc1, 0.0).unwrap() / denom).unwrap();
        let w = if decay {
            w.affine(1.0 - lr * weight_decay, 0.0).unwrap()
        } else {
            w
        };
        ((w - update).unwrap(), m, v)
    }

    #[test]
    fn the_in_place_cpu_update_gives_the_bits_of_the_tensor_op_formula() {
        // 40,000 values: several parallel blocks; with and without decay, three steps.
        let n = 40_000;
        for decay in [true, false] {
            let param = Param {
                name: "w".into(),
                var: Var::from_tensor(&wave(n, 0.1, 1.0)).unwrap(),
                decay,
            };
            let mut opt = AdamW::new(vec![param], hp()).unwrap();
            let mut want = (wave(n, 0.1, 1.0), wave(n, 0.0, 0.0), wave(n, 0.0, 0.0));
            for t in 1..=3 {
                let g = wave(n, t as f64, 0.01 * t as f64);
                opt.step(&[Some(g.clone())], 0.05).unwrap();
                want = tensor_op_step(want, &g, (0.05, t, decay));
                let w = opt.params()[0].var.as_tensor();
                assert_eq!(bits(w), bits(&want.0), "w, step {t}");
                assert_eq!(bits(&opt.m[0]), bits(&want.1), "m, step {t}");
                assert_eq!(bits(&opt.v[0]), bits(&want.2), "v, step {t}");
            }
        }
    }

    #[test]
    fn many_parameters_updated_in_groups_get_the_bits_of_the_tensor_op_formula() {
        // 120 parameters (more than one group of the in-place update), sizes from 1 value to
        // several blocks, every third one not decayed, every seventh without a gradient in
        // the first step (an idle expert).
        let size = |i: usize| [1, 7, 300, 20_000, 40_000][i % 5];
        let params: Vec<Param> = (0..120)
            .map(|i| Param {
                name: format!("p{i:03}"),
                var: Var::from_tensor(&wave(size(i), i as f64, 1.0)).unwrap(),
                decay: i % 3 != 0,
            })
            .collect();
        let mut opt = AdamW::new(params, hp()).unwrap();
        let mut want: Vec<_> = (0..120)
            .map(|i| {
                let zeros = Tensor::zeros(size(i), DType::F32, &Device::Cpu).unwrap();
                (wave(size(i), i as f64, 1.0), zeros.clone(), zeros)
            })
            .collect();
        // Steps that had a gradient, per parameter (the bias corrections use the optimizer's
        // step count, as the update does).
        for t in 1..=2 {
            let grads: Vec<Option<Tensor>> = (0..120)
                .map(|i| (t > 1 || i % 7 != 0).then(|| wave(size(i), (t * i) as f64, 0.01)))
                .collect();
            opt.step(&grads, 0.05).unwrap();
            for (i, g) in grads.iter().enumerate() {
                if let Some(g) = g {
                    want[i] = tensor_op_step(want[i].clone(), g, (0.05, t as i32, i % 3 != 0));
                }
                let w = opt.params()[i].var.as_tensor();
                assert_eq!(bits(w), bits(&want[i].0), "w of parameter {i}, step {t}");
                assert_eq!(
                    bits(&opt.m[i]),
                    bits(&want[i].1),
                    "m of parameter {i}, step {t}"
                );
                assert_eq!(
                    bits(&opt.v[i]),
                    bits(&want[i].2),
                    "v of parameter {i}, step {t}"
                );
            }
        }
    }

    #[test]
    fn parameters_that_share_storage_are_refused_before_any_is_updated() {
        // The first and the last of 60 parameters share one storage: they fall in different
        // groups of the in-place update, and no parameter may change.
        let shared = Var::new(&[1.0f32, -2.0], &Device::Cpu).unwrap();
        let params: Vec<Param> = (0..60)
            .map(|i| Param {
                name: format!("p{i:02}"),
                var: if i == 0 || i == 59 {
                    shared.clone()
                } else {
                    Var::new(&[1.0f32, -2.0], &Device::Cpu).unwrap()
                },
                decay: true,
            })
            .collect();
        let mut opt = AdamW::new(params, hp()).unwrap();
        let g = Tensor::new(&[0.5f32, 0.1], &Device::Cpu).unwrap();
        let err = opt.step(&vec![Some(g); 60], 0.1).unwrap_err();
        assert!(err.to_string().contains("share storage"), "{err}");
        for p in opt.params() {
            assert_eq!(values(p), vec![1.0, -2.0], "{}", p.name);
        }
    }

    #[test]
    fn a_gradient_sharing_the_parameters_storage_is_refused() {
        let mut opt = AdamW::new(vec![one_param(true)], hp()).unwrap();
        let g = opt.params()[0].var.as_tensor().clone();
        let err = opt.step(&[Some(g)], 0.1).unwrap_err();
        assert!(
            err.to_string().contains("a gradient shares storage"),
            "{err}"
        );
        assert_eq!(values(&opt.params()[0]), vec![1.0, -2.0]);
    }

    #[test]
    fn a_saved_state_does_not_change_when_the_optimizer_steps_again() {
        let mut opt = AdamW::new(vec![one_param(true)], hp()).unwrap();
        let g = Tensor::new(&[0.5f32, 0.1], &Device::Cpu).unwrap();
        opt.step(&[Some(g.clone())], 0.1).unwrap();
        let state = opt.state().unwrap();
        let saved = state["m.w"].to_vec1::<f32>().unwrap();
        opt.step(&[Some(g)], 0.1).unwrap();
        assert_eq!(state["m.w"].to_vec1::<f32>().unwrap(), saved);
        assert_ne!(opt.m[0].to_vec1::<f32>().unwrap(), saved);
    }
}
