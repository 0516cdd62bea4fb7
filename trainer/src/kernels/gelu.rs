//! GELU, tanh approximation (GPT-2): 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 x³))).
//!
//! candle's `gelu` is the same formula from primitives, about 12 ops in its backward. The fused
//! CPU op is one pass each way; its backward uses 0.5 · (1 + tanh u) = sigmoid(2u), so one `exp`
//! per element (`simd` vectorises it in f32).

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

use super::parallel::{filled_by_rows, SharedMut};
use super::real::{float_kernel, same_shape, Real};

/// tanh-GELU, element-wise; fused on CPU in f32 and f64 and on CUDA in f32, candle's `gelu`
/// elsewhere.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    if super::use_fused(x) || super::use_cuda_kernel(x, super::CudaKernel::Gelu) {
        fused_gelu_tanh(x)
    } else {
        x.gelu()
    }
}

/// The fused path of `gelu_tanh` (CPU, or CUDA with the `cuda` feature).
pub fn fused_gelu_tanh(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(GeluTanh)
}

/// 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 x³))).
#[derive(Debug, Clone, Copy)]
struct GeluTanh;

pub(crate) fn gelu_rows<T: Real>(x: &[T]) -> Result<Vec<T>> {
    let cols = 1024.min(x.len().max(1));
    filled_by_rows(x.len(), cols, |r, y| {
        T::gelu_slice(&x[r * cols..r * cols + y.len()], y);
    })
}

/// gelu(x), with x ← gelu'(x) in place (`Real::gelu_and_grad_slice`), in parallel blocks.
pub(crate) fn gelu_and_grad_rows<T: Real>(x: &mut [T]) -> Result<Vec<T>> {
    let cols = 1024.min(x.len().max(1));
    let xs = SharedMut(x.as_mut_ptr());
    let len = x.len();
    filled_by_rows(len, cols, |r, y| {
        // SAFETY: row r of x (cols values, fewer in the last) is this row's alone, inside x;
        // writing initialised values through the MaybeUninit view of y is sound.
        unsafe {
            let x_row = std::slice::from_raw_parts_mut(xs.ptr().add(r * cols), y.len());
            T::gelu_and_grad_slice(x_row, &mut *(y as *mut [T] as *mut [MaybeUninit<T>]));
        }
    })
}

/// a ⊙ b, in parallel blocks (the backward of a GELU whose derivative was kept).
pub(crate) fn product_rows<T: Real>(a: &[T], b: &[T]) -> Result<Vec<T>> {
    let cols = 1024.min(a.len().max(1));
    filled_by_rows(a.len(), cols, |r, out| {
        let start = r * cols;
        out.copy_from_slice(&a[start..start + out.len()]);
        T::mul_slice(out, &b[start..start + out.len()]);
    })
}

impl CustomOp1 for GeluTanh {
    fn name(&self) -> &'static str {
        "gelu-tanh"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = float_kernel!(self.name(); v = (storage, layout) => gelu_rows(v)?);
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        super::cuda::gelu(s, l)
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let g = grad_res.contiguous()?;
        Ok(Some(arg.contiguous()?.apply_op2_no_bwd(&g, &GeluBackward)?))
    }
}

/// dx = g · d/dx gelu(x).
#[derive(Debug, Clone, Copy)]
struct GeluBackward;

pub(crate) fn gelu_backward_rows<T: Real>(x: &[T], g: &[T]) -> Result<Vec<T>> {
    let cols = 1024.min(x.len().max(1));
    filled_by_rows(x.len(), cols, |r, dx| {
        let start = r * cols;
        T::gelu_backward_slice(&x[start..start + dx.len()], &g[start..start + dx.len()], dx);
    })
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
        same_shape(self.name(), l1, l2)?;
        let n = self.name();
        let out = float_kernel!(n; x = (s1, l1), g = (s2, l2) => gelu_backward_rows(x, g)?);
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
        super::cuda::gelu_backward(s1, l1, s2, l2)
    }
}
