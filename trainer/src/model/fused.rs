//! Fused CPU kernels with their own backward pass, for the ops that cost most when built from
//! candle primitives: the attention's scaled, causally masked softmax and the tanh-GELU.
//!
//! Each primitive op allocates its output and, on big tensors, synchronises candle's worker
//! threads at a barrier; the composite softmax is about 6 ops forward and 15 backward over a
//! (B·H, T, T) tensor, GELU about 12 backward. Here each direction is one pass over the data.
//! CPU only, f32 and f64 (f64 for finite-difference gradient checks); callers keep the
//! primitive path for other devices (`use_fused`).

use std::sync::Mutex;

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType,
};

/// Below this many elements an op runs on the calling thread: waking the pool costs more.
pub(crate) const PAR_MIN_ELEMS: usize = 64 * 1024;

/// Whether the fused kernels apply to `x`: CPU storage in f32 or f64.
pub fn use_fused(x: &Tensor) -> bool {
    x.device().is_cpu() && matches!(x.dtype(), candle_core::DType::F32 | candle_core::DType::F64)
}

/// The float types the kernels support. f32 runs the vectorised kernels of `simd`; f64 (used
/// by the finite-difference gradient checks) keeps plain scalar code with libm.
pub(crate) trait Real: WithDType {
    /// xs ← e^xs.
    fn exp_slice(xs: &mut [Self]);
    /// Σ xs.
    fn sum_slice(xs: &[Self]) -> Self;
    /// Σ a⊙b.
    fn dot_slice(a: &[Self], b: &[Self]) -> Self;
    /// y ← tanh-GELU(x).
    fn gelu_slice(x: &[Self], y: &mut [Self]);
    /// dx ← g · gelu'(x).
    fn gelu_backward_slice(x: &[Self], g: &[Self], dx: &mut [Self]);
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
    fn gelu_slice(x: &[Self], y: &mut [Self]) {
        super::simd::gelu(x, y)
    }
    fn gelu_backward_slice(x: &[Self], g: &[Self], dx: &mut [Self]) {
        super::simd::gelu_backward(x, g, dx)
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
    fn gelu_slice(x: &[Self], y: &mut [Self]) {
        for (yi, &v) in y.iter_mut().zip(x) {
            *yi = 0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + GELU_C * v * v * v)).tanh());
        }
    }
    fn gelu_backward_slice(x: &[Self], g: &[Self], dx: &mut [Self]) {
        for ((d, &v), &gv) in dx.iter_mut().zip(x).zip(g) {
            // gelu(x) = x·s with s = 0.5·(1 + tanh(u)) = sigmoid(2u), u = k(x + c x³), so
            // ds/dx = 2 s (1 − s) du/dx.
            let s = 1.0 / (1.0 + (-2.0 * SQRT_2_OVER_PI * (v + GELU_C * v * v * v)).exp());
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * v * v);
            *d = gv * (s + v * 2.0 * s * (1.0 - s) * du);
        }
    }
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
                $(let $v = $crate::model::fused::slice($v, $l, $op)?;)+
                candle_core::CpuStorage::F32($body)
            }
            ($(candle_core::CpuStorage::F64($v),)+) => {
                $(let $v = $crate::model::fused::slice($v, $l, $op)?;)+
                candle_core::CpuStorage::F64($body)
            }
            _ => candle_core::bail!("{}: f32 or f64 only, same dtype", $op),
        }
    };
}
pub(crate) use float_kernel;

