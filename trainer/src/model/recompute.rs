//! Activation checkpointing (`training.gradient_checkpointing`): the training forward keeps only
//! each block's input, and the backward recomputes one block at a time.
//!
//! candle's autograd keeps every intermediate of a graph alive for as long as the loss tensor
//! refers to it, and has no way to drop part of a graph. So the checkpointed forward runs each
//! block as usual and then detaches its output: the block's intermediates are freed at once and
//! the next block starts from a tensor with no history. The loss is built on top of a variable
//! that stands for the last block's output, and the MoE router losses are variables too, so the
//! caller's `backward` stops at them. [`TrainPass::backward`] then walks the blocks from the
//! top: it recomputes block i from its saved input (now a variable), and back-propagates the
//! scalar Σ(y · g) + aux · g_aux, whose gradient is exactly the upstream gradient g of the block's
//! output (and g_aux of its router loss). That yields the block's parameter gradients and g of
//! its input, which is the upstream gradient of block i - 1. The embeddings come last with their
//! own, never detached, graph.
//!
//! The recompute must see the same randomness as the forward: dropout masks and router jitter
//! come from a sequential `DropoutRng`, so a copy of the generator is saved before each block
//! and the recompute draws from that copy. MoE routing is a function of the block's input, so
//! the same input routes the same tokens to the same experts. Autocast is a per-thread scope
//! that the trainer holds for the whole step, so the recompute runs at the forward's precision.
//!
//! Evaluation needs no graph at all: [`Gpt::forward_no_grad`] detaches every block's output, so
//! validation batches (and DPO's frozen reference) never hold more than one block's activations.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

use super::{DropoutRng, Gpt, ModelOutput};

/// A training forward pass and what its backward needs.
pub struct TrainPass<'m> {
    /// The logits and router losses to build the loss from (and the MoE statistics).
    pub output: ModelOutput,
    /// With checkpointing: the saved block inputs; `None` for the plain graph.
    tape: Option<Tape<'m>>,
}

struct Tape<'m> {
    model: &'m Gpt,
    /// The embeddings' output with its graph (the input of block 0, before detaching).
    embedded: Tensor,
    /// Per block, in order.
    blocks: Vec<Saved>,
    /// The variable standing for the last block's output, which the head reads.
    top: Var,
}

/// What recomputing one block needs.
struct Saved {
    /// The block's input, without history.
    input: Tensor,
    /// The dropout generator as the block found it.
    rng: Option<DropoutRng>,
    /// The variable standing for the block's weighted router loss (MoE blocks).
    aux: Option<Var>,
}

impl Gpt {
    /// The training forward: the plain graph, or with `checkpoint` the block inputs only.
    /// Build the loss from `output` and call [`TrainPass::backward`] with it.
    pub fn forward_train(
        &self,
        idx: &Tensor,
        mut dropout: Option<&mut DropoutRng>,
        checkpoint: bool,
    ) -> Result<TrainPass<'_>> {
        if !checkpoint {
            return Ok(TrainPass {
                output: self.forward(idx, dropout)?,
                tape: None,
            });
        }
        let embedded = self.embed(idx, dropout.as_deref_mut())?; // (B, T, D)
        let mut x = embedded.detach();
        let mut blocks = Vec::with_capacity(self.blocks().len());
        let mut aux: Option<Tensor> = None;
        let mut stats = Vec::new();
        for block in self.blocks() {
            let rng = dropout.as_deref().cloned();
            let (y, moe) = block.forward(&x, dropout.as_deref_mut())?;
            let aux_var = match moe {
                Some((loss, s)) => {
                    stats.push(s);
                    let var = Var::from_tensor(&loss.detach())?;
                    aux = Some(match aux {
                        Some(a) => (a + var.as_tensor())?,
                        None => var.as_tensor().clone(),
                    });
                    Some(var)
                }
                None => None,
            };
            blocks.push(Saved {
                input: x,
                rng,
                aux: aux_var,
            });
            // Dropping `y` with its history frees the block's activations.
            x = y.detach();
        }
        let top = Var::from_tensor(&x)?;
        drop(x);
        let logits = self.head(top.as_tensor())?;
        Ok(TrainPass {
            output: ModelOutput {
                logits,
                aux_loss: aux,
                moe: stats,
            },
            tape: Some(Tape {
                model: self,
                embedded,
                blocks,
                top,
            }),
        })
    }
}

