//! The fused CPU kernels of `trainer::kernels` (causal softmax, tanh-GELU, bias add, LayerNorm,
//! cross-entropy, attention, linear), called directly, against candle's primitive ops written
//! out here and against finite differences, on small tensors (one thread) and on big ones
//! (split across threads).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Device, Result, Tensor, Var, D};
use std::sync::Arc;

mod op_kit;
use op_kit::{autograd, bits, check_gradient, max_abs_diff, output_and_grads, values};

use trainer::kernels::attention::{fused_causal_attention, fused_qkv_attention, RopeTables};
use trainer::kernels::bias::fused_add_bias;
use trainer::kernels::gelu::fused_gelu_tanh;
use trainer::kernels::gelu_tanh;
use trainer::kernels::linear::{fused_linear, linear_gelu};
use trainer::kernels::loss::fused_cross_entropy;
use trainer::kernels::norm::fused_layer_norm;
use trainer::kernels::softmax::fused_causal_softmax;

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

#[test]
fn the_fused_causal_softmax_matches_the_primitive_ops_in_f32_and_f64() -> Result<()> {
    // (2, 3, 5, 5) runs on one thread; (64, 64, 64) is split across threads.
    for shape in [&[2, 3, 5, 5][..], &[64, 64, 64][..]] {
        for (dtype, tol) in [(DType::F32, 1e-6), (DType::F64, 1e-14)] {
            let x = values(shape, dtype, 0.3)?;
            let fused = fused_causal_softmax(&x, 0.35)?;
            let reference = reference_causal_softmax(&x, 0.35)?;
            let diff = max_abs_diff(&fused, &reference)?;
            assert!(diff < tol, "{shape:?} {dtype:?}: max diff {diff}");
        }
    }
    Ok(())
}

#[test]
fn the_fused_causal_softmax_gradient_matches_finite_differences() -> Result<()> {
    let worst = check_gradient(|x| fused_causal_softmax(x, 0.35), &[2, 3, 5, 5])?;
    assert!(worst < 1e-7, "worst relative error {worst}");
    Ok(())
}

#[test]
fn the_fused_causal_softmax_gradient_matches_autograd_on_a_threaded_size() -> Result<()> {
    let shape = [64, 64, 64];
    let x = values(&shape, DType::F32, 0.3)?;
    let w = values(&shape, DType::F32, 1.7)?;
    let fused = autograd(|x| fused_causal_softmax(x, 0.35), &x, &w)?;
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
            let diff = max_abs_diff(&fused_gelu_tanh(&x)?, &x.gelu()?)?;
            assert!(diff < tol, "{shape:?} {dtype:?}: max diff {diff}");
        }
    }
    Ok(())
}

#[test]
fn the_fused_gelu_gradient_matches_finite_differences() -> Result<()> {
    let worst = check_gradient(fused_gelu_tanh, &[4, 9])?;
    assert!(worst < 1e-7, "worst relative error {worst}");
    Ok(())
}

#[test]
fn the_fused_gelu_gradient_matches_autograd_on_a_threaded_size() -> Result<()> {
    let shape = [256, 512];
    let x = values(&shape, DType::F32, 0.3)?.affine(2.0, 0.0)?;
    let w = values(&shape, DType::F32, 1.7)?;
    let fused = autograd(fused_gelu_tanh, &x, &w)?;
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
            let fused = fused_layer_norm(&x, &w, &b, 1e-5)?;
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
    let worst_x = check_gradient(|x| fused_layer_norm(x, &w, &b, 1e-5), &[2, 3, 6])?;
    let worst_w = check_gradient(|w| fused_layer_norm(&x, w, &b, 1e-5), &[6])?;
    let worst_b = check_gradient(|b| fused_layer_norm(&x, &w, b, 1e-5), &[6])?;
    for (name, worst) in [("x", worst_x), ("weight", worst_w), ("bias", worst_b)] {
        assert!(worst < 1e-6, "{name}: worst relative error {worst}");
    }
    Ok(())
}

