//! Optimizers, learning-rate schedules and gradient clipping, written in the project so that
//! optimizer state can be checkpointed and resumed exactly.
//!
//! Every optimizer owns the list of trainable [`Param`]s (sorted by name, so the update order and
//! the saved state are deterministic) and updates each tensor with a handful of whole-tensor ops.
//! State is kept in f32 whatever the parameter dtype.

pub mod adamw;
pub mod clip;
pub mod lion;
pub mod schedule;
pub mod sgd;

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::VarMap;

use crate::config::{OptimizerKind, TrainingConfig};

pub use adamw::AdamW;
pub use clip::clip_grad_norm;
pub use lion::Lion;
pub use schedule::lr_at;
pub use sgd::Sgd;

/// One trainable tensor and whether weight decay applies to it.
#[derive(Clone)]
pub struct Param {
    pub name: String,
    pub var: Var,
    pub decay: bool,
}

/// The trainable parameters of a [`VarMap`], sorted by name; `decayed(name)` decides which get
/// weight decay (biases, norms and embeddings do not).
pub fn params_from_varmap(varmap: &VarMap, decayed: impl Fn(&str) -> bool) -> Vec<Param> {
    let data = varmap.data().lock();
    let mut params: Vec<Param> = match data {
        Ok(map) => map
            .iter()
            .map(|(name, var)| Param {
                name: name.clone(),
                var: var.clone(),
                decay: decayed(name),
            })
            .collect(),
        // A poisoned lock only means another thread panicked mid-insert; the map is still usable.
        Err(poisoned) => poisoned
            .into_inner()
            .iter()
            .map(|(name, var)| Param {
                name: name.clone(),
                var: var.clone(),
                decay: decayed(name),
            })
            .collect(),
    };
    params.sort_by(|a, b| a.name.cmp(&b.name));
    params
}

/// An optimizer over a fixed list of parameters.
pub trait Optimizer {
    /// The parameters this optimizer updates, in update order.
    fn params(&self) -> &[Param];

    /// One update with learning rate `lr`. `grads[i]` is the gradient of `params()[i]`; `None`
    /// (a parameter the loss did not reach, e.g. an idle expert) leaves that parameter unchanged.
    fn step(&mut self, grads: &[Option<Tensor>], lr: f64) -> Result<()>;

    /// Number of updates applied so far.
    fn step_count(&self) -> u64;

    /// The state as named tensors (saved to `optimizer.safetensors`).
    fn state(&self) -> Result<HashMap<String, Tensor>>;

    /// Restores a state saved by [`Optimizer::state`].
    fn load_state(&mut self, state: &HashMap<String, Tensor>, device: &Device) -> Result<()>;
}

/// Builds the optimizer `cfg.optimizer` names over `params`.
pub fn build(cfg: &TrainingConfig, params: Vec<Param>) -> Result<Box<dyn Optimizer>> {
    Ok(match cfg.optimizer {
        OptimizerKind::AdamW => Box::new(AdamW::new(
            params,
            adamw::AdamWParams {
                beta1: cfg.beta1,
                beta2: cfg.beta2,
                eps: cfg.eps,
                weight_decay: cfg.weight_decay,
            },
        )?),
        OptimizerKind::Sgd => Box::new(Sgd::new(
            params,
            cfg.momentum,
            cfg.nesterov,
            cfg.weight_decay,
        )?),
        OptimizerKind::Lion => Box::new(Lion::new(params, cfg.beta1, cfg.beta2, cfg.weight_decay)?),
    })
}

/// A zero f32 buffer shaped like `p`, for first/second moments.
fn zeros_like_f32(p: &Var) -> Result<Tensor> {
    Tensor::zeros(p.shape(), DType::F32, p.device())
}

/// The gradient as f32 (a no-op for f32 gradients).
fn grad_f32(g: &Tensor) -> Result<Tensor> {
    if g.dtype() == DType::F32 {
        Ok(g.clone())
    } else {
        g.to_dtype(DType::F32)
    }
}

/// Writes `new` (f32) into the parameter, converting to its dtype if needed.
fn assign(p: &Var, new: &Tensor) -> Result<()> {
    if p.dtype() == new.dtype() {
        p.set(new)
    } else {
        p.set(&new.to_dtype(p.dtype())?)
    }
}

/// Saves per-parameter buffers as `{prefix}.{param name}` plus the step counter.
fn state_map(
    params: &[Param],
    buffers: &[(&str, &[Tensor])],
    step: u64,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (prefix, bufs) in buffers {
        for (p, b) in params.iter().zip(bufs.iter()) {
            // A copy: the optimizers update their buffers in place, and the state taken now
            // must not change with the next step.
            out.insert(format!("{prefix}.{}", p.name), b.copy()?);
        }
    }
    out.insert(
        "step".to_string(),
        Tensor::new(&[step as i64], device)?.to_device(&Device::Cpu)?,
    );
    Ok(out)
}

/// Reads back the buffers written by [`state_map`], checking every parameter is present with
/// the right shape.
fn load_buffers(
    params: &[Param],
    prefix: &str,
    state: &HashMap<String, Tensor>,
    device: &Device,
) -> Result<Vec<Tensor>> {
    params
        .iter()
        .map(|p| {
            let key = format!("{prefix}.{}", p.name);
            let t = state.get(&key).ok_or_else(|| {
                candle_core::Error::Msg(format!("optimizer state has no `{key}`"))
            })?;
            if t.dims() != p.var.dims() {
                candle_core::bail!(
                    "optimizer state `{key}` has shape {:?}, parameter has {:?}",
                    t.dims(),
                    p.var.dims()
                );
            }
            // A copy, for the same reason as in `state_map`: the map must not change when the
            // optimizer steps.
            t.to_dtype(DType::F32)?.to_device(device)?.copy()
        })
        .collect()
}

fn load_step(state: &HashMap<String, Tensor>) -> Result<u64> {
    let t = state
        .get("step")
        .ok_or_else(|| candle_core::Error::Msg("optimizer state has no `step`".into()))?;
    let v: Vec<i64> = t.to_dtype(DType::I64)?.flatten_all()?.to_vec1()?;
    v.first()
        .map(|s| *s as u64)
        .ok_or_else(|| candle_core::Error::Msg("optimizer `step` is empty".into()))
}
