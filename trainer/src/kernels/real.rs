//! The element types of the fused kernels, and the glue from candle's CPU storage to them.
//!
//! Every kernel is written once for any `T: Real`; f32 runs the vectorised code of `simd`,
//! f64 (used by the finite-difference gradient checks) plain scalar code with libm.

use std::any::Any;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

use candle_core::{bail, Layout, Result, WithDType};

/// The float types the kernels support.
pub(crate) trait Real: WithDType {
    /// xs ← e^xs.
    fn exp_slice(xs: &mut [Self]);
    /// Σ xs.
    fn sum_slice(xs: &[Self]) -> Self;
    /// Σ a⊙b.
    fn dot_slice(a: &[Self], b: &[Self]) -> Self;
    /// Σ (x − c)².
    fn sq_dev_sum(xs: &[Self], c: Self) -> Self;
    /// out += the column sums of g (rows of c values) over columns c0..c0 + out.len(), each
    /// column in row order.
    fn add_column_sums(g: &[Self], c: usize, c0: usize, out: &mut [Self]);
    /// y ← tanh-GELU(x).
    fn gelu_slice(x: &[Self], y: &mut [Self]);
    /// dx ← g · gelu'(x).
    fn gelu_backward_slice(x: &[Self], g: &[Self], dx: &mut [Self]);
    /// y ← tanh-GELU(x) and x ← gelu'(x) (y only written), so that a backward needs only a
    /// product (`mul_slice`): the bits of `gelu_slice` and `gelu_backward_slice`.
    fn gelu_and_grad_slice(x: &mut [Self], y: &mut [MaybeUninit<Self>]);
    /// d ← d ⊙ s.
    fn mul_slice(d: &mut [Self], s: &[Self]);
    /// One row of the layer norm's forward (`norm::layer_norm_row`).
    fn layer_norm_row(x: &[Self], w: &[Self], b: &[Self], y: &mut [Self], eps: f64) {
        super::norm::layer_norm_row(x, w, b, y, eps)
    }
    /// One row of the layer norm's backward (`norm::layer_norm_backward_row`).
    fn layer_norm_backward_row(
        xgw: (&[Self], &[Self], &[Self]),
        dx: &mut [Self],
        dwb: (&mut [Self], &mut [Self]),
        scratch: (&mut [Self], &mut [Self]),
        eps: f64,
    ) {
        super::norm::layer_norm_backward_row(xgw, dx, dwb, scratch, eps)
    }
    /// xs ← softmax(xs): e^(x − max) over their sum (`sum_slice`), in place; nothing for an
    /// empty slice.
    fn softmax_slice(xs: &mut [Self]) {
        let Some(&first) = xs.first() else {
            return;
        };
        let max = xs.iter().fold(first, |m, &v| if v > m { v } else { m });
        for v in xs.iter_mut() {
            *v -= max;
        }
        Self::exp_slice(xs);
        let inv = Self::one() / Self::sum_slice(xs);
        for v in xs.iter_mut() {
            *v *= inv;
        }
    }
}

impl Real for f32 {
    fn exp_slice(xs: &mut [Self]) {
        super::simd::exp_inplace(xs)
    }
    fn sum_slice(xs: &[Self]) -> Self {
        super::simd::sum(xs)
    }
    fn dot_slice(a: &[Self], b: &[Self]) -> Self {
        super::simd::dot(a, b)
    }
    fn sq_dev_sum(xs: &[Self], c: Self) -> Self {
        super::simd::sq_dev_sum(xs, c)
    }
    fn add_column_sums(g: &[Self], c: usize, c0: usize, out: &mut [Self]) {
        super::simd::add_column_sums(g, c, c0, out)
    }
    fn gelu_slice(x: &[Self], y: &mut [Self]) {
        super::simd::gelu(x, y)
    }
    fn gelu_backward_slice(x: &[Self], g: &[Self], dx: &mut [Self]) {
        super::simd::gelu_backward(x, g, dx)
    }
    fn gelu_and_grad_slice(x: &mut [Self], y: &mut [MaybeUninit<Self>]) {
        super::simd::gelu_and_grad(x, y)
    }
    fn mul_slice(d: &mut [Self], s: &[Self]) {
        super::simd::mul(d, s)
    }
    fn softmax_slice(xs: &mut [Self]) {
        super::simd::softmax_inplace(xs)
    }
    fn layer_norm_row(x: &[Self], w: &[Self], b: &[Self], y: &mut [Self], eps: f64) {
        super::simd::layer_norm_row(x, w, b, y, eps)
    }
    fn layer_norm_backward_row(
        xgw: (&[Self], &[Self], &[Self]),
        dx: &mut [Self],
        dwb: (&mut [Self], &mut [Self]),
        scratch: (&mut [Self], &mut [Self]),
        eps: f64,
    ) {
        super::simd::layer_norm_backward_row(xgw, dx, dwb, scratch, eps)
    }
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044_715;

impl Real for f64 {
    fn exp_slice(xs: &mut [Self]) {
        for v in xs {
            *v = v.exp();
        }
    }
    fn sum_slice(xs: &[Self]) -> Self {
        xs.iter().sum()
    }
    fn dot_slice(a: &[Self], b: &[Self]) -> Self {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }
    fn sq_dev_sum(xs: &[Self], c: Self) -> Self {
        xs.iter().map(|&x| (x - c) * (x - c)).sum()
    }
    fn add_column_sums(g: &[Self], c: usize, c0: usize, out: &mut [Self]) {
        let c1 = c0 + out.len();
        for row in g.chunks_exact(c) {
            for (a, &v) in out.iter_mut().zip(&row[c0..c1]) {
                *a += v;
            }
        }
    }
    fn gelu_slice(x: &[Self], y: &mut [Self]) {
        for (yi, &v) in y.iter_mut().zip(x) {
            *yi = gelu_f64(v);
        }
    }
    fn gelu_backward_slice(x: &[Self], g: &[Self], dx: &mut [Self]) {
        for ((d, &v), &gv) in dx.iter_mut().zip(x).zip(g) {
            *d = gv * gelu_grad_f64(v);
        }
    }
    fn gelu_and_grad_slice(x: &mut [Self], y: &mut [MaybeUninit<Self>]) {
        for (yi, v) in y.iter_mut().zip(x) {
            yi.write(gelu_f64(*v));
            *v = gelu_grad_f64(*v);
        }
    }
    fn mul_slice(d: &mut [Self], s: &[Self]) {
        for (d, &s) in d.iter_mut().zip(s) {
            *d *= s;
        }
    }
}

/// tanh-GELU in f64: 0.5·v·(1 + tanh(k(v + c v³))).
fn gelu_f64(v: f64) -> f64 {
    0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + GELU_C * v * v * v)).tanh())
}

