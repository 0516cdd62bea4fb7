//! LayerNorm and RMSNorm over the last dim, written so that both have a backward (candle's
//! fused versions have none).
//!
//! From primitives LayerNorm is about 9 ops forward and 25 backward over the activations, each
//! with its own allocation; the fused CPU op is one pass each way, the backward giving dx,
//! dweight and dbias together.

use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

use super::linear::as_rows;
use super::parallel::{filled_by_rows, for_each_block, SharedMut};
use super::real::{float_kernel, Real};
use super::residual::{Op3Step, Step};

/// (x − mean) / √(var + eps) · weight [+ bias] over the last dim of x (.., C), statistics in
/// f32 at least. Fused on CPU in f32 and f64 (with a bias, as GPT-2 has).
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    if let Some(bias) = bias {
        if super::use_fused(x) || super::use_cuda_kernel(x, super::CudaKernel::LayerNorm) {
            return fused_layer_norm(x, weight, bias, eps);
        }
    }
    normalize(x, weight, bias, |x| {
        let mean = x.mean_keepdim(D::Minus1)?; // (.., 1)
        let xc = x.broadcast_sub(&mean)?; // (.., C)
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?; // (.., 1)
        xc.broadcast_div(&(var + eps)?.sqrt()?)
    })
}

/// x / √(mean(x²) + eps) · weight over the last dim of x (.., C), statistics in f32 at least.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    normalize(x, weight, None, |x| {
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?; // (.., 1)
        x.broadcast_div(&(ms + eps)?.sqrt()?)
    })
}

