//! The fused CPU kernels (causal softmax, tanh-GELU) against candle's primitive ops and against
//! finite differences, on small tensors (one thread) and on big ones (split across threads).

use candle_core::{DType, Device, Result, Tensor, Var, D};
use trainer::model::fused::{add_bias, causal_softmax, gelu_tanh};
use trainer::model::fused_loss::cross_entropy_mean;
use trainer::model::fused_norm::layer_norm;

/// Deterministic, non-trivial values in roughly [-2, 2].
fn values(shape: &[usize], dtype: DType, phase: f64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let j = Tensor::arange(0u32, n as u32, &Device::Cpu)?.to_dtype(DType::F64)?;
    ((j * 0.61)? + phase)?
        .sin()?
        .affine(2.0, 0.0)?
        .reshape(shape)?
        .to_dtype(dtype)
}

/// The primitive-op version the fused softmax replaces.
fn reference_causal_softmax(x: &Tensor, scale: f64) -> Result<Tensor> {
    let t = x.dim(D::Minus1)?;
    let mask: Vec<f64> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, (t, t), x.device())?.to_dtype(x.dtype())?;
    candle_nn::ops::softmax(&(x * scale)?.broadcast_add(&mask)?, D::Minus1)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    (a - b)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_dtype(DType::F64)?
        .to_scalar()
}

/// Central finite differences of sum(w ⊙ f(x)) for every entry of x, against autograd.
fn check_gradient(f: impl Fn(&Tensor) -> Result<Tensor>, shape: &[usize]) -> Result<f64> {
    let x = Var::from_tensor(&values(shape, DType::F64, 0.3)?)?;
    // Weights on the output, which may be bigger than x (a bias or norm gain).
    let w = values(f(x.as_tensor())?.dims(), DType::F64, 1.7)?;
    let objective = |x: &Tensor| -> Result<f64> { (f(x)? * &w)?.sum_all()?.to_scalar() };
    let grads = objective_tensor(&f, x.as_tensor(), &w)?.backward()?;
    let analytic: Vec<f64> = grads
        .get(x.as_tensor())
        .expect("x has a gradient")
        .flatten_all()?
        .to_vec1()?;
    let base: Vec<f64> = x.as_tensor().flatten_all()?.to_vec1()?;
    let h = 1e-6;
    let mut worst: f64 = 0.0;
    for i in 0..base.len() {
        let mut bumped = base.clone();
        bumped[i] = base[i] + h;
        let plus = objective(&Tensor::from_vec(bumped.clone(), shape, &Device::Cpu)?)?;
        bumped[i] = base[i] - h;
        let minus = objective(&Tensor::from_vec(bumped, shape, &Device::Cpu)?)?;
        let numeric = (plus - minus) / (2.0 * h);
        worst = worst.max((numeric - analytic[i]).abs() / (1.0 + numeric.abs()));
    }
    Ok(worst)
}

fn objective_tensor(
    f: &impl Fn(&Tensor) -> Result<Tensor>,
    x: &Tensor,
    w: &Tensor,
) -> Result<Tensor> {
    (f(x)? * w)?.sum_all()
}

/// Autograd gradient of sum(w ⊙ f(x)) with respect to x.
fn autograd(f: impl Fn(&Tensor) -> Result<Tensor>, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let x = Var::from_tensor(x)?;
    let grads = (f(x.as_tensor())? * w)?.sum_all()?.backward()?;
    Ok(grads.get(x.as_tensor()).expect("x has a gradient").clone())
}

#[test]
fn the_fused_causal_softmax_matches_the_primitive_ops_in_f32_and_f64() -> Result<()> {
    // (2, 3, 5, 5) runs on one thread; (64, 64, 64) is split across threads.
    for shape in [&[2, 3, 5, 5][..], &[64, 64, 64][..]] {
        for (dtype, tol) in [(DType::F32, 1e-6), (DType::F64, 1e-14)] {
            let x = values(shape, dtype, 0.3)?;
            let fused = causal_softmax(&x, 0.35)?;
            let reference = reference_causal_softmax(&x, 0.35)?;
            let diff = max_abs_diff(&fused, &reference)?;
            assert!(diff < tol, "{shape:?} {dtype:?}: max diff {diff}");
        }
    }
    Ok(())
}

#[test]
fn the_fused_causal_softmax_gradient_matches_finite_differences() -> Result<()> {
    let worst = check_gradient(|x| causal_softmax(x, 0.35), &[2, 3, 5, 5])?;
    assert!(worst < 1e-7, "worst relative error {worst}");
    Ok(())
}

#[test]
fn the_fused_causal_softmax_gradient_matches_autograd_on_a_threaded_size() -> Result<()> {
    let shape = [64, 64, 64];
    let x = values(&shape, DType::F32, 0.3)?;
    let w = values(&shape, DType::F32, 1.7)?;
    let fused = autograd(|x| causal_softmax(x, 0.35), &x, &w)?;
    let reference = autograd(|x| reference_causal_softmax(x, 0.35), &x, &w)?;
    let diff = max_abs_diff(&fused, &reference)?;
    assert!(diff < 1e-5, "max diff {diff}");
    // Masked (future) positions get no gradient.
    let above: f64 = fused
        .get(0)?
        .get(0)?
        .narrow(0, 1, 63)?
        .abs()?
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar()?;
    assert_eq!(above, 0.0);
    Ok(())
}