/// Fills `out` row by row (`cols` values each) with `f(row_index, row)`, on candle's thread
/// pool when the tensor is big enough.
pub(crate) fn for_each_row<T: Send, F>(out: &mut [T], cols: usize, f: F)
where
    F: Fn(usize, &mut [T]) + Sync,
{
    if cols == 0 {
        return;
    }
    if out.len() < PAR_MIN_ELEMS || candle_core::utils::get_num_threads() <= 1 {
        for (r, row) in out.chunks_mut(cols).enumerate() {
            f(r, row);
        }
        return;
    }
    // ~16 KiB-element blocks of whole rows; each block is taken by one thread.
    let rows_per_block = (16 * 1024 / cols).max(1);
    let blocks: Vec<Mutex<&mut [T]>> = out
        .chunks_mut(rows_per_block * cols)
        .map(Mutex::new)
        .collect();
    candle_core::utils::barrier_pool().execute_chunked(blocks.len(), |range| {
        for b in range {
            // Each block is locked exactly once, so this never waits.
            if let Ok(mut block) = blocks[b].lock() {
                for (i, row) in block.chunks_mut(cols).enumerate() {
                    f(b * rows_per_block + i, row);
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Scaled causal softmax.

/// softmax(scale · x + causal mask) over the last dim of (.., T, T) scores: entries above the
/// diagonal of each T×T matrix get probability 0.
#[derive(Debug, Clone, Copy)]
pub struct CausalSoftmax {
    pub scale: f64,
}

fn causal_softmax_rows<T: Real>(x: &[T], t: usize, scale: f64) -> Vec<T> {
    let scale = T::from_f64(scale);
    let mut out = vec![T::zero(); x.len()];
    for_each_row(&mut out, t, |r, y| {
        let keep = r % t + 1; // query position i sees keys 0..=i
        let xr = &x[r * t..r * t + keep];
        let mut max = xr[0] * scale;
        for &v in &xr[1..] {
            if v * scale > max {
                max = v * scale;
            }
        }
        for (yi, &v) in y[..keep].iter_mut().zip(xr) {
            *yi = v * scale - max;
        }
        T::exp_slice(&mut y[..keep]);
        let inv = T::one() / T::sum_slice(&y[..keep]);
        for yi in &mut y[..keep] {
            *yi *= inv;
        }
    });
    out
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = layout.dims();
        let t = dims[dims.len() - 1];
        if dims.len() < 2 || dims[dims.len() - 2] != t {
            bail!("causal-softmax: expected (.., T, T) scores, got {:?}", dims);
        }
        let out = float_kernel!(self.name(); v = (storage, layout) => causal_softmax_rows(v, t, self.scale));
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let g = grad_res.contiguous()?;
        Ok(Some(res.apply_op2_no_bwd(
            &g,
            &SoftmaxBackward { scale: self.scale },
        )?))
    }
}

/// dx = scale · y ⊙ (g − Σ g⊙y) per row, from the softmax output y and its gradient g.
#[derive(Debug, Clone, Copy)]
struct SoftmaxBackward {
    scale: f64,
}

fn softmax_backward_rows<T: Real>(y: &[T], g: &[T], cols: usize, scale: f64) -> Vec<T> {
    let scale = T::from_f64(scale);
    let mut out = vec![T::zero(); y.len()];
    for_each_row(&mut out, cols, |r, dx| {
        let yr = &y[r * cols..(r + 1) * cols];
        let gr = &g[r * cols..(r + 1) * cols];
        let dot = T::dot_slice(yr, gr);
        for ((d, &a), &b) in dx.iter_mut().zip(yr).zip(gr) {
            *d = scale * a * (b - dot);
        }
    });
    out
}

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "softmax-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if l1.shape() != l2.shape() {
            bail!(
                "softmax-backward: shapes differ: {:?} vs {:?}",
                l1.dims(),
                l2.dims()
            );
        }
        let cols = l1.dims().last().copied().unwrap_or(1);
        let n = self.name();
        let out = float_kernel!(n; y = (s1, l1), g = (s2, l2) => softmax_backward_rows(y, g, cols, self.scale));
        Ok((out, l1.shape().clone()))
    }
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2).

/// 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 x³))).
#[derive(Debug, Clone, Copy)]
pub struct GeluTanh;

fn gelu_rows<T: Real>(x: &[T]) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    let cols = 1024.min(x.len().max(1));
    for_each_row(&mut out, cols, |r, y| {
        T::gelu_slice(&x[r * cols..r * cols + y.len()], y);
    });
    out
}

impl CustomOp1 for GeluTanh {
    fn name(&self) -> &'static str {
        "gelu-tanh"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = float_kernel!(self.name(); v = (storage, layout) => gelu_rows(v));
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let g = grad_res.contiguous()?;
        Ok(Some(arg.contiguous()?.apply_op2_no_bwd(&g, &GeluBackward)?))
    }
}

/// dx = g · d/dx gelu(x).
#[derive(Debug, Clone, Copy)]
struct GeluBackward;

