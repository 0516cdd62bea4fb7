//! A residual branch as one op: y = x + f_n(… f_2(f_1(x))), each f_i a fused op with its own
//! tensors (a pre-norm block's half: LayerNorm, then attention with its projections, or the
//! GELU MLP).
//!
//! Why one op: every tensor that is an edge of candle's graph costs, in the backward, a
//! zero-filled gradient buffer and an add into it per use (candle's `GradStore::or_insert`
//! then `add`). A block's half as separate ops has five such (B, T, D) edges: x twice (the norm
//! and the residual add), the norm's output, the attention's output and the branch's output;
//! the residual add itself is one more pass forward. Here x is the only edge: the steps run
//! on tensors outside the graph, and the backward calls each step's own backward in reverse,
//! adding dL/dy to the branch's dL/dx once. The steps' tensors reach the graph through links
//! (`link.rs`). Every value comes from the same kernels in the same order as the separate
//! ops, and the two terms of dL/dx are the same two numbers added, so it is the same bits.

use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Storage, Tensor};

use super::link::{self, Held};
use super::parallel::{for_each_block, SharedMut};
use super::real::{float_kernel, Real};

/// One fused op of a residual branch, run outside candle's graph.
pub trait Step: Send + Sync {
    /// The op's tensors besides its input (parameters), in a fixed order.
    fn tensors(&self) -> Vec<Tensor>;
    /// y = f(x), keeping in the step what its backward needs.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// dL/dx and dL/d(each of `tensors()`, in order), from x, y = f(x) and g = dL/dy.
    fn backward(&self, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<(Tensor, Vec<Tensor>)>;
}

/// x + f_n(… f_1(x)) for x (.., D) and steps that map (.., D) to (.., D), as one graph node
/// on x and the steps' tensors (see the module doc). CPU tensors in f32 or f64 only: the
/// steps are the fused CPU ops.
pub fn residual(x: &Tensor, steps: Vec<Box<dyn Step>>) -> Result<Tensor> {
    if !x.device().is_cpu() {
        bail!("residual: the fused branch runs on the CPU only");
    }
    let tensors: Vec<Tensor> = steps.iter().flat_map(|s| s.tensors()).collect();
    if tensors.len() < 2 {
        bail!(
            "residual: the steps have {} tensors, at least two are needed",
            tensors.len()
        );
    }
    let x = x.contiguous()?;
    // values[i] is step i's input, the last one the branch's output.
    let mut values = vec![x.detach()];
    for step in &steps {
        let y = step.forward(&values[values.len() - 1])?;
        values.push(y);
    }
    let branch = &values[values.len() - 1];
    if branch.shape() != x.shape() {
        bail!(
            "residual: the branch maps {:?} to {:?}",
            x.dims(),
            branch.dims()
        );
    }
    let grads: Held = Arc::new(Mutex::new(vec![None; tensors.len()]));
    let chain = link::chain(&tensors, &grads, "residual-link")?; // (1,)
    let op = Residual {
        steps: Arc::new(steps),
        values: Arc::new(values),
        grads,
    };
    x.apply_op3(&tensors[0], &chain, op) // (.., D)
}

/// The op on (x, the steps' first tensor, the last link).
#[derive(Clone)]
struct Residual {
    steps: Arc<Vec<Box<dyn Step>>>,
    /// Each step's input (x, detached, first), then the branch's output.
    values: Arc<Vec<Tensor>>,
    /// The gradients of the steps' tensors, from the backward, for the links' backward.
    grads: Held,
}

impl std::fmt::Debug for Residual {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Residual({} steps)", self.steps.len())
    }
}

impl Residual {
    /// x + the branch's output (kept from `residual`).
    fn output<T: Real>(&self, x: &[T]) -> Result<Vec<T>> {
        let (storage, layout) = self.values[self.values.len() - 1].storage_and_layout();
        let branch = match &*storage {
            Storage::Cpu(cpu) => {
                super::real::slice(T::cpu_storage_as_slice(cpu)?, layout, "residual")?
            }
            _ => bail!("residual: the fused branch runs on the CPU only"),
        };
        sum(x, branch)
    }
}

