//! The tensor ops the model is built from, each one function (or, for attention, one type) that
//! picks its own implementation: a fused CPU kernel with its own backward pass for f32 and f64
//! tensors on the CPU, the same math from candle's differentiable primitives everywhere else
//! (CUDA, other dtypes). The model calls the op and never chooses.
//!
//! | op | computes | fused CPU path |
//! |---|---|---|
//! | [`linear`] | x·Wᵀ + b over the last dim | one GEMM from the bias; dx, dW by GEMMs, db by column sums |
//! | [`add_bias`] | x + b, x (N, C) | row-wise bias gradient |
//! | [`layer_norm`], [`rms_norm`] | normalise the last dim, scale (and shift) | LayerNorm with bias: one pass each way |
//! | [`gelu_tanh`] | GPT-2's tanh-GELU | one pass each way, vectorised |
//! | [`causal_softmax`] | softmax(scale·s + causal mask) | one pass each way |
//! | [`CausalAttention`] | softmax(q·kᵀ/√hd + mask)·v per head, RoPE | packed q/k/v to merged heads in one op |
//! | [`cross_entropy`] | mean −log softmax(logits)[target] | one pass each way |
//!
//! Each fused op is one file that says what it computes and why it is fused; tests in
//! `tests/fused_ops.rs` hold each to its primitive-op reference and to finite differences in
//! f64. Beneath them: `real` (the f32/f64 element types), `simd` (vectorised exp, GELU and
//! sums, picked per CPU at run time), `gemm` and `sgemm` (single-threaded strided GEMMs, an
//! AVX-512 kernel where the CPU has one), and `parallel` (the one loop that spreads
//! independent blocks over candle's thread pool). `autocast` holds the matmul precision scope
//! that the reference paths follow.

pub mod attention;
pub mod autocast;
pub mod bias;
pub mod gelu;
mod gemm;
pub mod linear;
pub mod loss;
pub mod norm;
mod parallel;
mod real;
mod sgemm;
mod simd;
pub mod softmax;

use std::cell::Cell;

use candle_core::{DType, Tensor};

pub use attention::{CausalAttention, Rope};
pub use bias::add_bias;
pub use gelu::gelu_tanh;
pub use linear::linear;
pub use loss::cross_entropy;
pub use norm::{layer_norm, rms_norm};
pub use softmax::causal_softmax;

/// Whether the fused kernels apply to `x`: CPU storage in f32 or f64, outside a
/// [`primitives_only`] scope.
pub fn use_fused(x: &Tensor) -> bool {
    x.device().is_cpu()
        && matches!(x.dtype(), DType::F32 | DType::F64)
        && !PRIMITIVES_ONLY.with(Cell::get)
}

thread_local! {
    static PRIMITIVES_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Restores this thread's previous choice of paths when dropped.
#[must_use = "the primitive paths apply only while the guard lives"]
pub struct PrimitivesOnly {
    previous: bool,
}

impl Drop for PrimitivesOnly {
    fn drop(&mut self) {
        PRIMITIVES_ONLY.with(|c| c.set(self.previous));
    }
}

/// Until the guard drops, every op called on this thread takes its primitive-op path, the one
/// CUDA and other dtypes take, so that path can be checked on the CPU in f64 (finite
/// differences, fused-against-reference tests). The choice is made when an op runs forward; its
/// backward follows the graph that forward built. Per thread, like `autocast`, so tests running
/// side by side do not see each other's scope.
pub fn primitives_only() -> PrimitivesOnly {
    let previous = PRIMITIVES_ONLY.with(|c| c.replace(true));
    PrimitivesOnly { previous }
}
