//! The tensor ops the model is built from, each one function (or, for attention, one type) that
//! picks its own implementation: a fused CPU kernel with its own backward pass for f32 and f64
//! tensors on the CPU, a fused CUDA kernel for f32 tensors on a GPU where `cuda` has one
//! (LayerNorm, GELU, causal softmax, cross-entropy, and the linear layer and causal attention
//! under bf16 autocast; built with the `cuda` feature), and the same
//! math from candle's differentiable primitives everywhere else. The model calls the op and
//! never chooses.
//!
//! | op | computes | fused CPU path |
//! |---|---|---|
//! | [`linear`](fn@linear) | x·Wᵀ + b over the last dim | one GEMM from the bias; dx, dW by GEMMs, db by column sums |
//! | [`add_bias`] | x + b, x (N, C) | row-wise bias gradient |
//! | [`layer_norm`], [`rms_norm`] | normalise the last dim, scale (and shift) | LayerNorm with bias: one pass each way |
//! | [`gelu_tanh`] | GPT-2's tanh-GELU | one pass each way, vectorised |
//! | [`linear_gelu`] | tanh-GELU(x·Wᵀ + b), a GELU MLP's first layer | the linear's GEMMs and the GELU's passes in one graph node |
//! | [`gelu_mlp`] | gelu(x·W_fcᵀ + b_fc)·W_projᵀ + b_proj, a dense MLP or every expert on its group of rows | one op: each block of rows through both GEMMs and the GELU in turn, dL/dh never a graph edge |
//! | [`grouped_linear`] | each group of rows through its own linear layer (MoE experts), optionally GELU | one op for all experts: each group's GEMMs on its own rows, no narrow/cat gradient copies |
//! | [`combine_rows`] | Σ gate · expert output back into each token's row (MoE) | one op: each token's row written once; dL/dys and dL/dgates once each |
//! | [`causal_softmax`] | softmax(scale·s + causal mask) | one pass each way |
//! | [`CausalAttention`] | softmax(q·kᵀ/√hd + mask)·v per head, RoPE | packed q/k/v to merged heads in one op; with the q/k/v projection in the same op (`forward_projected`) |
//! | [`cross_entropy`] | mean −log softmax(logits)\[target\] | one pass each way |
//! | [`residual`](fn@residual) | x + f_n(… f_1(x)), a block's half, each f a fused op ([`Step`]) | one graph node: x its only activation edge, each step's own backward in reverse |
//!
//! Each fused op is one file that says what it computes and why it is fused; tests in
//! `tests/fused_ops.rs` hold each to its primitive-op reference and to finite differences in
//! f64. Beneath them: `real` (the f32/f64 element types), `simd` (vectorised exp, GELU and
//! sums, picked per CPU at run time), `gemm` and `sgemm` (single-threaded strided GEMMs, an
//! AVX-512 kernel where the CPU has one), and `parallel` (the one loop that spreads
//! independent blocks over candle's thread pool). `autocast` holds the matmul precision scope
//! that the reference paths follow.

pub mod adamw;
pub mod attention;
pub mod autocast;
pub mod bias;
pub mod combine;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod gelu;
mod gemm;
pub mod grouped;
pub mod linear;
mod link;
pub mod loss;
pub mod mlp;
pub mod norm;
mod parallel;
mod products;
mod real;
pub mod residual;
pub mod rows;
mod sgemm;
mod simd;
pub mod softmax;

use std::cell::Cell;
use std::sync::OnceLock;

use candle_core::{DType, Tensor};

pub use attention::{CausalAttention, Rope};
pub use bias::add_bias;
pub use combine::combine_rows;
pub use gelu::gelu_tanh;
pub use grouped::grouped_linear;
pub use linear::{linear, linear_gelu, linear_step};
pub use loss::cross_entropy;
pub use mlp::{gelu_mlp, gelu_mlp_step};
pub use norm::{layer_norm, layer_norm_step, rms_norm};
pub use residual::{residual, Step};
pub use rows::{add_rows, gather_rows};
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

/// The CUDA kernels (`kernels/cuda`), each of which `TRAINYARD_CUDA_KERNELS` can switch off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaKernel {
    Gelu,
    CrossEntropy,
    Softmax,
    LayerNorm,
    AdamW,
    Clip,
    Rows,
    Linear,
    Attention,
}

const CUDA_KERNEL_NAMES: [(&str, CudaKernel); 9] = [
    ("gelu", CudaKernel::Gelu),
    ("cross_entropy", CudaKernel::CrossEntropy),
    ("softmax", CudaKernel::Softmax),
    ("layer_norm", CudaKernel::LayerNorm),
    ("adamw", CudaKernel::AdamW),
    ("clip", CudaKernel::Clip),
    ("rows", CudaKernel::Rows),
    ("linear", CudaKernel::Linear),
    ("attention", CudaKernel::Attention),
];

/// Whether `x` takes `kernel`'s CUDA kernel: an f32 tensor on a GPU, in a build with the `cuda`
/// feature, outside a [`primitives_only`] scope, with the kernel switched on. Everything else
/// takes the op's other paths.
pub fn use_cuda_kernel(x: &Tensor, kernel: CudaKernel) -> bool {
    cfg!(feature = "cuda")
        && x.device().is_cuda()
        && x.dtype() == DType::F32
        && !PRIMITIVES_ONLY.with(Cell::get)
        && cuda_kernel_enabled(kernel)
}

/// `TRAINYARD_CUDA_KERNELS`, read once: `all` (the default), `none`, or a comma list of
/// `gelu`, `cross_entropy`, `softmax`, `layer_norm`, `adamw`, `clip`, `rows`, `linear`, `attention`. The kernels left out take
/// candle's primitive ops, so each kernel's effect can be measured with one build.
pub fn cuda_kernel_enabled(kernel: CudaKernel) -> bool {
    static ON: OnceLock<Vec<CudaKernel>> = OnceLock::new();
    ON.get_or_init(|| {
        parse_cuda_kernels(&std::env::var("TRAINYARD_CUDA_KERNELS").unwrap_or_default())
    })
    .contains(&kernel)
}

fn parse_cuda_kernels(spec: &str) -> Vec<CudaKernel> {
    match spec.trim() {
        "" | "all" => CUDA_KERNEL_NAMES.iter().map(|(_, k)| *k).collect(),
        "none" => Vec::new(),
        list => list
            .split(',')
            .filter_map(|name| {
                let found = CUDA_KERNEL_NAMES
                    .iter()
                    .find(|(n, _)| *n == name.trim())
                    .map(|(_, k)| *k);
                if found.is_none() {
                    tracing::warn!(name, "TRAINYARD_CUDA_KERNELS: unknown kernel name, ignored");
                }
                found
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cuda_kernel_list_reads_all_none_and_names() {
        assert_eq!(parse_cuda_kernels("").len(), 9);
        assert_eq!(parse_cuda_kernels("all").len(), 9);
        assert!(parse_cuda_kernels("none").is_empty());
        assert_eq!(
            parse_cuda_kernels("gelu, adamw,bogus"),
            vec![CudaKernel::Gelu, CudaKernel::AdamW]
        );
    }

    #[test]
    fn cpu_tensors_never_take_a_cuda_kernel() {
        let x = Tensor::zeros(4, DType::F32, &candle_core::Device::Cpu).unwrap();
        assert!(!use_cuda_kernel(&x, CudaKernel::Gelu));
    }
}
