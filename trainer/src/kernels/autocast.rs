//! Mixed precision for matmuls, scoped like PyTorch's `autocast`.
//!
//! With `training.precision: bf16` the trainer opens an [`autocast`] scope around each forward
//! pass: inside it, [`matmul`] casts both operands to bf16, multiplies (the GEMM accumulates in
//! f32 on CUDA's tensor cores), and casts the product back to the input's dtype. Everything else
//! — weights (the f32 master copy the optimizer updates), softmax, norms, the loss and every
//! reduction — stays in f32. Backward follows the casts, so gradients arrive in f32.
//!
//! The scope is per thread, so a bf16 run never changes the arithmetic of an f32 run that shares
//! the process (tests run side by side in one process).

use std::cell::Cell;

use candle_core::{DType, Result, Tensor};

use crate::config::Precision;

thread_local! {
    static MATMUL_DTYPE: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Restores the previous matmul precision of this thread when dropped.
#[must_use = "the precision applies only while the guard lives"]
pub struct AutocastGuard {
    previous: Option<DType>,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        MATMUL_DTYPE.with(|c| c.set(self.previous));
    }
}

/// Sets this thread's matmul precision until the guard drops. `f32` and `tf32` compute matmuls
/// in f32 (TF32 is a CUDA GEMM mode switched on at device set-up, not a dtype).
pub fn autocast(precision: Precision) -> AutocastGuard {
    let dtype = match precision {
        Precision::Bf16 => Some(DType::BF16),
        Precision::F32 | Precision::Tf32 => None,
    };
    let previous = MATMUL_DTYPE.with(|c| c.replace(dtype));
    AutocastGuard { previous }
}

/// Whether this thread has a reduced-precision matmul scope open.
pub fn is_active() -> bool {
    MATMUL_DTYPE.with(Cell::get).is_some()
}

/// `a.matmul(b)`, in the scope's reduced precision when one is open.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match MATMUL_DTYPE.with(Cell::get) {
        Some(dtype) if a.dtype() != dtype => {
            let out = a.to_dtype(dtype)?.matmul(&b.to_dtype(dtype)?)?;
            out.to_dtype(a.dtype())
        }
        _ => a.matmul(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn a_bf16_scope_rounds_the_product_and_ends_with_its_guard() -> Result<()> {
        let dev = Device::Cpu;
        // 1 + 2^-10 is exact in f32 but rounds to 1 in bf16 (8 bits of mantissa).
        let a = Tensor::new(&[[1.0f32 + 1.0 / 1024.0]], &dev)?;
        let b = Tensor::new(&[[1.0f32]], &dev)?;
        let exact = matmul(&a, &b)?.to_vec2::<f32>()?[0][0];
        let rounded = {
            let _scope = autocast(Precision::Bf16);
            let y = matmul(&a, &b)?;
            assert_eq!(y.dtype(), DType::F32, "the product comes back in f32");
            y.to_vec2::<f32>()?[0][0]
        };
        let after = matmul(&a, &b)?.to_vec2::<f32>()?[0][0];
        assert_eq!(exact, 1.0 + 1.0 / 1024.0);
        assert_eq!(rounded, 1.0);
        assert_eq!(after, exact);
        Ok(())
    }

    #[test]
    fn gradients_flow_through_a_bf16_matmul_to_f32_weights() -> Result<()> {
        let dev = Device::Cpu;
        let w = Var::from_tensor(&Tensor::new(&[[0.5f32, -0.25], [1.0, 2.0]], &dev)?)?;
        let x = Tensor::new(&[[1.0f32, 2.0]], &dev)?;
        let _scope = autocast(Precision::Bf16);
        let loss = matmul(&x, w.as_tensor())?.sum_all()?;
        let grads = loss.backward()?;
        let g = grads.get(w.as_tensor()).expect("w has a gradient");
        assert_eq!(g.dtype(), DType::F32);
        // d(sum(x @ w))/dw[i][j] = x[i]
        assert_eq!(g.to_vec2::<f32>()?, vec![vec![1.0, 1.0], vec![2.0, 2.0]]);
        Ok(())
    }
}
