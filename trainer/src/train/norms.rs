//! Per-layer gradient and parameter norms (`logging.layer_norms_every`): the L2 norm of each
//! layer's gradients and weights, where a layer is a transformer block (`h.N.*` → `layerN`) or
//! a top-level module (`wte`, `wpe`, `ln_f`, `lm_head`). A layer whose gradient norm grows
//! while the others stay flat is where an instability starts; the global `grad_norm` hides it.

use std::collections::BTreeMap;

use anyhow::Result;
use candle_core::{DType, Tensor};

use crate::optim::Param;
use crate::wire::norm_keys;

/// The layer a parameter belongs to, by its name.
pub fn layer_of(name: &str) -> String {
    let mut parts = name.split('.');
    let first = parts.next().unwrap_or(name);
    match (first, parts.next()) {
        ("h", Some(index)) if index.bytes().all(|b| b.is_ascii_digit()) && !index.is_empty() => {
            format!("layer{index}")
        }
        _ => first.to_string(),
    }
}

/// Adds `grad_norm/<layer>` and `param_norm/<layer>` for the gradients `grads` (before
/// clipping) of `params` and the weights they were taken at. One read from the device.
pub fn layer_norms(
    params: &[Param],
    grads: &[Option<Tensor>],
    out: &mut BTreeMap<String, f64>,
) -> Result<()> {
    // Per layer, the squared norms' tensors, summed on the device.
    let mut grad_sq: BTreeMap<String, Vec<Tensor>> = BTreeMap::new();
    let mut param_sq: BTreeMap<String, Vec<Tensor>> = BTreeMap::new();
    for (p, g) in params.iter().zip(grads) {
        let layer = layer_of(&p.name);
        let w = p.var.as_tensor().to_dtype(DType::F32)?;
        param_sq
            .entry(layer.clone())
            .or_default()
            .push(w.sqr()?.sum_all()?);
        if let Some(g) = g {
            let g = g.to_dtype(DType::F32)?;
            grad_sq.entry(layer).or_default().push(g.sqr()?.sum_all()?);
        }
    }
    let mut keys = Vec::new();
    let mut sums = Vec::new();
    for (prefix, groups) in [(true, &grad_sq), (false, &param_sq)] {
        for (layer, parts) in groups {
            keys.push(if prefix {
                norm_keys::grad(layer)
            } else {
                norm_keys::param(layer)
            });
            sums.push(Tensor::stack(parts, 0)?.sum_all()?);
        }
    }
    if sums.is_empty() {
        return Ok(());
    }
    let values = Tensor::stack(&sums, 0)?.to_vec1::<f32>()?;
    for (key, sq) in keys.into_iter().zip(values) {
        out.insert(key, f64::from(sq).sqrt());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn parameters_are_grouped_by_block_or_top_level_module() {
        assert_eq!(layer_of("h.0.attn.c_attn.weight"), "layer0");
        assert_eq!(layer_of("h.12.mlp.c_fc.bias"), "layer12");
        assert_eq!(layer_of("wte.weight"), "wte");
        assert_eq!(layer_of("ln_f.weight"), "ln_f");
        assert_eq!(layer_of("lm_head.weight"), "lm_head");
        assert_eq!(layer_of("h.x.weight"), "h", "not a block index");
    }

    #[test]
    fn each_layer_gets_the_l2_norm_of_its_gradients_and_weights() {
        let param = |name: &str, values: &[f32]| Param {
            name: name.to_string(),
            var: Var::new(values, &Device::Cpu).unwrap(),
            decay: true,
        };
        let params = [
            param("h.0.a.weight", &[3.0, 0.0]),
            param("h.0.b.weight", &[0.0, 4.0]),
            param("h.1.a.weight", &[1.0, 1.0]),
            param("wte.weight", &[2.0]),
        ];
        let grad = |v: &[f32]| Some(Tensor::new(v, &Device::Cpu).unwrap());
        // The embedding got no gradient this step (an unused row set, an idle expert).
        let grads = [
            grad(&[1.0, 2.0]),
            grad(&[2.0, 0.0]),
            grad(&[0.5, 0.5]),
            None,
        ];
        let mut out = BTreeMap::new();
        layer_norms(&params, &grads, &mut out).unwrap();
        let close = |key: &str, want: f64| {
            let got = out[key];
            assert!((got - want).abs() < 1e-6, "{key}: {got} vs {want}");
        };
        close("param_norm/layer0", 5.0);
        close("grad_norm/layer0", 3.0);
        close("param_norm/layer1", 2f64.sqrt());
        close("grad_norm/layer1", 0.5f64.sqrt());
        close("param_norm/wte", 2.0);
        assert!(!out.contains_key("grad_norm/wte"));
        assert_eq!(out.len(), 5);
    }
}