/// `scaled(x)` computed in f32 at least, back in x's dtype, times weight, plus bias.
fn normalize(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    scaled: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let in_dtype = x.dtype();
    let x32 = match in_dtype {
        DType::F64 | DType::F32 => x.clone(),
        _ => x.to_dtype(DType::F32)?,
    };
    let y = scaled(&x32)?.to_dtype(in_dtype)?.broadcast_mul(weight)?;
    match bias {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// The fused path of `layer_norm` (CPU, or CUDA with the `cuda` feature): x (.., C), weight and
/// bias (C,).
pub fn fused_layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    let op = LayerNormOp { eps };
    if x.device().is_cpu() {
        // The CPU op takes the leading dims as rows: a reshape would be one more graph node
        // each way, and candle's backward zero-fills and adds a gradient buffer for each.
        return x
            .contiguous()?
            .apply_op3(&weight.contiguous()?, &bias.contiguous()?, op); // (.., C)
    }
    let c = x.dim(D::Minus1)?;
    let x2 = x.reshape(((), c))?.contiguous()?; // (N, C)
    let y = x2.apply_op3(&weight.contiguous()?, &bias.contiguous()?, op)?;
    y.reshape(x.shape()) // (.., C)
}

/// LayerNorm with bias as a step of a residual branch (`residual`): the fused CPU op, outside
/// the graph.
pub fn layer_norm_step(weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Box<dyn Step>> {
    Op3Step::boxed(LayerNormOp { eps }, weight, bias)
}

/// (x − mean) / √(var + eps) · weight + bias over the last dim of x (N, C).
#[derive(Debug, Clone, Copy)]
struct LayerNormOp {
    eps: f64,
}

/// Mean and 1/√(var + eps) of one row, in the row's precision (as the primitive version).
fn row_stats<T: Real>(x: &[T], eps: f64) -> (T, T) {
    // Both sums vectorised in fixed lanes (`Real`): summed one value after another, each add
    // waited for the one before, and the layer norms were 4 % of a training step.
    let n = T::from_f64(x.len() as f64);
    let mean = T::sum_slice(x) / n;
    let var = T::sq_dev_sum(x, mean) / n;
    let rstd = T::one() / T::from_f64((var.to_f64() + eps).sqrt());
    (mean, rstd)
}

fn layer_norm_rows<T: Real>(x: &[T], w: &[T], b: &[T], eps: f64) -> Result<Vec<T>> {
    let c = w.len();
    let out = filled_by_rows(x.len(), c, |r, y| {
        T::layer_norm_row(&x[r * c..(r + 1) * c], w, b, y, eps);
    })?;
    Ok(out)
}

/// One row of the forward: y = (x − mean)·rstd·w + b. Written once for any `Real`; f32 runs it
/// compiled for the CPU's widest vectors (`simd::layer_norm_row`), where the element-wise loop
/// built for the baseline x86-64 used 4 lanes of 16. The same operations in the same order
/// either way, so the same bits.
#[inline(always)]
pub(super) fn layer_norm_row<T: Real>(x: &[T], w: &[T], b: &[T], y: &mut [T], eps: f64) {
    let (mean, rstd) = row_stats(x, eps);
    for (((yi, &v), &wi), &bi) in y.iter_mut().zip(x).zip(w).zip(b) {
        *yi = (v - mean) * rstd * wi + bi;
    }
}

/// One row of the backward: dx of the row, its terms added to the block's dw and db, with two
/// rows of scratch (x̂ and ĝ). Compiled for the widest vectors as `layer_norm_row` is.
#[inline(always)]
pub(super) fn layer_norm_backward_row<T: Real>(
    (x, g, w): (&[T], &[T], &[T]),
    dx: &mut [T],
    (dw, db): (&mut [T], &mut [T]),
    (xhat, gh): (&mut [T], &mut [T]),
    eps: f64,
) {
    let inv_c = T::from_f64(1.0 / w.len() as f64);
    let (mean, rstd) = row_stats(x, eps);
    // Element-wise first, then the two row means as vectorised sums (`Real`).
    for j in 0..w.len() {
        xhat[j] = (x[j] - mean) * rstd;
        gh[j] = g[j] * w[j];
        dw[j] += g[j] * xhat[j];
        db[j] += g[j];
    }
    let mean_gh = T::sum_slice(gh) * inv_c;
    let mean_ghx = T::dot_slice(gh, xhat) * inv_c;
    for (j, d) in dx.iter_mut().enumerate() {
        *d = rstd * (gh[j] - mean_gh - xhat[j] * mean_ghx);
    }
}

impl CustomOp3 for LayerNormOp {
    fn name(&self) -> &'static str {
        "layer-norm"
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
        ln_shapes(l1, l2, l3)?;
        let n = self.name();
        let out = float_kernel!(n; x = (s1, l1), w = (s2, l2), b = (s3, l3) => layer_norm_rows(x, w, b, self.eps)?);
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        ln_shapes(l1, l2, l3)?;
        super::cuda::layer_norm((s1, l1), (s2, l2), (s3, l3), self.eps)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (n, c) = as_rows(x.layout())?;
        let g = grad_res.contiguous()?; // (.., C)
        let packed = x.apply_op3_no_bwd(w, &g, &LayerNormBackward { eps: self.eps })?; // (N+2, C)
        let dx = packed.narrow(0, 0, n)?.reshape(x.shape())?; // (.., C)
        let dw = packed.get(n)?; // (C,)
        let db = packed.get(n + 1)?; // (C,)
        debug_assert_eq!(dw.dims1()?, c);
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// x (.., C) with weight and bias (C,), for the CPU and CUDA paths alike.
fn ln_shapes(x: &Layout, w: &Layout, b: &Layout) -> Result<()> {
    let (_, c) = as_rows(x)?;
    if w.dims() != [c] || b.dims() != [c] {
        bail!(
            "layer-norm: weight/bias must be ({c},), got {:?}/{:?}",
            w.dims(),
            b.dims()
        );
    }
    Ok(())
}

/// (N, C) of x (.., C), with weight (C,) and a gradient shaped like x, for the CPU and CUDA
/// paths alike.
fn ln_backward_shapes(x: &Layout, w: &Layout, g: &Layout) -> Result<(usize, usize)> {
    let (rows, c) = as_rows(x)?;
    if w.dims() != [c] || g.shape() != x.shape() {
        bail!(
            "layer-norm-backward: shapes {:?}, {:?}, {:?}",
            x.dims(),
            w.dims(),
            g.dims()
        );
    }
    Ok((rows, c))
}

/// From x, weight and the output gradient g, in one pass over the rows:
/// x̂ = (x − mean)·rstd, ĝ = g ⊙ w, dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ ⊙ x̂)),
/// dw = Σ_rows g ⊙ x̂, db = Σ_rows g. Returned packed as (N + 2, C): dx rows, then dw, db.
#[derive(Debug, Clone, Copy)]
struct LayerNormBackward {
    eps: f64,
}

/// Rows per block of the backward. Blocks run in parallel, each summing its own partial dw and
/// db; the partials are then added in block order, so the result does not depend on the
/// number of threads.
const BACKWARD_BLOCK_ROWS: usize = 64;

fn layer_norm_backward_rows<T: Real>(x: &[T], w: &[T], g: &[T], eps: f64) -> Result<Vec<T>> {
    let c = w.len();
    let rows = x.len() / c.max(1);
    let blocks = rows.div_ceil(BACKWARD_BLOCK_ROWS);
    // Not zeroed as a whole: each block zeroes its own dx rows just before writing them (in
    // its core's cache, where a separate pass over the buffer was one more parallel section).
    let mut out = Vec::<T>::with_capacity(x.len() + 2 * c);
    // Per block: c values of dw, then c of db.
    let mut partial = vec![T::zero(); blocks * 2 * c];
    let (out_ptr, partial_ptr) = (SharedMut(out.as_mut_ptr()), SharedMut(partial.as_mut_ptr()));
    for_each_block(blocks, blocks * BACKWARD_BLOCK_ROWS * c, |blk| {
        let (r0, r1) = (
            blk * BACKWARD_BLOCK_ROWS,
            rows.min((blk + 1) * BACKWARD_BLOCK_ROWS),
        );
        // SAFETY: block `blk` alone writes dx rows r0..r1 (inside `out`'s capacity, zeroed
        // before the slice is made) and its own partial sums.
        let dx = unsafe {
            let p = out_ptr.ptr().add(r0 * c);
            std::ptr::write_bytes(p, 0, (r1 - r0) * c);
            std::slice::from_raw_parts_mut(p, (r1 - r0) * c)
        };
        let sums =
            unsafe { std::slice::from_raw_parts_mut(partial_ptr.ptr().add(blk * 2 * c), 2 * c) };
        let (dw, db) = sums.split_at_mut(c);
        let (mut xhat, mut gh) = (vec![T::zero(); c], vec![T::zero(); c]);
        for (r, d_row) in (r0..r1).zip(dx.chunks_mut(c)) {
            let (xr, gr) = (&x[r * c..(r + 1) * c], &g[r * c..(r + 1) * c]);
            T::layer_norm_backward_row((xr, gr, w), d_row, (dw, db), (&mut xhat, &mut gh), eps);
        }
        Ok(())
    })?;
    // SAFETY: the blocks zeroed and wrote every dx row; the 2c values after them are zeroed
    // here before the length covers them.
    unsafe {
        std::ptr::write_bytes(out.as_mut_ptr().add(x.len()), 0, 2 * c);
        out.set_len(x.len() + 2 * c);
    }
    let dwb = &mut out[x.len()..];
    for sums in partial.chunks(2 * c) {
        for (acc, &v) in dwb.iter_mut().zip(sums) {
            *acc += v;
        }
    }
    Ok(out)
}

impl CustomOp3 for LayerNormBackward {
    fn name(&self) -> &'static str {
        "layer-norm-backward"
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
        let (rows, c) = ln_backward_shapes(l1, l2, l3)?;
        let n = self.name();
        let out = float_kernel!(n; x = (s1, l1), w = (s2, l2), g = (s3, l3) => layer_norm_backward_rows(x, w, g, self.eps)?);
        Ok((out, Shape::from((rows + 2, c))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        ln_backward_shapes(l1, l2, l3)?;
        super::cuda::layer_norm_backward((s1, l1), (s2, l2), (s3, l3), self.eps)
    }
}