#[test]
fn the_fused_bias_add_gradients_match_finite_differences() -> Result<()> {
    let x = values(&[5, 4], DType::F64, 0.3)?;
    let b = values(&[4], DType::F64, 2.2)?;
    let worst_x = check_gradient(|x| fused_add_bias(x, &b), &[5, 4])?;
    let worst_b = check_gradient(|b| fused_add_bias(&x, b), &[4])?;
    assert!(worst_x < 1e-7 && worst_b < 1e-7, "{worst_x} {worst_b}");
    let diff = max_abs_diff(&fused_add_bias(&x, &b)?, &x.broadcast_add(&b)?)?;
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
        let fused: f64 = fused_cross_entropy(&x, &targets)?
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
    let worst = check_gradient(|x| fused_cross_entropy(x, &targets), &[5, 7])?;
    assert!(worst < 1e-7, "worst relative error {worst}");
    Ok(())
}

#[test]
fn the_fused_cross_entropy_refuses_a_target_outside_the_vocabulary() -> Result<()> {
    let x = values(&[2, 4], DType::F32, 0.3)?;
    let targets = Tensor::new(&[1u32, 4], &Device::Cpu)?;
    let err = fused_cross_entropy(&x, &targets).unwrap_err().to_string();
    assert!(err.contains("target 4 out of range"), "{err}");
    Ok(())
}

/// Causal attention of packed qkv (B, T, 3·D) from candle primitives, as the model computed it
/// before the fused op (rotate-half RoPE from the same tables when given).
fn reference_attention(qkv: &Tensor, h: usize, rope: Option<&RopeTables>) -> Result<Tensor> {
    let (b, t, d3) = qkv.dims3()?;
    let hd = d3 / 3 / h;
    let qkv = qkv.reshape((b, t, 3, h, hd))?.permute((2, 0, 3, 1, 4))?;
    let rotate = |x: Tensor| -> Result<Tensor> {
        let Some(r) = rope else { return Ok(x) };
        let cos = Tensor::from_vec(r.cos[..t * r.half].to_vec(), (t, r.half), x.device())?
            .to_dtype(x.dtype())?;
        let sin = Tensor::from_vec(r.sin[..t * r.half].to_vec(), (t, r.half), x.device())?
            .to_dtype(x.dtype())?;
        let x1 = x.narrow(D::Minus1, 0, r.half)?;
        let x2 = x.narrow(D::Minus1, r.half, r.half)?;
        let r1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
        let r2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
        Tensor::cat(&[r1, r2], D::Minus1)
    };
    let q = rotate(qkv.get(0)?.contiguous()?)?;
    let k = rotate(qkv.get(1)?.contiguous()?)?;
    let v = qkv.get(2)?.contiguous()?;
    let scale = 1.0 / (hd as f64).sqrt();
    let scores = q.matmul(&k.t()?.contiguous()?)?; // (B, H, T, T)
    let att = reference_causal_softmax(&scores.reshape((b * h, t, t))?, scale)?;
    let y = att.reshape((b, h, t, t))?.matmul(&v)?; // (B, H, T, hd)
    y.transpose(1, 2)?.reshape((b, t, h * hd))
}

