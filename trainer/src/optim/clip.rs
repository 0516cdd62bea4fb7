//! Global-norm gradient clipping (as `torch.nn.utils.clip_grad_norm_`), computed in f32. On a GPU
//! (with the `cuda` feature) nothing is read back: the norm and the clipping factor are computed
//! and applied on the device, and the norm is returned as a tensor for the step's one read.

use candle_core::{DType, Result, Tensor};

/// Scales `grads` in place so their global L2 norm is at most `max_norm` (`0` = no clipping) and
/// returns the norm before clipping.
pub fn clip_grad_norm(grads: &mut [Option<Tensor>], max_norm: f64) -> Result<f32> {
    let norm = global_norm(grads)?;
    if max_norm > 0.0 && norm.is_finite() && f64::from(norm) > max_norm {
        let scale = max_norm / (f64::from(norm) + 1e-6);
        for g in grads.iter_mut().flatten() {
            *g = g.affine(scale, 0.0)?;
        }
    }
    Ok(norm)
}

/// [`clip_grad_norm`] with the norm returned as an f32 scalar tensor on the gradients' device.
/// On CUDA the norm, the decision and the scaling stay on the device (no host synchronisation);
/// elsewhere this is `clip_grad_norm` itself.
pub fn clip_grad_norm_on_device(grads: &mut [Option<Tensor>], max_norm: f64) -> Result<Tensor> {
    let Some(first) = grads.iter().flatten().next().cloned() else {
        return Tensor::new(0f32, &candle_core::Device::Cpu);
    };
    #[cfg(feature = "cuda")]
    if crate::kernels::use_cuda_kernel(&first, crate::kernels::CudaKernel::Clip) {
        // The kernel applies only to f32 gradients (`use_cuda_kernel` checked the first; the
        // gradients of one model share its dtype).
        let refs: Vec<&Tensor> = grads.iter().flatten().collect();
        let out = crate::kernels::cuda::norm_and_clip_scale(&refs, max_norm)?; // (2,): norm, factor
        if max_norm > 0.0 {
            let factor = out.narrow(0, 1, 1)?; // (1,), f32 like the gradients
            for g in grads.iter_mut().flatten() {
                *g = g.broadcast_mul(&factor)?;
            }
        }
        return out.get(0);
    }
    let norm = clip_grad_norm(grads, max_norm)?;
    Tensor::new(norm, first.device())
}

/// √(Σ‖g‖²) over all present gradients, in f32.
pub fn global_norm(grads: &[Option<Tensor>]) -> Result<f32> {
    // Per-tensor sums of squares stay on the device; only the final scalar is read back.
    let squares = grads
        .iter()
        .flatten()
        .map(|g| g.to_dtype(DType::F32)?.sqr()?.sum_all())
        .collect::<Result<Vec<_>>>()?;
    if squares.is_empty() {
        return Ok(0.0);
    }
    Tensor::stack(&squares, 0)?
        .sum_all()?
        .sqrt()?
        .to_scalar::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn grads() -> Vec<Option<Tensor>> {
        vec![
            Some(Tensor::new(&[3.0f32, 0.0], &Device::Cpu).unwrap()),
            None,
            Some(Tensor::new(&[[0.0f32], [4.0]], &Device::Cpu).unwrap()),
        ]
    }

    #[test]
    fn clipping_scales_to_the_max_norm_and_returns_the_original_norm() {
        let mut g = grads();
        let norm = clip_grad_norm(&mut g, 1.0).unwrap();
        assert_eq!(norm, 5.0);
        let after = global_norm(&g).unwrap();
        assert!((after - 1.0).abs() < 1e-5, "{after}");
        let first = g[0].as_ref().unwrap().to_vec1::<f32>().unwrap();
        assert!((first[0] - 0.6).abs() < 1e-5, "{first:?}");
    }

    #[test]
    fn gradients_under_the_limit_are_untouched() {
        let mut g = grads();
        assert_eq!(clip_grad_norm(&mut g, 10.0).unwrap(), 5.0);
        assert_eq!(
            g[2].as_ref()
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            vec![0.0, 4.0]
        );
    }

    #[test]
    fn a_zero_limit_disables_clipping() {
        let mut g = grads();
        clip_grad_norm(&mut g, 0.0).unwrap();
        assert_eq!(global_norm(&g).unwrap(), 5.0);
    }
}