impl Gpt {
    /// The forward of evaluation: `forward(idx, None)`'s values, with every block's output
    /// detached so that no block's activations outlive it. The weights are variables, so a
    /// plain forward records the whole graph, and an evaluation batch would need as much memory
    /// as a training step without checkpointing.
    pub fn forward_no_grad(&self, idx: &Tensor) -> Result<ModelOutput> {
        let mut x = self.embed(idx, None)?.detach(); // (B, T, D)
        let mut aux: Option<Tensor> = None;
        let mut stats = Vec::new();
        for block in self.blocks() {
            let (y, moe) = block.forward(&x, None)?;
            x = y.detach();
            if let Some((loss, s)) = moe {
                let loss = loss.detach();
                aux = Some(match aux {
                    Some(a) => (a + loss)?,
                    None => loss,
                });
                stats.push(s);
            }
        }
        Ok(ModelOutput {
            logits: self.head(&x)?.detach(),
            aux_loss: aux,
            moe: stats,
        })
    }
}

impl TrainPass<'_> {
    /// The gradients of `loss` (built from `self.output`) with respect to every variable.
    /// Takes both by value so the head's activations are freed before the blocks are
    /// recomputed: drop other handles to the logits or the loss first.
    pub fn backward(self, loss: Tensor) -> Result<GradStore> {
        let Some(tape) = self.tape else {
            return loss.backward();
        };
        let mut grads = variable_grads(&loss)?;
        drop(loss);
        drop(self.output);
        let mut upstream = grads.remove(tape.top.as_tensor());
        drop(tape.top);
        for (block, saved) in tape.model.blocks().iter().zip(tape.blocks).rev() {
            let g_aux = saved.aux.as_ref().and_then(|v| grads.remove(v.as_tensor()));
            if upstream.is_none() && g_aux.is_none() {
                continue; // nothing below depends on the loss through this block
            }
            let input = Var::from_tensor(&saved.input)?;
            drop(saved.input);
            let mut rng = saved.rng;
            let (y, moe) = block.forward(input.as_tensor(), rng.as_mut())?;
            let mut surrogate = match &upstream {
                Some(g) => Some((y * g)?.sum_all()?),
                None => None,
            };
            if let (Some(g), Some((aux, _))) = (&g_aux, moe) {
                let term = (aux * g)?;
                surrogate = Some(match surrogate {
                    Some(s) => (s + term)?,
                    None => term,
                });
            }
            let Some(surrogate) = surrogate else {
                continue; // only a block with a router has a router loss
            };
            let mut block_grads = variable_grads(&surrogate)?;
            upstream = block_grads.remove(input.as_tensor());
            grads.extend(block_grads)?;
        }
        if let Some(g) = upstream {
            grads.extend(variable_grads(&(tape.embedded * g)?.sum_all()?)?)?;
        }
        Ok(grads)
    }
}

/// The gradients of `root` with respect to the variables it depends on, and nothing else.
/// candle's backward also stores a gradient for every untracked operand of a product (here the
/// upstream gradient g, a dropout mask), computed from the tracked operand and so holding that
/// operand's whole graph; kept across blocks, those entries would keep every recomputed block's
/// activations alive until the end of the backward.
fn variable_grads(root: &Tensor) -> Result<GradStore> {
    let vars: Vec<Tensor> = root
        .sorted_nodes()
        .into_iter()
        .filter(|n| n.is_variable())
        .cloned()
        .collect();
    let mut all = root.backward()?;
    let mut kept = GradStore::default();
    for var in &vars {
        if let Some(g) = all.remove(var) {
            kept.insert(var, g.detach());
        }
    }
    Ok(kept)
}
