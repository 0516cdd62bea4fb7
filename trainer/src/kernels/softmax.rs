//! The attention's scaled, causally masked softmax over (.., T, T) scores.
//!
//! From candle primitives it is a scale, a mask add and a softmax: about 6 ops forward and 15
//! backward over the biggest tensor of the model, each allocating its output and synchronising
//! candle's worker threads. The fused CPU op is one pass each way, the backward
//! dx = scale · y ⊙ (g − Σ g⊙y) from the kept output y.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, D};

use super::parallel::filled_by_rows;
use super::real::{float_kernel, same_shape, Real};

/// softmax(scale · scores + mask) over the last dim, scores (.., T, T) and `mask` (≥T, ≥T): 0 on
/// and below the diagonal, −∞ above (only the reference path reads it). Fused on CPU in f32 and
/// f64.
pub fn causal_softmax(scores: &Tensor, scale: f64, mask: &Tensor) -> Result<Tensor> {
    if super::use_fused(scores) || super::use_cuda_kernel(scores, super::CudaKernel::Softmax) {
        return fused_causal_softmax(scores, scale);
    }
    let t = scores.dim(D::Minus1)?;
    let mask = mask.narrow(0, 0, t)?.narrow(1, 0, t)?; // (T, T)
    candle_nn::ops::softmax(&(scores * scale)?.broadcast_add(&mask)?, D::Minus1)
}

/// The fused path of `causal_softmax` (CPU, or CUDA with the `cuda` feature; no mask needed).
pub fn fused_causal_softmax(scores: &Tensor, scale: f64) -> Result<Tensor> {
    scores.contiguous()?.apply_op1(CausalSoftmax { scale })
}

/// softmax(scale · x + causal mask) over the last dim of (.., T, T) scores: entries above the
/// diagonal of each T×T matrix get probability 0.
#[derive(Debug, Clone, Copy)]
struct CausalSoftmax {
    scale: f64,
}

fn causal_softmax_rows<T: Real>(x: &[T], t: usize, scale: f64) -> Result<Vec<T>> {
    let scale = T::from_f64(scale);
    let out = filled_by_rows(x.len(), t, |r, y| {
        let keep = r % t + 1; // query position i sees keys 0..=i
        let xr = &x[r * t..r * t + keep];
        for (yi, &v) in y[..keep].iter_mut().zip(xr) {
            *yi = v * scale;
        }
        T::softmax_slice(&mut y[..keep]);
    })?;
    Ok(out)
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let t = square_scores(layout)?;
        let out = float_kernel!(self.name(); v = (storage, layout) => causal_softmax_rows(v, t, self.scale)?);
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        square_scores(l)?;
        super::cuda::causal_softmax(s, l, self.scale)
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let g = grad_res.contiguous()?;
        Ok(Some(res.apply_op2_no_bwd(
            &g,
            &SoftmaxBackward { scale: self.scale },
        )?))
    }
}

/// T of (.., T, T) scores, or the reason they are not.
fn square_scores(layout: &Layout) -> Result<usize> {
    let dims = layout.dims();
    let t = dims.last().copied().unwrap_or(0);
    if dims.len() < 2 || dims[dims.len() - 2] != t {
        bail!("causal-softmax: expected (.., T, T) scores, got {:?}", dims);
    }
    Ok(t)
}

/// dx = scale · y ⊙ (g − Σ g⊙y) per row, from the softmax output y and its gradient g.
#[derive(Debug, Clone, Copy)]
struct SoftmaxBackward {
    scale: f64,
}

fn softmax_backward_rows<T: Real>(y: &[T], g: &[T], cols: usize, scale: f64) -> Result<Vec<T>> {
    let scale = T::from_f64(scale);
    let out = filled_by_rows(y.len(), cols, |r, dx| {
        let yr = &y[r * cols..(r + 1) * cols];
        let gr = &g[r * cols..(r + 1) * cols];
        let dot = T::dot_slice(yr, gr);
        for ((d, &a), &b) in dx.iter_mut().zip(yr).zip(gr) {
            *d = scale * a * (b - dot);
        }
    })?;
    Ok(out)
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
        same_shape(self.name(), l1, l2)?;
        let cols = l1.dims().last().copied().unwrap_or(1);
        let n = self.name();
        let out = float_kernel!(n; y = (s1, l1), g = (s2, l2) => softmax_backward_rows(y, g, cols, self.scale)?);
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        same_shape(self.name(), l1, l2)?;
        super::cuda::softmax_backward(s1, l1, s2, l2, self.scale)
    }
}
