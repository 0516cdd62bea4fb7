//! The AdamW update of one f32 CPU tensor, in place:
//!
//!   m ← β1·m + (1−β1)·g
//!   v ← β2·v + (1−β2)·g²
//!   w ← shrink·w − (lr/bc1)·m / (√v · (1/√bc2) + ε)
//!
//! with bc1, bc2 Adam's bias corrections and shrink = 1 − lr·weight_decay (1 without decay).
//!
//! From candle ops this was about a dozen element-wise passes per tensor, each writing a fresh
//! buffer: the optimizer moved some 40 tensor-sizes of memory per parameter per step, as much
//! as a few layers' GEMMs for a large MoE. Here it is three passes that write m, v and w where
//! they are. Each value is computed with the same f32 operations in the same order as the
//! candle-op version (`optim::adamw` keeps it for other devices and dtypes), so the results are
//! the same bits.

use candle_core::{bail, CpuStorage, InplaceOp2, InplaceOp3, Layout, Result, Tensor};

use super::parallel::{for_each_block, SharedMut};
use super::real::slice;

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

/// Whether `update` runs for these tensors: all f32, contiguous, on the CPU.
pub fn available(w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor) -> bool {
    [w, g, m, v]
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == candle_core::DType::F32 && t.is_contiguous())
        && [g, m, v].iter().all(|t| t.shape() == w.shape())
}

/// One AdamW step of w with gradient g and moments m, v, all updated in place (see `available`).
pub fn update(w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, k: AdamWStep) -> Result<()> {
    m.inplace_op2(g, &Moment::First(k.beta1))?;
    v.inplace_op2(g, &Moment::Second(k.beta2))?;
    w.inplace_op3(m, v, &Apply(k))
}

/// Elements per parallel block.
const BLOCK: usize = 16 * 1024;

/// dst[i] ← f(dst[i], a[i], b[i]) for every i, in parallel blocks.
fn for_each_in_place(
    dst: &mut [f32],
    a: &[f32],
    b: &[f32],
    f: impl Fn(f32, f32, f32) -> f32 + Sync,
) -> Result<()> {
    let n = dst.len();
    if a.len() != n || b.len() != n {
        bail!("adamw: parameter, gradient and moments differ in size");
    }
    let out = SharedMut(dst.as_mut_ptr());
    for_each_block(n.div_ceil(BLOCK), n, |blk| {
        let (lo, hi) = (blk * BLOCK, n.min((blk + 1) * BLOCK));
        // SAFETY: elements lo..hi of dst belong to this block alone; dst outlives the loop.
        let d = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(lo), hi - lo) };
        apply(d, &a[lo..hi], &b[lo..hi], &f);
        Ok(())
    })
}

/// The loop of one block. A function of its own so that `d` is a `&mut` argument, which the
/// compiler knows aliases nothing else: only then does it keep the step's constants in
/// registers and vectorise (inlined into the block closure, the loop was scalar and several
/// times slower than the tensor ops it replaced).
#[inline(never)]
fn apply(d: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32, f32) -> f32) {
    for ((x, &av), &bv) in d.iter_mut().zip(a).zip(b) {
        *x = f(*x, av, bv);
    }
}

/// The f32 data of a CPU argument.
fn f32s<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => slice(v, l, op),
        _ => bail!("{op}: f32 only"),
    }
}

/// The mutable f32 data of a CPU destination.
fn f32s_mut<'a>(s: &'a mut CpuStorage, l: &Layout, op: &str) -> Result<&'a mut [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((start, end))) => Ok(&mut v[start..end]),
        _ => bail!("{op}: a contiguous f32 destination only"),
    }
}

/// m ← β1·m + (1−β1)·g, or v ← β2·v + (1−β2)·g², in place.
enum Moment {
    First(f64),
    Second(f64),
}

impl InplaceOp2 for Moment {
    fn name(&self) -> &'static str {
        "adamw-moment"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let name = InplaceOp2::name(self);
        let (moment, g) = (f32s_mut(s1, l1, name)?, f32s(s2, l2, name)?);
        // As candle's `affine(mul, 0)` computes it: x·mul + 0, mul cast to f32 first. The
        // moments read one operand, g (given twice).
        match *self {
            Moment::First(beta) => {
                let (keep, take) = (beta as f32, (1.0 - beta) as f32);
                for_each_in_place(moment, g, g, move |m, g, _| {
                    (m * keep + 0.0) + (g * take + 0.0)
                })
            }
            Moment::Second(beta) => {
                let (keep, take) = (beta as f32, (1.0 - beta) as f32);
                for_each_in_place(moment, g, g, move |v, g, _| {
                    (v * keep + 0.0) + ((g * g) * take + 0.0)
                })
            }
        }
    }
}

/// w ← shrink·w − (lr/bc1)·m / (√v·(1/√bc2) + ε), in place, from the updated m and v.
struct Apply(AdamWStep);

impl InplaceOp3 for Apply {
    fn name(&self) -> &'static str {
        "adamw-apply"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let name = InplaceOp3::name(self);
        let w = f32s_mut(s1, l1, name)?;
        let (m, v) = (f32s(s2, l2, name)?, f32s(s3, l3, name)?);
        let k = self.0;
        let (lr_bc1, inv_sqrt_bc2, eps) = (k.lr_bc1 as f32, k.inv_sqrt_bc2 as f32, k.eps as f32);
        let shrink = k.shrink.map(|s| s as f32);
        for_each_in_place(w, m, v, move |w, m, v| {
            let denom = v.sqrt() * inv_sqrt_bc2 + eps;
            let step = (m * lr_bc1 + 0.0) / denom;
            let decayed = match shrink {
                Some(s) => w * s + 0.0,
                None => w,
            };
            decayed - step
        })
    }
}