fn rope_tables(max_t: usize, hd: usize) -> Arc<RopeTables> {
    let half = hd / 2;
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for pos in 0..max_t {
        for i in 0..half {
            let angle = pos as f64 * 10_000f64.powf(-2.0 * i as f64 / hd as f64);
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    Arc::new(RopeTables { cos, sin, half })
}

#[test]
fn the_fused_attention_matches_the_primitive_ops_with_and_without_rope() -> Result<()> {
    // (2, 5, 3·2·4) runs on one thread; (4, 64, 3·4·32) is split across threads; at T = 150
    // each head runs in three causal blocks of rows, the last one partial.
    for (b, t, h, hd) in [(2, 5, 2, 4), (4, 64, 4, 32), (2, 150, 2, 8)] {
        for rope in [None, Some(rope_tables(t + 3, hd))] {
            for (dtype, tol) in [(DType::F32, 2e-5), (DType::F64, 1e-12)] {
                let qkv = values(&[b, t, 3 * h * hd], dtype, 0.3)?;
                let scale = 1.0 / (hd as f64).sqrt();
                let fused = fused_causal_attention(&qkv, h, scale, rope.clone())?;
                let reference = reference_attention(&qkv, h, rope.as_deref())?;
                let diff = max_abs_diff(&fused, &reference)?;
                let label = (b, t, h, hd, rope.is_some(), dtype);
                assert!(diff < tol, "{label:?}: forward max diff {diff}");

                let w = values(&[b, t, h * hd], dtype, 1.7)?;
                let g_fused = autograd(
                    |x| fused_causal_attention(x, h, scale, rope.clone()),
                    &qkv,
                    &w,
                )?;
                let g_ref = autograd(|x| reference_attention(x, h, rope.as_deref()), &qkv, &w)?;
                let diff = max_abs_diff(&g_fused, &g_ref)?;
                assert!(diff < 10.0 * tol, "{label:?}: gradient max diff {diff}");
            }
        }
    }
    Ok(())
}

#[test]
fn the_fused_attention_gradient_matches_finite_differences() -> Result<()> {
    let (h, hd) = (2, 4);
    for rope in [None, Some(rope_tables(8, hd))] {
        let scale = 1.0 / (hd as f64).sqrt();
        let f = |x: &Tensor| fused_causal_attention(x, h, scale, rope.clone());
        let worst = check_gradient(f, &[2, 4, 3 * h * hd])?;
        assert!(
            worst < 1e-7,
            "rope {}: worst relative error {worst}",
            rope.is_some()
        );
    }
    Ok(())
}

#[test]
fn a_later_position_never_changes_an_earlier_output_of_the_fused_attention() -> Result<()> {
    let (b, t, h, hd) = (1, 6, 2, 4);
    let qkv = values(&[b, t, 3 * h * hd], DType::F64, 0.3)?;
    let before = fused_causal_attention(&qkv, h, 0.5, None)?;
    // Change everything at the last position: outputs 0..T-1 must not move.
    let last = (qkv.narrow(1, t - 1, 1)? + 3.0)?;
    let changed = Tensor::cat(&[qkv.narrow(1, 0, t - 1)?, last], 1)?;
    let after = fused_causal_attention(&changed, h, 0.5, None)?;
    let diff = max_abs_diff(&before.narrow(1, 0, t - 1)?, &after.narrow(1, 0, t - 1)?)?;
    assert_eq!(diff, 0.0);
    assert!(max_abs_diff(&before, &after)? > 1e-3);
    Ok(())
}

#[test]
fn the_fused_linear_matches_the_primitive_ops_with_and_without_bias() -> Result<()> {
    // (3, 5) → 4 runs on one thread; (512, 128) → 384 is split across threads; over 3,000
    // and 9,000 rows the weight gradient is summed in 2 and 8 chunks of rows.
    for (n, d_in, d_out) in [(3, 5, 4), (512, 128, 384), (3000, 40, 24), (9000, 16, 24)] {
        for (dtype, tol) in [(DType::F32, 1e-4), (DType::F64, 1e-12)] {
            let x = values(&[n, d_in], dtype, 0.3)?;
            let w = values(&[d_out, d_in], dtype, 1.1)?;
            let b = values(&[d_out], dtype, 2.3)?;
            let reference = x.matmul(&w.t()?)?.broadcast_add(&b)?;
            let diff = max_abs_diff(&fused_linear(&x, &w, Some(&b))?, &reference)?;
            assert!(
                diff < tol,
                "{n}x{d_in}x{d_out} {dtype:?}: with bias, max diff {diff}"
            );
            let diff = max_abs_diff(&fused_linear(&x, &w, None)?, &x.matmul(&w.t()?)?)?;
            assert!(
                diff < tol,
                "{n}x{d_in}x{d_out} {dtype:?}: no bias, max diff {diff}"
            );

            // Gradients of every input against autograd through the primitive ops.
            let g = values(&[n, d_out], dtype, 0.7)?;
            let (xv, wv, bv) = (
                Var::from_tensor(&x)?,
                Var::from_tensor(&w)?,
                Var::from_tensor(&b)?,
            );
            let fused = (fused_linear(xv.as_tensor(), wv.as_tensor(), Some(bv.as_tensor()))? * &g)?
                .sum_all()?
                .backward()?;
            let prim = (xv
                .as_tensor()
                .matmul(&wv.as_tensor().t()?)?
                .broadcast_add(bv.as_tensor())?
                * &g)?
                .sum_all()?
                .backward()?;
            for (name, var) in [("x", &xv), ("w", &wv), ("b", &bv)] {
                let a = fused.get(var.as_tensor()).expect("fused gradient");
                let r = prim.get(var.as_tensor()).expect("primitive gradient");
                let diff = max_abs_diff(a, r)?;
                assert!(
                    diff < 20.0 * tol,
                    "{n}x{d_in}x{d_out} {dtype:?}: d{name} max diff {diff}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn the_fused_linear_takes_leading_dims_as_rows_with_the_same_values_and_gradients() -> Result<()> {
    // (2, 64, 128) → 384: the model's (batch, time, channels) without a reshape, against the
    // same rows as one (128, 128) matrix; both split across threads.
    let (b, t, d_in, d_out) = (2, 64, 128, 384);
    let x = values(&[b, t, d_in], DType::F32, 0.3)?;
    let w = values(&[d_out, d_in], DType::F32, 1.1)?;
    let bias = values(&[d_out], DType::F32, 2.3)?;
    let g = values(&[b, t, d_out], DType::F32, 0.7)?;
    for with_bias in [true, false] {
        let bias = with_bias.then_some(&bias);
        let (xv, wv) = (Var::from_tensor(&x)?, Var::from_tensor(&w)?);
        let y3 = fused_linear(xv.as_tensor(), wv.as_tensor(), bias)?;
        assert_eq!(y3.dims(), &[b, t, d_out]);
        let grads3 = (&y3 * &g)?.sum_all()?.backward()?;
        let (xv2, wv2) = (
            Var::from_tensor(&x.reshape((b * t, d_in))?)?,
            Var::from_tensor(&w)?,
        );
        let y2 = fused_linear(xv2.as_tensor(), wv2.as_tensor(), bias)?;
        let grads2 = (&y2 * &g.reshape((b * t, d_out))?)?.sum_all()?.backward()?;
        assert_eq!(bits(&y3)?, bits(&y2)?, "bias {with_bias}: outputs");
        let dx3 = grads3.get(xv.as_tensor()).expect("dx");
        assert_eq!(dx3.dims(), &[b, t, d_in]);
        let dx2 = grads2.get(xv2.as_tensor()).expect("dx");
        assert_eq!(bits(dx3)?, bits(dx2)?, "bias {with_bias}: dx");
        let (dw3, dw2) = (grads3.get(wv.as_tensor()), grads2.get(wv2.as_tensor()));
        assert_eq!(
            bits(dw3.expect("dw"))?,
            bits(dw2.expect("dw"))?,
            "bias {with_bias}: dw"
        );
    }
    Ok(())
}

#[test]
fn the_fused_layer_norm_takes_leading_dims_as_rows_with_the_same_values_and_gradients() -> Result<()>
{
    let (b, t, c) = (2, 64, 128);
    let x = values(&[b, t, c], DType::F32, 0.3)?;
    let w = values(&[c], DType::F32, 1.1)?;
    let bias = values(&[c], DType::F32, 2.3)?;
    let g = values(&[b, t, c], DType::F32, 0.7)?;
    let run = |x: &Tensor| -> Result<(Tensor, Tensor, Tensor)> {
        let (xv, wv) = (Var::from_tensor(x)?, Var::from_tensor(&w)?);
        let y = fused_layer_norm(xv.as_tensor(), wv.as_tensor(), &bias, 1e-5)?;
        let grads = (&y * &g.reshape(x.shape())?)?.sum_all()?.backward()?;
        let dx = grads.get(xv.as_tensor()).expect("dx").clone();
        let dw = grads.get(wv.as_tensor()).expect("dw").clone();
        Ok((y, dx, dw))
    };
    let (y3, dx3, dw3) = run(&x)?;
    let (y2, dx2, dw2) = run(&x.reshape((b * t, c))?)?;
    assert_eq!((y3.dims(), dx3.dims()), (&[b, t, c][..], &[b, t, c][..]));
    assert_eq!(bits(&y3)?, bits(&y2)?);
    assert_eq!(bits(&dx3)?, bits(&dx2)?);
    assert_eq!(bits(&dw3)?, bits(&dw2)?);
    Ok(())
}

#[test]
fn the_one_op_linear_gelu_gives_the_bits_of_a_linear_then_a_gelu() -> Result<()> {
    let (b, t, d_in, d_out) = (2, 64, 128, 512);
    let x = values(&[b, t, d_in], DType::F32, 0.3)?;
    let w = (values(&[d_out, d_in], DType::F32, 1.1)? * 0.1)?;
    let bias = values(&[d_out], DType::F32, 2.3)?;
    let g = values(&[b, t, d_out], DType::F32, 0.7)?;
    let (dims, one_op) =
        output_and_grads(&|x, w, b| linear_gelu(x, w, Some(b)), [&x, &w, &bias], &g)?;
    assert_eq!(dims, [b, t, d_out]);
    let (_, two_ops) = output_and_grads(
        &|x, w, b| gelu_tanh(&fused_linear(x, w, Some(b))?),
        [&x, &w, &bias],
        &g,
    )?;
    for (i, what) in ["y", "dx", "dw", "db"].iter().enumerate() {
        assert_eq!(one_op[i], two_ops[i], "{what}");
    }
    // And by finite differences in f64, for every input.
    let x = values(&[4, 3], DType::F64, 0.3)?;
    let w = values(&[5, 3], DType::F64, 1.1)?;
    let b = values(&[5], DType::F64, 2.3)?;
    for (name, worst) in [
        (
            "x",
            check_gradient(|x| linear_gelu(x, &w, Some(&b)), &[4, 3])?,
        ),
        (
            "w",
            check_gradient(|w| linear_gelu(&x, w, Some(&b)), &[5, 3])?,
        ),
        ("b", check_gradient(|b| linear_gelu(&x, &w, Some(b)), &[5])?),
    ] {
        assert!(worst < 1e-7, "d{name}: worst relative error {worst}");
    }
    Ok(())
}

#[test]
fn the_one_op_projection_and_attention_give_the_bits_of_the_two_ops() -> Result<()> {
    let (b, t, c, h) = (2, 16, 32, 4);
    let x = values(&[b, t, c], DType::F32, 0.3)?;
    let w = (values(&[3 * c, c], DType::F32, 1.1)? * 0.2)?;
    let bias = values(&[3 * c], DType::F32, 2.3)?;
    let g = values(&[b, t, c], DType::F32, 0.7)?;
    let scale = 1.0 / ((c / h) as f64).sqrt();
    for rope in [None, Some(rope_tables(t, c / h))] {
        let (dims, one_op) = output_and_grads(
            &|x, w, b| fused_qkv_attention(x, w, b, h, scale, rope.clone()),
            [&x, &w, &bias],
            &g,
        )?;
        assert_eq!(dims, [b, t, c]);
        let (_, two_ops) = output_and_grads(
            &|x, w, b| {
                fused_causal_attention(&fused_linear(x, w, Some(b))?, h, scale, rope.clone())
            },
            [&x, &w, &bias],
            &g,
        )?;
        for (i, what) in ["y", "dx", "dw", "db"].iter().enumerate() {
            assert_eq!(one_op[i], two_ops[i], "{what}, rope {}", rope.is_some());
        }
    }
    Ok(())
}

#[test]
fn the_fused_linear_gradients_match_finite_differences() -> Result<()> {
    let x = values(&[4, 3], DType::F64, 0.3)?;
    let w = values(&[5, 3], DType::F64, 1.1)?;
    let b = values(&[5], DType::F64, 2.3)?;
    let wrt_x = check_gradient(|x| fused_linear(x, &w, Some(&b)), &[4, 3])?;
    let wrt_w = check_gradient(|w| fused_linear(&x, w, Some(&b)), &[5, 3])?;
    let wrt_b = check_gradient(|b| fused_linear(&x, &w, Some(b)), &[5])?;
    let wrt_w_no_bias = check_gradient(|w| fused_linear(&x, w, None), &[5, 3])?;
    for (name, worst) in [
        ("x", wrt_x),
        ("w", wrt_w),
        ("b", wrt_b),
        ("w, no bias", wrt_w_no_bias),
    ] {
        assert!(worst < 1e-7, "d{name}: worst relative error {worst}");
    }
    Ok(())
}

#[test]
fn threaded_layer_norm_and_cross_entropy_gradients_match_autograd_through_primitive_ops(
) -> Result<()> {
    // Sizes that split across candle's threads (rows in blocks, partial sums reduced).
    let (n, c, v) = (1000, 128, 256);
    let x = values(&[n, c], DType::F32, 0.3)?;
    let w = values(&[c], DType::F32, 0.9)?;
    let b = values(&[c], DType::F32, 2.2)?;
    let weights = values(&[n, c], DType::F32, 1.7)?;
    let (xv, wv, bv) = (
        Var::from_tensor(&x)?,
        Var::from_tensor(&w)?,
        Var::from_tensor(&b)?,
    );
    let objective = |f: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>| -> Result<_> {
        (f(xv.as_tensor(), wv.as_tensor(), bv.as_tensor())? * &weights)?
            .sum_all()?
            .backward()
    };
    let fused = objective(&|x, w, b| fused_layer_norm(x, w, b, 1e-5))?;
    let prim = objective(&|x, w, b| reference_layer_norm(x, w, b, 1e-5))?;
    for (name, var, tol) in [("x", &xv, 1e-4), ("weight", &wv, 1e-2), ("bias", &bv, 1e-2)] {
        let diff = max_abs_diff(
            fused.get(var.as_tensor()).expect("fused gradient"),
            prim.get(var.as_tensor()).expect("primitive gradient"),
        )?;
        assert!(diff < tol, "layer norm d{name}: max diff {diff}");
    }

    let logits = values(&[n, v], DType::F32, 0.3)?.affine(3.0, 0.0)?;
    let targets: Vec<u32> = (0..n as u32).map(|i| (i * 37) % v as u32).collect();
    let targets = Tensor::new(targets.as_slice(), &Device::Cpu)?;
    let fused = fused_cross_entropy(&logits, &targets)?.to_scalar::<f32>()?;
    let reference = reference_cross_entropy(&logits, &targets)?.to_scalar::<f32>()?;
    assert!(
        (fused - reference).abs() < 1e-5,
        "loss {fused} vs {reference}"
    );
    let g_fused = autograd(
        |x| fused_cross_entropy(x, &targets),
        &logits,
        &Tensor::new(1f32, &Device::Cpu)?,
    )?;
    let g_ref = autograd(
        |x| reference_cross_entropy(x, &targets),
        &logits,
        &Tensor::new(1f32, &Device::Cpu)?,
    )?;
    let diff = max_abs_diff(&g_fused, &g_ref)?;
    assert!(diff < 1e-7, "cross-entropy gradient max diff {diff}");
    Ok(())
}
