//! Row-major GEMMs on cuBLAS for the fused GPU ops: bf16 operands, f32 accumulation, an f32 or
//! bf16 result, optionally strided-batched, written where the caller points (so a product can
//! land inside a bigger buffer, e.g. one head's slice of a merged-heads layout).
//!
//! cuBLAS is column-major, where a row-major (r, c) matrix with row stride ld reads as its
//! (c × r) transpose with leading dimension ld; so C = P·Q is computed as Cᵀ = Qᵀ·Pᵀ with the
//! operands swapped, and each transpose flag carries over unchanged.

use std::ffi::c_void;

use candle_core::cuda_backend::cudarc::cublas::{result as blas, sys as blas_sys};
use candle_core::cuda_backend::cudarc::driver::sys::CUdeviceptr;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, Result};

/// One operand or the result of a GEMM, as cuBLAS sees it: a device address, an element type,
/// the row stride of the stored row-major matrix, the distance between consecutive matrices of
/// a batch (elements), and whether the stored matrix is used transposed.
#[derive(Debug, Clone, Copy)]
pub struct Mat {
    pub ptr: CUdeviceptr,
    pub bf16: bool,
    pub ld: usize,
    pub batch_stride: usize,
    pub trans: bool,
}

impl Mat {
    /// A contiguous row-major bf16 matrix stored as (rows, cols), used as is.
    pub fn bf16(ptr: CUdeviceptr, cols: usize) -> Self {
        Mat {
            ptr,
            bf16: true,
            ld: cols,
            batch_stride: 0,
            trans: false,
        }
    }

    /// A contiguous row-major f32 matrix stored as (rows, cols).
    pub fn f32(ptr: CUdeviceptr, cols: usize) -> Self {
        Mat {
            bf16: false,
            ..Mat::bf16(ptr, cols)
        }
    }

    /// The same matrix used transposed.
    pub fn t(self) -> Self {
        Mat {
            trans: true,
            ..self
        }
    }

    /// Consecutive matrices of a batch `stride` elements apart.
    pub fn every(self, stride: usize) -> Self {
        Mat {
            batch_stride: stride,
            ..self
        }
    }

    fn dtype(&self) -> blas_sys::cudaDataType_t {
        if self.bf16 {
            blas_sys::cudaDataType_t::CUDA_R_16BF
        } else {
            blas_sys::cudaDataType_t::CUDA_R_32F
        }
    }

    fn op(&self) -> blas_sys::cublasOperation_t {
        if self.trans {
            blas_sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            blas_sys::cublasOperation_t::CUBLAS_OP_N
        }
    }
}

/// For each of `batch` matrices: C (M, N) = beta·C + P·Q, P (M, K) from `a`, Q (K, N) from `b`
/// (each transposed if its flag says so), f32 accumulation. `c` must not be transposed.
///
/// # Safety
/// Every address must cover the elements its leading dimension, batch stride and the shape let
/// cuBLAS touch, be written by earlier work on the device's stream (the handle runs there) and
/// stay allocated until that work is done.
pub unsafe fn gemm(
    dev: &CudaDevice,
    (m, n, k): (usize, usize, usize),
    a: Mat,
    b: Mat,
    c: Mat,
    beta: f32,
    batch: usize,
) -> Result<()> {
    let handle = dev.cublas_handle();
    let alpha = 1.0f32;
    blas::gemm_strided_batched_ex(
        *handle.handle(),
        b.op(),
        a.op(),
        n as i32,
        m as i32,
        k as i32,
        (&alpha as *const f32).cast::<c_void>(),
        b.ptr as *const c_void,
        b.dtype(),
        b.ld as i32,
        b.batch_stride as i64,
        a.ptr as *const c_void,
        a.dtype(),
        a.ld as i32,
        a.batch_stride as i64,
        (&beta as *const f32).cast::<c_void>(),
        c.ptr as *mut c_void,
        c.dtype(),
        c.ld as i32,
        c.batch_stride as i64,
        batch as i32,
        blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
    )
    .w()
}
