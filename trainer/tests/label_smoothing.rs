//! Label smoothing (`training.label_smoothing`): the smoothed cross-entropy against a value
//! worked out by hand, on the fused CPU path and on the primitive path that CUDA takes, its
//! gradient against finite differences, and the threaded fused path against autograd through the
//! primitives.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Device, Result, Tensor, Var};

use trainer::kernels::loss::{fused_smoothed_cross_entropy, smoothed_cross_entropy};
use trainer::kernels::primitives_only;

/// Two rows over a vocabulary of 3, ε = 0.1.
///
/// Row 1, logits (1, 2, 3), target 2: lse = ln(e + e² + e³) = 3.40760596444438, so the
/// plain loss is lse − 3 = 0.4076059644443801; the uniform part is lse − mean = lse − 2 =
/// 1.4076059644443801; smoothed: 0.9·0.4076059644443801 + 0.1·1.4076059644443801 =
/// 0.5076059644443801.
///
/// Row 2, logits (0, 0, 0), target 0: every part is ln 3 = 1.0986122886681098.
///
/// Mean: (0.5076059644443801 + 1.0986122886681098) / 2 = 0.8031091265562449.
const HAND_COMPUTED: f64 = 0.803_109_126_556_244_9;

fn hand_case() -> Result<(Tensor, Tensor)> {
    let logits = Tensor::new(&[[1.0f64, 2.0, 3.0], [0.0, 0.0, 0.0]], &Device::Cpu)?;
    let targets = Tensor::new(&[2u32, 0], &Device::Cpu)?;
    Ok((logits, targets))
}

#[test]
fn the_smoothed_loss_equals_the_hand_computed_value_on_the_fused_and_primitive_paths() -> Result<()>
{
    let (logits, targets) = hand_case()?;
    let fused: f64 = smoothed_cross_entropy(&logits, &targets, 0.1)?.to_scalar()?;
    let primitive: f64 = {
        let _scope = primitives_only();
        smoothed_cross_entropy(&logits, &targets, 0.1)?.to_scalar()?
    };
    assert!((fused - HAND_COMPUTED).abs() < 1e-12, "fused {fused}");
    assert!(
        (primitive - HAND_COMPUTED).abs() < 1e-12,
        "primitive {primitive}"
    );
    // In f32 on the fused path too (the training dtype).
    let f32_loss: f32 =
        smoothed_cross_entropy(&logits.to_dtype(DType::F32)?, &targets, 0.1)?.to_scalar()?;
    assert!((f64::from(f32_loss) - HAND_COMPUTED).abs() < 1e-6);
    Ok(())
}

#[test]
fn no_smoothing_is_the_plain_cross_entropy() -> Result<()> {
    let (logits, targets) = hand_case()?;
    let plain: f64 = smoothed_cross_entropy(&logits, &targets, 0.0)?.to_scalar()?;
    let expected = (0.407_605_964_444_380_1 + 1.098_612_288_668_109_8) / 2.0;
    assert!((plain - expected).abs() < 1e-12, "{plain}");
    Ok(())
}

#[test]
fn a_smoothing_outside_zero_to_one_is_refused() -> Result<()> {
    let (logits, targets) = hand_case()?;
    for bad in [1.0, -0.1, f64::NAN] {
        let err = smoothed_cross_entropy(&logits, &targets, bad).unwrap_err();
        assert!(err.to_string().contains("label smoothing"), "{err}");
    }
    Ok(())
}

/// Deterministic values in roughly [-2, 2].
fn values(shape: &[usize], phase: f64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let j = Tensor::arange(0u32, n as u32, &Device::Cpu)?.to_dtype(DType::F64)?;
    ((j * 0.61)? + phase)?
        .sin()?
        .affine(2.0, 0.0)?
        .reshape(shape)
}

/// Gradient of the smoothed loss with respect to the logits, by autograd.
fn gradient(logits: &Tensor, targets: &Tensor, smoothing: f64) -> Result<Tensor> {
    let x = Var::from_tensor(logits)?;
    let grads = smoothed_cross_entropy(x.as_tensor(), targets, smoothing)?.backward()?;
    Ok(grads
        .get(x.as_tensor())
        .expect("logits have a gradient")
        .clone())
}

#[test]
fn the_fused_smoothed_gradient_matches_finite_differences() -> Result<()> {
    let shape = [5, 7];
    let targets = Tensor::new(&[3u32, 0, 6, 6, 1], &Device::Cpu)?;
    let base = values(&shape, 0.3)?;
    let analytic: Vec<f64> = gradient(&base, &targets, 0.2)?.flatten_all()?.to_vec1()?;
    let flat: Vec<f64> = base.flatten_all()?.to_vec1()?;
    let loss_at = |xs: Vec<f64>| -> Result<f64> {
        let x = Tensor::from_vec(xs, &shape, &Device::Cpu)?;
        fused_smoothed_cross_entropy(&x, &targets, 0.2)?.to_scalar()
    };
    let h = 1e-6;
    let mut worst: f64 = 0.0;
    for i in 0..flat.len() {
        let mut bumped = flat.clone();
        bumped[i] += h;
        let plus = loss_at(bumped.clone())?;
        bumped[i] -= 2.0 * h;
        let minus = loss_at(bumped)?;
        let numeric = (plus - minus) / (2.0 * h);
        worst = worst.max((numeric - analytic[i]).abs() / (1.0 + numeric.abs()));
    }
    assert!(worst < 1e-8, "worst relative error {worst}");
    Ok(())
}

#[test]
fn the_threaded_fused_smoothed_loss_and_gradient_match_the_primitive_path() -> Result<()> {
    // Enough rows for several parallel blocks.
    let (n, v) = (300, 50);
    let logits = values(&[n, v], 0.9)?;
    let targets: Vec<u32> = (0..n as u32).map(|i| (i * 7) % v as u32).collect();
    let targets = Tensor::new(targets.as_slice(), &Device::Cpu)?;
    let fused: f64 = smoothed_cross_entropy(&logits, &targets, 0.3)?.to_scalar()?;
    let fused_grad = gradient(&logits, &targets, 0.3)?;
    let _scope = primitives_only();
    let reference: f64 = smoothed_cross_entropy(&logits, &targets, 0.3)?.to_scalar()?;
    let reference_grad = gradient(&logits, &targets, 0.3)?;
    assert!((fused - reference).abs() < 1e-12, "{fused} vs {reference}");
    let diff: f64 = (fused_grad - reference_grad)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar()?;
    assert!(diff < 1e-14, "largest gradient difference {diff}");
    Ok(())
}
