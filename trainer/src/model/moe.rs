//! Mixture-of-Experts feed-forward layer: softmax router, top-k, capacity, load-balancing and
//! z losses. Only the integer routing plan (which token goes to which expert) is computed on
//! the host; the gate weights stay on device so gradients reach the router.

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use super::{DropoutRng, Linear, Mlp};
use crate::config::{ModelConfig, MoeConfig};

/// Routing statistics of one MoE layer for one forward pass (telemetry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeLayerStats {
    /// Block index.
    pub layer: usize,
    /// Fraction of the N·top_k routing assignments that chose each expert (sums to 1;
    /// uniform = 1/num_experts), counted before capacity drops.
    pub tokens_per_expert: Vec<f32>,
    /// Fraction of the N·top_k assignments dropped because their expert was full.
    pub dropped_fraction: f32,
    /// Mean over tokens of the router distribution's entropy, in nats.
    pub router_entropy: f32,
    /// Unweighted load-balancing loss E·Σ f_i·P_i (1.0 when perfectly balanced).
    pub aux_loss: f32,
    /// Unweighted router z-loss, mean of logsumexp(router logits)².
    pub z_loss: f32,
}

/// What an MoE layer returns.
#[derive(Debug, Clone)]
pub struct MoeOutput {
    /// Same shape as the input.
    pub y: Tensor,
    /// aux_loss_weight · aux + z_loss_weight · z (scalar, differentiable).
    pub aux_loss: Tensor,
    pub stats: MoeLayerStats,
}

/// The integer side of routing, computed on the host from the router probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutePlan {
    /// (N·k) chosen experts, token-major, best first.
    pub choices: Vec<u32>,
    /// Kept assignments grouped by expert: the token of each...
    pub tokens: Vec<u32>,
    /// ...and its flat index t·k + j into the (N, k) gate matrix.
    pub slots: Vec<u32>,
    /// Kept assignments per expert (lengths of the groups above).
    pub kept: Vec<usize>,
    /// Assignments per expert before capacity.
    pub routed: Vec<usize>,
    pub dropped: usize,
}

/// Top-k per token (ties to the lower expert index), then capacity in GShard priority order:
/// every token's first choice is placed before any second choice, tokens in order.
pub fn route(
    probs: &[f32],
    n: usize,
    experts: usize,
    k: usize,
    capacity: Option<usize>,
) -> RoutePlan {
    let mut choices = Vec::with_capacity(n * k);
    let mut order: Vec<usize> = (0..experts).collect();
    for t in 0..n {
        let row = &probs[t * experts..(t + 1) * experts];
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        choices.extend(order[..k].iter().map(|&e| e as u32));
    }
    let mut groups: Vec<Vec<(u32, u32)>> = vec![Vec::new(); experts];
    let mut routed = vec![0usize; experts];
    let mut dropped = 0;
    for j in 0..k {
        for t in 0..n {
            let slot = t * k + j;
            let e = choices[slot] as usize;
            routed[e] += 1;
            if capacity.is_none_or(|c| groups[e].len() < c) {
                groups[e].push((t as u32, slot as u32));
            } else {
                dropped += 1;
            }
        }
    }
    let kept = groups.iter().map(Vec::len).collect();
    let (tokens, slots) = groups.into_iter().flatten().unzip();
    RoutePlan {
        choices,
        tokens,
        slots,
        kept,
        routed,
        dropped,
    }
}

#[derive(Debug, Clone)]
pub struct MoeLayer {
    router: Linear,
    experts: Vec<Mlp>,
    shared_expert: Option<Mlp>,
    layer: usize,
    cfg: MoeConfig,
}

impl MoeLayer {
    pub fn new(model: &ModelConfig, cfg: &MoeConfig, layer: usize, vb: VarBuilder) -> Result<Self> {
        let mlp =
            |vb: VarBuilder| Mlp::new(model.d_model, model.d_ff, model.activation, model.bias, vb);
        let router = Linear::new(model.d_model, cfg.num_experts, false, vb.pp("router"))?;
        let experts = (0..cfg.num_experts)
            .map(|e| mlp(vb.pp("experts").pp(e)))
            .collect::<Result<Vec<_>>>()?;
        let shared_expert = if cfg.shared_expert {
            Some(mlp(vb.pp("shared_expert"))?)
        } else {
            None
        };
        Ok(MoeLayer {
            router,
            experts,
            shared_expert,
            layer,
            cfg: cfg.clone(),
        })
    }