fn gelu_backward_rows<T: Real>(x: &[T], g: &[T]) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    let cols = 1024.min(x.len().max(1));
    for_each_row(&mut out, cols, |r, dx| {
        let start = r * cols;
        T::gelu_backward_slice(&x[start..start + dx.len()], &g[start..start + dx.len()], dx);
    });
    out
}

impl CustomOp2 for GeluBackward {
    fn name(&self) -> &'static str {
        "gelu-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if l1.shape() != l2.shape() {
            bail!(
                "gelu-backward: shapes differ: {:?} vs {:?}",
                l1.dims(),
                l2.dims()
            );
        }
        let n = self.name();
        let out = float_kernel!(n; x = (s1, l1), g = (s2, l2) => gelu_backward_rows(x, g));
        Ok((out, l1.shape().clone()))
    }
}

/// Scaled causal softmax of (.., T, T) scores; fused on CPU.
pub fn causal_softmax(scores: &Tensor, scale: f64) -> Result<Tensor> {
    scores.contiguous()?.apply_op1(CausalSoftmax { scale })
}

/// tanh-GELU; fused on CPU.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(GeluTanh)
}

// ---------------------------------------------------------------------------------------------
// Bias add.

/// (N, C) + (C,). candle's broadcast add is fine forward, but its backward reduces the
/// (N, C) gradient over N with a strided fold; here the bias gradient is summed row by row.
#[derive(Debug, Clone, Copy)]
struct AddBias;

fn add_bias_rows<T: Real>(x: &[T], b: &[T]) -> Vec<T> {
    let mut out = x.to_vec();
    for row in out.chunks_mut(b.len()) {
        for (o, &bv) in row.iter_mut().zip(b) {
            *o += bv;
        }
    }
    out
}

impl CustomOp2 for AddBias {
    fn name(&self) -> &'static str {
        "add-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, c) = l1.shape().dims2()?;
        if l2.dims() != [c] {
            bail!(
                "add-bias: bias {:?} does not match {:?}",
                l2.dims(),
                l1.dims()
            );
        }
        let n = self.name();
        let out = float_kernel!(n; x = (s1, l1), b = (s2, l2) => add_bias_rows(x, b));
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = grad_res.contiguous()?; // (N, C)
        let grad_b = g.apply_op1_no_bwd(&SumRows)?; // (C,)
        Ok((Some(g), Some(grad_b)))
    }
}

/// (N, C) → (C,): the sum over rows, accumulated one contiguous row at a time.
#[derive(Debug, Clone, Copy)]
struct SumRows;

fn sum_rows<T: Real>(g: &[T], c: usize) -> Result<Vec<T>> {
    // Column blocks in parallel; each sums its columns over all rows, in row order.
    const BLOCK_COLS: usize = 64;
    let rows = g.len() / c.max(1);
    let mut acc = vec![T::zero(); c];
    let acc_ptr = super::cpu_gemm::SharedMut(acc.as_mut_ptr());
    super::cpu_gemm::try_for_each(c.div_ceil(BLOCK_COLS), BLOCK_COLS * rows, |blk| {
        let (c0, c1) = (blk * BLOCK_COLS, c.min((blk + 1) * BLOCK_COLS));
        // SAFETY: columns c0..c1 of the sum belong to this block alone.
        let out = unsafe { std::slice::from_raw_parts_mut(acc_ptr.ptr().add(c0), c1 - c0) };
        for row in g.chunks(c) {
            for (a, &v) in out.iter_mut().zip(&row[c0..c1]) {
                *a += v;
            }
        }
        Ok(())
    })?;
    Ok(acc)
}

impl CustomOp1 for SumRows {
    fn name(&self) -> &'static str {
        "sum-rows"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, c) = layout.shape().dims2()?;
        let n = self.name();
        let out = float_kernel!(n; v = (storage, layout) => sum_rows(v, c)?);
        Ok((out, Shape::from(c)))
    }
}

/// (N, C) → (C,): column sums of a contiguous CPU matrix, without a backward.
pub(crate) fn sum_rows_op(g: &Tensor) -> Result<Tensor> {
    g.contiguous()?.apply_op1_no_bwd(&SumRows)
}

/// x (N, C) + bias (C,); fused backward on CPU.
pub fn add_bias(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&bias.contiguous()?, AddBias)
}
