//! Deterministic GPT-2 initialization, parameter counting and the weight-decay rule.

use candle_core::{Error, Result, Tensor};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::config::ModelConfig;

fn is_norm(name: &str) -> bool {
    name.split('.').any(|part| part.starts_with("ln_"))
}

/// Decoupled weight decay applies only to 2-D matmul weights: not to biases, norm gains or
/// the embedding tables (GPT-2 / nanoGPT practice).
pub fn is_decayed(name: &str) -> bool {
    name.ends_with(".weight")
        && !is_norm(name)
        && !name.starts_with("wte.")
        && !name.starts_with("wpe.")
}

/// Total number of scalar parameters.
pub fn num_params(varmap: &VarMap) -> usize {
    varmap.all_vars().iter().map(|v| v.elem_count()).sum()
}

/// Standard normal samples by Box–Muller from a seeded generator (candle's CPU `randn` cannot be
/// seeded, and we want identical weights on every device).
fn normal(rng: &mut ChaCha8Rng, n: usize, std: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1], keeps ln finite
        let u2: f64 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let theta = std::f64::consts::TAU * u2;
        out.push(r * theta.cos());
        out.push(r * theta.sin());
    }
    out.truncate(n);
    out
}

/// GPT-2 init: N(0, init_std) for weights and embeddings, N(0, init_std/sqrt(2·n_layers)) for
/// the residual output projections (`c_proj`, Mamba's `out_proj`), zero biases, unit norm
/// gains; the Mamba-2 decays, step sizes, skips and convolutions as `mamba::init_value` says.
/// Variables are visited in sorted-name order from one seeded stream, so the result depends
/// only on `seed`.
pub fn init_weights(varmap: &VarMap, cfg: &ModelConfig, seed: u64) -> Result<()> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| Error::Msg("variable map lock poisoned".to_string()))?;
    // Adapters have their own stream (`lora::init_adapters`), so a base model initializes the
    // same with or without them.
    let mut names: Vec<&String> = data
        .keys()
        .filter(|n| !super::lora::is_adapter(n))
        .collect();
    names.sort();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let resid_std = cfg.init_std / (2.0 * cfg.n_layers as f64).sqrt();
    for name in names {
        let var = &data[name];
        let n = var.elem_count();
        let values = if let Some(v) = super::mamba::init_value(name, var.dims(), &mut rng) {
            v
        } else if name.ends_with(".bias") {
            vec![0.0; n]
        } else if is_norm(name) {
            vec![1.0; n]
        } else if name.ends_with("c_proj.weight") || name.ends_with("out_proj.weight") {
            normal(&mut rng, n, resid_std)
        } else {
            normal(&mut rng, n, cfg.init_std)
        };
        let t = Tensor::from_vec(values, var.shape(), var.device())?.to_dtype(var.dtype())?;
        var.set(&t)?;
    }
    Ok(())
}