    /// Expert capacity for `n` tokens: ceil(capacity_factor · n · top_k / num_experts).
    pub fn capacity(&self, n: usize) -> Option<usize> {
        (self.cfg.capacity_factor > 0.0).then(|| {
            let c = self.cfg.capacity_factor * (n * self.cfg.top_k) as f64
                / self.cfg.num_experts as f64;
            c.ceil() as usize
        })
    }

    /// x (.., D) → (.., D). With an rng (training), router inputs get multiplicative jitter.
    pub fn forward(&self, x: &Tensor, rng: Option<&mut DropoutRng>) -> Result<MoeOutput> {
        let dims = x.dims().to_vec();
        let d = dims[dims.len() - 1];
        let (e, k) = (self.cfg.num_experts, self.cfg.top_k);
        let xf = x.reshape(((), d))?; // (N, D)
        let n = xf.dim(0)?;
        let router_in = match rng {
            Some(rng) if self.cfg.router_jitter > 0.0 => rng.jitter(&xf, self.cfg.router_jitter)?,
            _ => xf.clone(),
        };
        let logits = self.router.forward(&router_in)?; // (N, E)
        let probs = candle_nn::ops::softmax(&logits, D::Minus1)?; // (N, E)
        let host: Vec<f32> = probs.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let plan = route(&host, n, e, k, self.capacity(n));

        let dev = x.device();
        let choices = Tensor::from_vec(plan.choices.clone(), (n, k), dev)?; // (N, k)
        let top_p = probs.gather(&choices, 1)?; // (N, k)
                                                // Top-1 keeps the raw probability (Switch), so the router still gets a gradient.
        let gates = if k > 1 {
            top_p.broadcast_div(&top_p.sum_keepdim(1)?)? // (N, k)
        } else {
            top_p
        };
        let mut y = xf.zeros_like()?; // (N, D)
        if !plan.tokens.is_empty() {
            let m = plan.tokens.len();
            let tokens = Tensor::from_vec(plan.tokens.clone(), m, dev)?; // (M,)
            let slots = Tensor::from_vec(plan.slots.clone(), m, dev)?; // (M,)
            let xs = xf.index_select(&tokens, 0)?; // (M, D), grouped by expert
            let mut outs = Vec::with_capacity(e);
            let mut offset = 0;
            for (expert, &count) in self.experts.iter().zip(&plan.kept) {
                if count > 0 {
                    outs.push(expert.forward(&xs.narrow(0, offset, count)?)?); // (count, D)
                    offset += count;
                }
            }
            let ys = Tensor::cat(&outs, 0)?; // (M, D)
            let g = gates.flatten_all()?.index_select(&slots, 0)?.unsqueeze(1)?; // (M, 1)
            y = y.index_add(&tokens, &ys.broadcast_mul(&g)?, 0)?; // (N, D)
        }
        if let Some(shared) = &self.shared_expert {
            y = (y + shared.forward(&xf)?)?;
        }

        // Load balancing: f (assignment fractions, constant) · P (mean router probability).
        let total = (n * k) as f32;
        let frac: Vec<f32> = plan.routed.iter().map(|&c| c as f32 / total).collect();
        let f = Tensor::from_vec(frac.clone(), e, dev)?.to_dtype(probs.dtype())?; // (E,)
        let p_mean = probs.mean(0)?; // (E,)
        let aux = ((p_mean * f)?.sum_all()? * e as f64)?;
        let max = logits.max_keepdim(1)?.detach(); // (N, 1)
        let lse = logits
            .broadcast_sub(&max)?
            .exp()?
            .sum_keepdim(1)?
            .log()?
            .broadcast_add(&max)?; // (N, 1)
        let z = lse.sqr()?.mean_all()?;
        let weighted = ((&aux * self.cfg.aux_loss_weight)? + (&z * self.cfg.z_loss_weight)?)?;

        let entropy = host
            .chunks(e)
            .map(|row| {
                -row.iter()
                    .filter(|&&p| p > 0.0)
                    .map(|&p| p * p.ln())
                    .sum::<f32>()
            })
            .sum::<f32>()
            / n.max(1) as f32;
        let stats = MoeLayerStats {
            layer: self.layer,
            tokens_per_expert: frac,
            dropped_fraction: plan.dropped as f32 / total,
            router_entropy: entropy,
            aux_loss: aux.to_dtype(DType::F32)?.to_scalar::<f32>()?,
            z_loss: z.to_dtype(DType::F32)?.to_scalar::<f32>()?,
        };
        Ok(MoeOutput {
            y: y.reshape(dims)?,
            aux_loss: weighted,
            stats,
        })
    }
}