#[test]
fn the_fused_gelu_matches_candle_gelu_in_f32_and_f64() -> Result<()> {
    for shape in [&[3, 7][..], &[256, 512][..]] {
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
            let x = values(shape, dtype, 0.3)?.affine(2.0, 0.0)?;
            let diff = max_abs_diff(&gelu_tanh(&x)?, &x.gelu()?)?;
            assert!(diff < tol, "{shape:?} {dtype:?}: max diff {diff}");
        }
    }
    Ok(())
}

#[test]
fn the_fused_gelu_gradient_matches_finite_differences() -> Result<()> {
    let worst = check_gradient(gelu_tanh, &[4, 9])?;
    assert!(worst < 1e-7, "worst relative error {worst}");
    Ok(())
}

#[test]
fn the_fused_gelu_gradient_matches_autograd_on_a_threaded_size() -> Result<()> {
    let shape = [256, 512];
    let x = values(&shape, DType::F32, 0.3)?.affine(2.0, 0.0)?;
    let w = values(&shape, DType::F32, 1.7)?;
    let fused = autograd(gelu_tanh, &x, &w)?;
    let reference = autograd(|x| x.gelu(), &x, &w)?;
    // candle's backward uses 6-digit constants, so agreement is to about 1e-5.
    let diff = max_abs_diff(&fused, &reference)?;
    assert!(diff < 1e-4, "max diff {diff}");
    Ok(())
}

/// LayerNorm from primitive ops, as the model computes it off-CPU.
fn reference_layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    xc.broadcast_div(&(var + eps)?.sqrt()?)?
        .broadcast_mul(w)?
        .broadcast_add(b)
}

#[test]
fn the_fused_layer_norm_matches_the_primitive_ops_in_f32_and_f64() -> Result<()> {
    for shape in [&[2, 3, 6][..], &[16, 128, 128][..]] {
        let c = shape[shape.len() - 1];
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
            let x = values(shape, dtype, 0.3)?;
            let w = values(&[c], dtype, 0.9)?;
            let b = values(&[c], dtype, 2.2)?;
            let fused = layer_norm(&x, &w, &b, 1e-5)?;
            let reference = reference_layer_norm(&x, &w, &b, 1e-5)?;
            let diff = max_abs_diff(&fused, &reference)?;
            assert!(diff < tol, "{shape:?} {dtype:?}: max diff {diff}");
        }
    }
    Ok(())
}

#[test]
fn the_fused_layer_norm_gradients_match_finite_differences() -> Result<()> {
    // Each of x, weight and bias in turn is the variable; the other two are fixed.
    let (x, w, b) = (
        values(&[2, 3, 6], DType::F64, 0.3)?,
        values(&[6], DType::F64, 0.9)?,
        values(&[6], DType::F64, 2.2)?,
    );
    let worst_x = check_gradient(|x| layer_norm(x, &w, &b, 1e-5), &[2, 3, 6])?;
    let worst_w = check_gradient(|w| layer_norm(&x, w, &b, 1e-5), &[6])?;
    let worst_b = check_gradient(|b| layer_norm(&x, &w, b, 1e-5), &[6])?;
    for (name, worst) in [("x", worst_x), ("weight", worst_w), ("bias", worst_b)] {
        assert!(worst < 1e-6, "{name}: worst relative error {worst}");
    }
    Ok(())
}

#[test]
fn the_fused_bias_add_gradients_match_finite_differences() -> Result<()> {
    let x = values(&[5, 4], DType::F64, 0.3)?;
    let b = values(&[4], DType::F64, 2.2)?;
    let worst_x = check_gradient(|x| add_bias(x, &b), &[5, 4])?;
    let worst_b = check_gradient(|b| add_bias(&x, b), &[4])?;
    assert!(worst_x < 1e-7 && worst_b < 1e-7, "{worst_x} {worst_b}");
    let diff = max_abs_diff(&add_bias(&x, &b)?, &x.broadcast_add(&b)?)?;
    assert_eq!(diff, 0.0);
    Ok(())
}

/// Mean cross-entropy from primitive ops.
fn reference_cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let logp = candle_nn::ops::log_softmax(logits, D::Minus1)?; // (N, V)
    let picked = logp.gather(&targets.unsqueeze(1)?, 1)?; // (N, 1)
    picked.neg()?.mean_all()
}

#[test]
fn the_fused_cross_entropy_matches_the_primitive_ops_and_finite_differences() -> Result<()> {
    let targets = Tensor::new(&[3u32, 0, 6, 6, 1], &Device::Cpu)?;
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
        let x = values(&[5, 7], dtype, 0.3)?;
        let fused: f64 = cross_entropy_mean(&x, &targets)?
            .to_dtype(DType::F64)?
            .to_scalar()?;
        let reference: f64 = reference_cross_entropy(&x, &targets)?
            .to_dtype(DType::F64)?
            .to_scalar()?;
        assert!(
            (fused - reference).abs() < tol,
            "{dtype:?}: {fused} vs {reference}"
        );
    }
    let worst = check_gradient(|x| cross_entropy_mean(x, &targets), &[5, 7])?;
    assert!(worst < 1e-7, "worst relative error {worst}");
    Ok(())
}

#[test]
fn the_fused_cross_entropy_refuses_a_target_outside_the_vocabulary() -> Result<()> {
    let x = values(&[2, 4], DType::F32, 0.3)?;
    let targets = Tensor::new(&[1u32, 4], &Device::Cpu)?;
    let err = cross_entropy_mean(&x, &targets).unwrap_err().to_string();
    assert!(err.contains("target 4 out of range"), "{err}");
    Ok(())
}