/// gelu'(v) in f64: gelu(x) = x·s with s = 0.5·(1 + tanh(u)) = sigmoid(2u), u = k(x + c x³),
/// so gelu' = s + x·ds/dx with ds/dx = 2 s (1 − s) du/dx.
fn gelu_grad_f64(v: f64) -> f64 {
    let s = 1.0 / (1.0 + (-2.0 * SQRT_2_OVER_PI * (v + GELU_C * v * v * v)).exp());
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * v * v);
    s + v * 2.0 * s * (1.0 - s) * du
}

/// The check of a two-input element-wise op, for its CPU and CUDA paths alike.
pub(crate) fn same_shape(op: &str, a: &Layout, b: &Layout) -> Result<()> {
    if a.shape() != b.shape() {
        bail!("{op}: shapes differ: {:?} vs {:?}", a.dims(), b.dims());
    }
    Ok(())
}

/// The contiguous data of a CPU tensor argument.
pub(crate) fn slice<'a, T>(data: &'a [T], layout: &Layout, op: &str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => bail!("{op}: input must be contiguous"),
    }
}

/// The f32 and f64 arms of a fused op's `cpu_fwd`: each `name = (storage, layout)` argument is
/// bound to its contiguous slice, and `body`, written once for any `T: Real`, makes the output.
/// Any other dtype, or mixed dtypes, is an error naming the op.
macro_rules! float_kernel {
    ($op:expr; $($v:ident = ($s:expr, $l:expr)),+ => $body:expr) => {
        match ($($s,)+) {
            ($(candle_core::CpuStorage::F32($v),)+) => {
                $(let $v = $crate::kernels::real::slice($v, $l, $op)?;)+
                candle_core::CpuStorage::F32($body)
            }
            ($(candle_core::CpuStorage::F64($v),)+) => {
                $(let $v = $crate::kernels::real::slice($v, $l, $op)?;)+
                candle_core::CpuStorage::F64($body)
            }
            _ => candle_core::bail!("{}: f32 or f64 only, same dtype", $op),
        }
    };
}
pub(crate) use float_kernel;

/// A buffer an op's forward keeps for its backward, in the forward's element type. The op
/// instance stays in candle's graph, so its backward finds what its forward kept; clones share
/// the buffer.
#[derive(Clone, Default)]
pub(crate) struct Stash(Arc<Mutex<Option<Box<dyn Any + Send>>>>);

impl Stash {
    /// Keeps `values`, replacing what was kept before.
    pub(crate) fn keep<T: Real>(&self, values: Vec<T>) {
        // A poisoned lock only means a panicked holder; the slot is replaced whole.
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *slot = Some(Box::new(values));
    }

    /// `f` of the kept values; an error naming `op` when nothing of type T was kept.
    pub(crate) fn with<T: Real, R>(
        &self,
        op: &str,
        f: impl FnOnce(&[T]) -> Result<R>,
    ) -> Result<R> {
        let slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some(values) = slot.as_ref().and_then(|v| v.downcast_ref::<Vec<T>>()) else {
            bail!("{op}: backward without a forward in the same dtype");
        };
        f(values)
    }
}
