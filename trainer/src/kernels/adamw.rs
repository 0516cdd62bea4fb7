//! The AdamW update of f32 CPU tensors, in place:
//!
//!   m ← β1·m + (1−β1)·g
//!   v ← β2·v + (1−β2)·g²
//!   w ← shrink·w − (lr/bc1)·m / (√v · (1/√bc2) + ε)
//!
//! with bc1, bc2 Adam's bias corrections and shrink = 1 − lr·weight_decay (1 without decay).
//!
//! From candle ops this was about a dozen element-wise passes per tensor, each writing a fresh
//! buffer. Here each element of w, m and v is read and written once, and the parameters run
//! in groups, each group's tensors in one parallel section: with three passes per tensor, an
//! 8-expert MoE spent some 500 parallel sections per step in the optimizer, most of them on
//! tensors of a few hundred kilobytes, where waking and waiting for the pool is a large part
//! of the work. Each value is computed with the same f32 operations in the same order as the
//! candle-op version (`optim::adamw` keeps it for other devices and dtypes), so the results
//! are the same bits.
//!
//! candle hands out one writable tensor per in-place op, and the update writes three per
//! parameter. So each tensor of a group is write-locked by one nested `inplace_op1` call, and
//! the innermost call runs the section with all of them held. The nesting is as deep as the
//! group has tensors, which `GROUP` bounds.

use std::cell::RefCell;
use std::collections::HashSet;

use candle_core::{bail, CpuStorage, InplaceOp1, Layout, Result, Storage, Tensor};

use super::parallel::{for_each_block, SharedMut};
use super::real::slice;
use super::simd::multiversion;

/// The constants of one step, as the update uses them (f64, cast where the candle ops cast).
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// lr / bc1.
    pub lr_bc1: f64,
    /// 1 / √bc2.
    pub inv_sqrt_bc2: f64,
    /// 1 − lr·weight_decay, or None when the tensor is not decayed.
    pub shrink: Option<f64>,
}

/// One parameter's update: its weights w, gradient g and moments m, v, all of one shape.
pub struct Update<'a> {
    pub w: &'a Tensor,
    pub g: &'a Tensor,
    pub m: &'a Tensor,
    pub v: &'a Tensor,
    pub step: AdamWStep,
}

/// Whether `update_all` takes these tensors: all f32, contiguous, on the CPU.
pub fn available(w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor) -> bool {
    [w, g, m, v]
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == candle_core::DType::F32 && t.is_contiguous())
        && [g, m, v].iter().all(|t| t.shape() == w.shape())
}

/// Parameters per parallel section: three nested locks each, so the recursion stays a few
/// hundred frames deep at most, while a model of a few hundred tensors needs a handful of
/// sections.
const GROUP: usize = 48;

/// Elements per parallel block.
const BLOCK: usize = 16 * 1024;

/// One AdamW step of every update (each one's tensors as `available` requires), in place.
/// Tensors that the updates write (every w, m and v) must not share storage with each other
/// or with a gradient; such updates are refused with an error, before anything is written.
pub fn update_all<'a>(updates: &[Update<'a>]) -> Result<()> {
    let updates: Vec<&Update> = updates.iter().filter(|u| u.w.elem_count() > 0).collect();
    let written = |us: &[&Update<'a>]| -> Vec<&'a Tensor> {
        us.iter().flat_map(|u| [u.w, u.m, u.v]).collect()
    };
    let grads: Vec<&Tensor> = updates.iter().map(|u| u.g).collect();
    distinct(&written(&updates), &grads)?;
    for group in updates.chunks(GROUP) {
        let written = written(group);
        let held = RefCell::new(Vec::with_capacity(written.len()));
        let run = |slices: &[Held]| update_group(group, slices);
        match written.split_first() {
            Some((first, rest)) => first.inplace_op1(&Nest {
                rest,
                held: &held,
                run: &run,
            })?,
            None => continue,
        }
    }
    Ok(())
}

/// Refuses written tensors that share an allocation, and gradients that share one with a
/// written tensor: locking the second would wait forever for the first (and the update would
/// write the same values twice, or read what it is writing).
fn distinct(written: &[&Tensor], grads: &[&Tensor]) -> Result<()> {
    let key = |t: &Tensor| -> Result<usize> {
        let (storage, _) = t.storage_and_layout();
        match &*storage {
            Storage::Cpu(CpuStorage::F32(v)) => Ok(v.as_ptr() as usize),
            _ => bail!("adamw: the CPU update takes f32 tensors on the CPU only"),
        }
    };
    let mut seen = HashSet::with_capacity(written.len());
    for t in written {
        if !seen.insert(key(t)?) {
            bail!("adamw: two parameters or moments share storage, so they cannot be updated in place");
        }
    }
    for g in grads {
        if seen.contains(&key(g)?) {
            bail!("adamw: a gradient shares storage with a parameter or a moment, so they cannot be updated in place");
        }
    }
    Ok(())
}

/// A locked tensor's f32 data: (start, length).
type Held = (SharedMut<f32>, usize);

/// Write-locks the tensor it is applied to, records its data, then locks `rest` the same way;
/// the innermost call runs `run` on every tensor's data, in the order locked.
struct Nest<'a> {
    rest: &'a [&'a Tensor],
    held: &'a RefCell<Vec<Held>>,
    run: &'a dyn Fn(&[Held]) -> Result<()>,
}

