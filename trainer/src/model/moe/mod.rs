//! Mixture-of-Experts feed-forward layer: softmax router, top-k, capacity, load-balancing and
//! z losses. Only the integer routing plan (which token goes to which expert) is computed on
//! the host; the gate weights stay on device so gradients reach the router.

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::VarBuilder;

mod routing;

pub use routing::{route, RoutePlan};

use super::{DropoutRng, Linear, Mlp};
use crate::config::{LoraConfig, LoraTarget, ModelConfig, MoeConfig};
use crate::kernels;

/// Routing statistics of one MoE layer for one forward pass (telemetry).
#[derive(Debug, Clone)]
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
    /// (2,) f32, detached, left on the device: the unweighted load-balancing loss E·Σ f_i·P_i
    /// (1.0 when perfectly balanced), then the unweighted router z-loss, mean of
    /// logsumexp(router logits)². Reading them here would stop the host at every layer of
    /// every micro-batch until the GPU caught up; [`MoeLayerStats::read_losses`] reads all
    /// layers' at once, on the steps that log them.
    pub losses: Tensor,
}

impl MoeLayerStats {
    /// The (aux, z) losses of every entry, in one read from the device.
    pub fn read_losses(stats: &[MoeLayerStats]) -> Result<Vec<(f32, f32)>> {
        if stats.is_empty() {
            return Ok(Vec::new());
        }
        let all: Vec<&Tensor> = stats.iter().map(|s| &s.losses).collect();
        let rows = Tensor::stack(&all, 0)?.to_vec2::<f32>()?; // (entries, 2)
        Ok(rows.into_iter().map(|r| (r[0], r[1])).collect())
    }
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
        let router = Linear::new(model.d_model, cfg.num_experts, false, vb.pp("router"))?;
        let experts = (0..cfg.num_experts)
            .map(|e| Mlp::new(model, vb.pp("experts").pp(e)))
            .collect::<Result<Vec<_>>>()?;
        let shared_expert = if cfg.shared_expert {
            Some(Mlp::new(model, vb.pp("shared_expert"))?)
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

    /// LoRA adapters on every expert's (and the shared expert's) targeted projections.
    pub fn adapt(&mut self, lora: &LoraConfig, vb: &VarBuilder) -> Result<()> {
        let inp = lora.adapts(LoraTarget::ExpertIn);
        let out = lora.adapts(LoraTarget::ExpertOut);
        for (e, expert) in self.experts.iter_mut().enumerate() {
            expert.adapt(lora, inp, out, &vb.pp("experts").pp(e))?;
        }
        if let Some(shared) = &mut self.shared_expert {
            shared.adapt(lora, inp, out, &vb.pp("shared_expert"))?;
        }
        Ok(())
    }

    /// The same layer without adapters (sharing the weights).
    pub fn without_adapters(&self) -> Self {
        MoeLayer {
            experts: self.experts.iter().map(Mlp::without_adapters).collect(),
            shared_expert: self.shared_expert.as_ref().map(Mlp::without_adapters),
            ..self.clone()
        }
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
    pub fn forward(&self, x: &Tensor, mut rng: Option<&mut DropoutRng>) -> Result<MoeOutput> {
        let dims = x.dims().to_vec();
        let d = dims[dims.len() - 1];
        let (e, k) = (self.cfg.num_experts, self.cfg.top_k);
        let xf = x.reshape(((), d))?; // (N, D)
        let n = xf.dim(0)?;
        let router_in = match rng.as_deref_mut() {
            Some(rng) if self.cfg.router_jitter > 0.0 => rng.jitter(&xf, self.cfg.router_jitter)?,
            _ => xf.clone(),
        };
        let logits = self.router.forward(&router_in)?; // (N, E)
        let probs = candle_nn::ops::softmax(&logits, D::Minus1)?; // (N, E)
        let host: Vec<f32> = probs.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let plan = route(&host, n, e, k, self.capacity(n));

        let choices = Tensor::from_vec(plan.choices.clone(), (n, k), x.device())?; // (N, k)
        let top_p = probs.gather(&choices, 1)?; // (N, k)
                                                // Top-1 keeps the raw probability (Switch), so the router still gets a gradient.
        let gates = if k > 1 {
            top_p.broadcast_div(&top_p.sum_keepdim(1)?)? // (N, k)
        } else {
            top_p
        };
        let mut y = self.experts_forward(&xf, &gates, &plan, rng.as_deref_mut())?; // (N, D)
        if let Some(shared) = &self.shared_expert {
            y = (y + shared.forward_t(&xf, rng)?)?;
        }
        let (aux_loss, stats) = self.router_losses(&logits, &probs, &host, &plan)?;
        Ok(MoeOutput {
            y: y.reshape(dims)?,
            aux_loss,
            stats,
        })
    }

    /// Σ over each token's kept assignments of gate · expert(x): every expert runs once on its
    /// kept tokens, grouped by `plan`. xf (N, D), gates (N, k) → (N, D).
    fn experts_forward(
        &self,
        xf: &Tensor,
        gates: &Tensor,
        plan: &RoutePlan,
        mut rng: Option<&mut DropoutRng>,
    ) -> Result<Tensor> {
        if plan.tokens.is_empty() {
            return xf.zeros_like(); // (N, D)
        }
        let (m, dev) = (plan.tokens.len(), xf.device());
        let tokens = Tensor::from_vec(plan.tokens.clone(), m, dev)?; // (M,)
        let xs = kernels::gather_rows(xf, &tokens)?; // (M, D), grouped by expert
        let ys = match self.plain_experts(xf) {
            // All experts as one op per layer (see `kernels::mlp`).
            Some(experts) => kernels::gelu_mlp(&xs, &experts, &plan.kept)?, // (M, D)
            None => {
                let mut outs = Vec::with_capacity(self.experts.len());
                let mut offset = 0;
                for (expert, &count) in self.experts.iter().zip(&plan.kept) {
                    if count > 0 {
                        let xe = xs.narrow(0, offset, count)?;
                        outs.push(expert.forward_t(&xe, rng.as_deref_mut())?); // (count, D)
                        offset += count;
                    }
                }
                Tensor::cat(&outs, 0)? // (M, D)
            }
        };
        kernels::combine_rows(&ys, gates, &plan.tokens, &plan.slots) // (N, D)
    }

    /// Every expert's (W_fc, b_fc, W_proj, b_proj) when the fused CPU ops run and every expert
    /// is a plain GELU MLP with biases; None otherwise (the experts then run one at a time).
    fn plain_experts(&self, x: &Tensor) -> Option<Vec<[&Tensor; 4]>> {
        if !kernels::use_fused(x) {
            return None;
        }
        self.experts.iter().map(Mlp::plain_gelu).collect()
    }

    /// The weighted load-balancing and z losses (differentiable, scalar) and the layer's stats,
    /// from the router logits and probabilities (N, E), the same probabilities on the host and
    /// the routing plan.
    fn router_losses(
        &self,
        logits: &Tensor,
        probs: &Tensor,
        host: &[f32],
        plan: &RoutePlan,
    ) -> Result<(Tensor, MoeLayerStats)> {
        let (n, e) = probs.dims2()?;
        // Load balancing: f (assignment fractions, constant) · P (mean router probability).
        let total = (n * self.cfg.top_k) as f32;
        let frac: Vec<f32> = plan.routed.iter().map(|&c| c as f32 / total).collect();
        let f = Tensor::from_vec(frac.clone(), e, probs.device())?.to_dtype(probs.dtype())?; // (E,)
        let p_mean = probs.mean(0)?; // (E,)
        let aux = ((p_mean * f)?.sum_all()? * e as f64)?;
        // z-loss: mean squared logsumexp of the router logits.
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
            losses: Tensor::stack(&[aux.detach(), z.detach()], 0)?.to_dtype(DType::F32)?,
        };
        Ok((weighted, stats))
    }
}
