//! Each op of `trainer::kernels` picks its own path: the fused CPU kernel for f32 and f64 CPU
//! tensors, candle's primitive ops otherwise. Here both paths of every op are held to each other
//! (values and gradients in f64), and the choice itself is checked: bf16 tensors and a bf16
//! autocast scope keep off the f32/f64 kernels.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Device, Result, Tensor, Var};
use trainer::config::Precision;
use trainer::kernels::{self, autocast, CausalAttention, Rope};

mod op_kit;
use op_kit::{max_abs_diff, values};

/// f(x) and the gradient of sum(w ⊙ f(x)) with respect to x, with a fixed weighting w.
fn value_and_gradient(
    f: &dyn Fn(&Tensor) -> Result<Tensor>,
    x: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let x = Var::from_tensor(x)?;
    let y = f(x.as_tensor())?;
    let w = values(y.dims(), y.dtype(), 1.7)?;
    let grads = (&y * w)?.sum_all()?.backward()?;
    let g = grads.get(x.as_tensor()).expect("x has a gradient").clone();
    Ok((y, g))
}

/// The causal mask the primitive softmax adds: 0 on and below the diagonal, −∞ above.
fn causal_mask(t: usize, dtype: DType) -> Result<Tensor> {
    let mask: Vec<f64> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(mask, (t, t), &Device::Cpu)?.to_dtype(dtype)
}

type Op = Box<dyn Fn(&Tensor) -> Result<Tensor>>;

/// Every op, as a function of its main input, with its other inputs fixed; and that input's
/// shape.
fn ops(dtype: DType) -> Result<Vec<(&'static str, Op, Vec<usize>)>> {
    let dev = Device::Cpu;
    let (w, b) = (values(&[5, 4], dtype, 1.1)?, values(&[5], dtype, 2.3)?);
    let (gain, shift) = (values(&[6], dtype, 0.9)?, values(&[6], dtype, 2.2)?);
    let bias = values(&[4], dtype, 0.4)?;
    let mask = causal_mask(8, dtype)?;
    let targets = Tensor::new(&[[3u32, 0, 6], [6, 1, 2]], &dev)?;
    let (h, hd, t) = (2, 4, 5);
    let plain = CausalAttention::new(h, 8, None, &dev, dtype)?;
    let rope = Rope::new(10_000.0, hd, 8, &dev, dtype)?;
    let rotary = CausalAttention::new(h, 8, Some(rope), &dev, dtype)?;
    let no_dropout = None::<fn(&Tensor) -> Result<Tensor>>;
    Ok(vec![
        (
            "linear",
            Box::new({
                let (w, b) = (w.clone(), b.clone());
                move |x| kernels::linear(x, &w, Some(&b))
            }),
            vec![2, 3, 4],
        ),
        (
            "linear without bias",
            Box::new(move |x| kernels::linear(x, &w, None)),
            vec![3, 4],
        ),
        (
            "add_bias",
            Box::new(move |x| kernels::add_bias(x, &bias)),
            vec![3, 4],
        ),
        (
            "layer_norm",
            Box::new(move |x| kernels::layer_norm(x, &gain, Some(&shift), 1e-5)),
            vec![2, 3, 6],
        ),
        ("gelu_tanh", Box::new(kernels::gelu_tanh), vec![3, 7]),
        (
            "causal_softmax",
            Box::new(move |x| kernels::causal_softmax(x, 0.35, &mask)),
            vec![3, 5, 5],
        ),
        (
            "attention",
            Box::new(move |x| plain.forward(x, no_dropout)),
            vec![2, t, 3 * h * hd],
        ),
        (
            "attention with rope",
            Box::new(move |x| rotary.forward(x, no_dropout)),
            vec![2, t, 3 * h * hd],
        ),
        (
            "cross_entropy",
            Box::new(move |x| kernels::cross_entropy(x, &targets)),
            vec![2, 3, 7],
        ),
    ])
}

#[test]
fn every_op_gives_the_same_values_and_gradients_on_its_fused_and_primitive_paths() -> Result<()> {
    for (name, op, shape) in ops(DType::F64)? {
        let x = values(&shape, DType::F64, 0.3)?;
        assert!(kernels::use_fused(&x));
        let (y_fused, g_fused) = value_and_gradient(&op, &x)?;
        let (y_prim, g_prim) = {
            let _primitives = kernels::primitives_only();
            assert!(!kernels::use_fused(&x), "{name}: the scope is open");
            value_and_gradient(&op, &x)?
        };
        assert!(kernels::use_fused(&x), "{name}: the scope ended");
        assert_eq!(y_fused.dims(), y_prim.dims(), "{name}");
        let dy = max_abs_diff(&y_fused, &y_prim)?;
        let dg = max_abs_diff(&g_fused, &g_prim)?;
        assert!(dy < 1e-12, "{name}: values differ by {dy}");
        // candle's GELU backward uses 6-digit constants; every other pair agrees to rounding.
        let grad_tol = if name == "gelu_tanh" { 1e-5 } else { 1e-12 };
        assert!(dg < grad_tol, "{name}: gradients differ by {dg}");
    }
    Ok(())
}

#[test]
fn bf16_tensors_run_through_every_op_and_agree_with_f32() -> Result<()> {
    // The fused kernels accept only f32 and f64, so an op that chose them for bf16 would fail
    // here: each takes its primitive path instead (cross-entropy computes in f32 whatever the
    // logits' dtype, and converts first).
    let (ops16, ops32) = (ops(DType::BF16)?, ops(DType::F32)?);
    for ((name, op16, shape), (_, op32, _)) in ops16.into_iter().zip(ops32) {
        let x32 = values(&shape, DType::F32, 0.3)?;
        let x16 = x32.to_dtype(DType::BF16)?;
        assert!(!kernels::use_fused(&x16));
        let (y16, g16) = value_and_gradient(&op16, &x16)?;
        let (y32, g32) = value_and_gradient(&op32, &x32)?;
        // bf16 keeps 8 bits of mantissa: agreement to about 2 % of the largest magnitude.
        for (what, a, b) in [("values", &y16, &y32), ("gradients", &g16, &g32)] {
            let scale = 1.0
                + b.abs()?
                    .flatten_all()?
                    .max(0)?
                    .to_dtype(DType::F64)?
                    .to_scalar::<f64>()?;
            let diff = max_abs_diff(a, b)?;
            assert!(
                diff < 0.02 * scale,
                "{name}: {what} differ by {diff} (scale {scale})"
            );
        }
    }
    Ok(())
}

#[test]
fn inside_a_bf16_autocast_scope_the_linear_op_multiplies_in_bf16() -> Result<()> {
    let dev = Device::Cpu;
    // 1 + 2^-10 is exact in f32 but rounds to 1 in bf16.
    let x = Tensor::new(&[[1.0f32 + 1.0 / 1024.0]], &dev)?;
    let w = Tensor::new(&[[1.0f32]], &dev)?;
    let exact = kernels::linear(&x, &w, None)?.to_vec2::<f32>()?[0][0];
    let rounded = {
        let _scope = autocast::autocast(Precision::Bf16);
        kernels::linear(&x, &w, None)?.to_vec2::<f32>()?[0][0]
    };
    assert_eq!(exact, 1.0 + 1.0 / 1024.0);
    assert_eq!(rounded, 1.0);
    Ok(())
}