impl InplaceOp1 for Nest<'_> {
    fn name(&self) -> &'static str {
        "adamw"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let data = match (storage, layout.contiguous_offsets()) {
            (CpuStorage::F32(v), Some((start, end))) => &mut v[start..end],
            _ => bail!("adamw: a contiguous f32 tensor only"),
        };
        self.held
            .borrow_mut()
            .push((SharedMut(data.as_mut_ptr()), data.len()));
        // `data` is not used again until this returns: the nested calls and the section write
        // through the recorded pointer while this call's lock is held.
        match self.rest.split_first() {
            Some((next, rest)) => next.inplace_op1(&Nest {
                rest,
                held: self.held,
                run: self.run,
            }),
            None => (self.run)(&self.held.borrow()),
        }
    }
}

/// The section of one group: `held` is (w, m, v) of each update in turn, all locked.
fn update_group(group: &[&Update], held: &[Held]) -> Result<()> {
    let grads: Vec<_> = group.iter().map(|u| u.g.storage_and_layout()).collect();
    let mut gs = Vec::with_capacity(grads.len());
    for (storage, layout) in &grads {
        match &**storage {
            Storage::Cpu(CpuStorage::F32(v)) => gs.push(slice(v, layout, "adamw")?),
            _ => bail!("adamw: the CPU update takes f32 gradients on the CPU only"),
        }
    }
    let mut blocks = Vec::new();
    for (i, g) in gs.iter().enumerate() {
        let n = g.len();
        if held[3 * i..3 * i + 3].iter().any(|&(_, len)| len != n) {
            bail!("adamw: parameter, gradient and moments differ in size");
        }
        blocks.extend((0..n).step_by(BLOCK).map(|lo| (i, lo, n.min(lo + BLOCK))));
    }
    let work = gs.iter().map(|g| g.len()).sum();
    for_each_block(blocks.len(), work, |b| {
        let (i, lo, hi) = blocks[b];
        let at = |j: usize| {
            // SAFETY: elements lo..hi of update i's w, m and v (distinct allocations, locked
            // for the whole section) belong to this block alone.
            unsafe { std::slice::from_raw_parts_mut(held[3 * i + j].0.ptr().add(lo), hi - lo) }
        };
        step_slices(
            at(0),
            at(1),
            at(2),
            &gs[i][lo..hi],
            Constants::of(group[i].step),
        );
        Ok(())
    })
}

/// The step's constants in f32, as candle's `affine(mul, add)` casts them.
#[derive(Clone, Copy)]
pub struct Constants {
    keep1: f32,
    take1: f32,
    keep2: f32,
    take2: f32,
    lr_bc1: f32,
    inv_sqrt_bc2: f32,
    eps: f32,
    shrink: Option<f32>,
}

impl Constants {
    fn of(k: AdamWStep) -> Self {
        Constants {
            keep1: k.beta1 as f32,
            take1: (1.0 - k.beta1) as f32,
            keep2: k.beta2 as f32,
            take2: (1.0 - k.beta2) as f32,
            lr_bc1: k.lr_bc1 as f32,
            inv_sqrt_bc2: k.inv_sqrt_bc2 as f32,
            eps: k.eps as f32,
            shrink: k.shrink.map(|s| s as f32),
        }
    }
}

multiversion! {
    /// One block of the update: m, v, then w, element by element.
    pub fn step_slices(w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: Constants) => step_impl
}

/// The candle ops' arithmetic (`moments` updates m and v and returns the step), each
/// `affine(mul, 0)` as x·mul + 0 (which turns −0 into +0, so the `+ 0.0` stays). The decay is
/// chosen outside the loop so the loop vectorises. Compiled per instruction set like `simd`'s
/// kernels: the same IEEE operations in every variant (no fused multiply-add), so the same bits.
#[inline(always)]
fn step_impl(w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: Constants) {
    let moments = |m: &mut f32, v: &mut f32, g: f32| {
        *m = (*m * k.keep1 + 0.0) + (g * k.take1 + 0.0);
        *v = (*v * k.keep2 + 0.0) + ((g * g) * k.take2 + 0.0);
        let denom = v.sqrt() * k.inv_sqrt_bc2 + k.eps;
        (*m * k.lr_bc1 + 0.0) / denom
    };
    let items = w.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g);
    match k.shrink {
        Some(s) => {
            for (((w, m), v), &g) in items {
                let step = moments(m, v, g);
                *w = (*w * s + 0.0) - step;
            }
        }
        None => {
            for (((w, m), v), &g) in items {
                let step = moments(m, v, g);
                *w -= step;
            }
        }
    }
}