/// a + b element by element (the forward's x + branch), in parallel chunks, each written once
/// (never zeroed first).
fn sum<T: Real>(a: &[T], b: &[T]) -> Result<Vec<T>> {
    if a.len() != b.len() {
        bail!("residual: adding {} values to {}", b.len(), a.len());
    }
    const CHUNK: usize = 16 * 1024;
    let n = a.len();
    let mut out = Vec::<T>::with_capacity(n);
    let dst = SharedMut(out.as_mut_ptr());
    for_each_block(n.div_ceil(CHUNK), n, |i| {
        let (start, end) = (i * CHUNK, n.min((i + 1) * CHUNK));
        // SAFETY: elements start..end of `out`'s capacity belong to this chunk alone.
        let chunk = unsafe {
            std::slice::from_raw_parts_mut(
                dst.ptr().add(start).cast::<MaybeUninit<T>>(),
                end - start,
            )
        };
        for ((o, &a), &b) in chunk.iter_mut().zip(&a[start..end]).zip(&b[start..end]) {
            o.write(a + b);
        }
        Ok(())
    })?;
    // SAFETY: the chunks cover 0..n and each wrote all of its elements.
    unsafe { out.set_len(n) };
    Ok(out)
}

impl CustomOp3 for Residual {
    fn name(&self) -> &'static str {
        "residual"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let name = self.name();
        let out = float_kernel!(name; x = (s1, l1), _first = (s2, l2), _link = (s3, l3) => self.output(x)?);
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _first: &Tensor,
        link: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = grad.contiguous()?; // (.., D)
                                    // Back through the steps, last first: dL/d(step input) from dL/d(step output).
        let mut d = g.clone();
        let mut per_step = Vec::with_capacity(self.steps.len());
        for (i, step) in self.steps.iter().enumerate().rev() {
            let (dx, dt) = step.backward(&self.values[i], &self.values[i + 1], &d)?;
            per_step.push(dt);
            d = dx.contiguous()?;
        }
        // dL/dx = g (the identity path) + the branch's dL/dx: candle's add, on tensors outside
        // the graph.
        let dx = (&g + &d)?;
        let mut all: Vec<Option<Tensor>> = per_step.into_iter().rev().flatten().map(Some).collect();
        let Some(first) = all.first_mut().and_then(Option::take) else {
            bail!("residual: the steps gave no gradients for their tensors");
        };
        *self.grads.lock().unwrap_or_else(|p| p.into_inner()) = all;
        Ok((Some(dx), Some(first), Some(link.zeros_like()?)))
    }
}

/// A step that is a three-input fused op on (x, a, b): LayerNorm (weight, bias), the linear
/// layer (weight, bias), the q/k/v projection with the attention (weight, bias).
pub(crate) struct Op3Step<C> {
    op: C,
    a: Tensor,
    b: Tensor,
}

impl<C: CustomOp3 + Send + Sync + 'static> Op3Step<C> {
    pub(crate) fn boxed(op: C, a: &Tensor, b: &Tensor) -> Result<Box<dyn Step>> {
        Ok(Box::new(Op3Step {
            op,
            a: a.contiguous()?,
            b: b.contiguous()?,
        }))
    }
}

impl<C: CustomOp3 + Send + Sync> Step for Op3Step<C> {
    fn tensors(&self) -> Vec<Tensor> {
        vec![self.a.clone(), self.b.clone()]
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.apply_op3_no_bwd(&self.a, &self.b, &self.op)
    }

    fn backward(&self, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let name = self.op.name();
        match self.op.bwd(x, &self.a, &self.b, y, g)? {
            (Some(dx), Some(da), Some(db)) => Ok((dx, vec![da, db])),
            _ => bail!("residual: {name} gave no gradient for one of its inputs"),
        }
    }
}
