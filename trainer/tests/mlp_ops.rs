//! The GELU MLP op (`trainer::kernels::gelu_mlp`): a dense MLP gives the bits of its two layers'
//! ops, the experts of an MoE layer the bits of two grouped linear ops, and the gradients match
//! finite differences on the fused and primitive paths.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Result, Tensor};

use trainer::kernels::linear::{fused_linear, linear_gelu};
use trainer::kernels::{gelu_mlp, grouped_linear};

mod op_kit;
use op_kit::{check_gradient, outputs_and_grads, values};

/// E experts' (W_fc (F, D), b_fc (F), W_proj (O, F), b_proj (O)), flattened in that order.
fn experts(e: usize, (d, f, o): (usize, usize, usize), dtype: DType) -> Result<Vec<Tensor>> {
    let mut out = Vec::new();
    for i in 0..e {
        let phase = 0.37 * i as f64;
        out.push((values(&[f, d], dtype, 1.1 + phase)? * 0.1)?);
        out.push(values(&[f], dtype, 2.3 + phase)?);
        out.push((values(&[o, f], dtype, 0.9 + phase)? * 0.1)?);
        out.push(values(&[o], dtype, 1.9 + phase)?);
    }
    Ok(out)
}

/// `gelu_mlp` of x = t[0] and the experts' tensors t[1..] in groups of four.
fn mlp(t: &[Tensor], counts: &[usize]) -> Result<Tensor> {
    let weights: Vec<[&Tensor; 4]> = t[1..]
        .chunks(4)
        .map(|w| [&w[0], &w[1], &w[2], &w[3]])
        .collect();
    gelu_mlp(&t[0], &weights, counts)
}

#[test]
fn a_dense_mlp_gives_the_bits_of_its_two_layer_ops() -> Result<()> {
    // 3 × 700 rows: split across threads, and 2,100 rows make two chunks of the weight
    // gradients' sums; a hidden width that is no multiple of the vector width.
    let (d, f, o) = (48, 100, 40);
    let x = values(&[3, 700, d], DType::F32, 0.3)?;
    let w = experts(1, (d, f, o), DType::F32)?;
    let g = values(&[3, 700, o], DType::F32, 0.7)?;
    let inputs: Vec<&Tensor> = std::iter::once(&x).chain(&w).collect();
    let (dims, fused) = outputs_and_grads(&|t| mlp(t, &[2100]), &inputs, &g)?;
    assert_eq!(dims, [3, 700, o]);
    let two_ops = |t: &[Tensor]| {
        let h = linear_gelu(&t[0], &t[1], Some(&t[2]))?;
        fused_linear(&h, &t[3], Some(&t[4]))
    };
    let (_, separate) = outputs_and_grads(&two_ops, &inputs, &g)?;
    for (i, what) in ["y", "dx", "dW_fc", "db_fc", "dW_proj", "db_proj"]
        .iter()
        .enumerate()
    {
        assert_eq!(fused[i], separate[i], "{what}");
    }
    Ok(())
}

#[test]
fn experts_give_the_bits_of_two_grouped_linear_ops() -> Result<()> {
    // Five experts: one without rows in the middle and one at the end, one of a single row,
    // one long enough for its weight gradients to be summed in chunks.
    let counts = [300, 0, 1, 2100, 0];
    let m: usize = counts.iter().sum();
    let (d, f, o) = (32, 64, 32);
    let x = values(&[m, d], DType::F32, 0.4)?;
    let w = experts(counts.len(), (d, f, o), DType::F32)?;
    let g = values(&[m, o], DType::F32, 0.9)?;
    let inputs: Vec<&Tensor> = std::iter::once(&x).chain(&w).collect();
    let (dims, fused) = outputs_and_grads(&|t| mlp(t, &counts), &inputs, &g)?;
    assert_eq!(dims, [m, o]);
    let grouped = |t: &[Tensor]| {
        let stack =
            |i: usize| Tensor::stack(&t[1..].iter().skip(i).step_by(4).collect::<Vec<_>>(), 0);
        let h = grouped_linear(&t[0], &stack(0)?, &stack(1)?, &counts, true)?;
        grouped_linear(&h, &stack(2)?, &stack(3)?, &counts, false)
    };
    // The reference stacks the experts' tensors itself, so its gradients reach them one by one.
    let (_, separate) = outputs_and_grads(&grouped, &inputs, &g)?;
    assert_eq!(fused, separate);
    // The experts without rows get zero gradients, the others not.
    let zero = 0f32.to_bits();
    for (e, &c) in counts.iter().enumerate() {
        for p in 0..4 {
            let grad = &fused[2 + 4 * e + p];
            assert_eq!(
                grad.iter().all(|&v| v == zero),
                c == 0,
                "expert {e}, tensor {p}"
            );
        }
    }
    Ok(())
}

#[test]
fn mlp_gradients_match_finite_differences_on_the_fused_and_primitive_paths() -> Result<()> {
    let (d, f, o) = (3, 5, 4);
    for (counts, primitive) in [
        (&[4usize][..], false),
        (&[2, 0, 3], false),
        (&[4], true),
        (&[2, 0, 3], true),
    ] {
        let _scope = primitive.then(trainer::kernels::primitives_only);
        let m: usize = counts.iter().sum();
        let x = values(&[m, d], DType::F64, 0.3)?;
        let w = experts(counts.len(), (d, f, o), DType::F64)?;
        let with = |i: usize, v: &Tensor| -> Vec<Tensor> {
            let mut t: Vec<Tensor> = std::iter::once(&x).chain(&w).cloned().collect();
            t[i] = v.clone();
            t
        };
        let all: Vec<&Tensor> = std::iter::once(&x).chain(&w).collect();
        for (i, t) in all.iter().enumerate() {
            let worst = check_gradient(|v| mlp(&with(i, v), counts), t.dims())?;
            // candle's own GELU backward (the primitive path's) rounds its constants to six
            // digits, about 5e-7 off the exact derivative.
            let tolerance = if primitive { 2e-6 } else { 1e-7 };
            assert!(
                worst < tolerance,
                "input {i}, groups {counts:?}, primitive {primitive}: worst relative error {worst}"
            );
        }
    }
    Ok(())
}

#[test]
fn experts_of_different_shapes_and_groups_that_do_not_cover_the_rows_are_refused() -> Result<()> {
    let x = values(&[5, 3], DType::F32, 0.3)?;
    let mut w = experts(2, (3, 4, 3), DType::F32)?;
    let mlp2 = |w: &[Tensor], counts: &[usize]| {
        let t: Vec<Tensor> = std::iter::once(&x).chain(w).cloned().collect();
        mlp(&t, counts)
    };
    let err = mlp2(&w, &[2, 2]).unwrap_err().to_string();
    assert!(err.contains("groups of [2, 2] rows for 5 rows"), "{err}");
    let err = mlp2(&w, &[5]).unwrap_err().to_string();
    assert!(err.contains("1 groups of rows for 2 experts"), "{err}");
    w[4] = values(&[4, 2], DType::F32, 0.1)?; // expert 1's W_fc with the wrong input width
    let err = mlp2(&w, &[2, 3]).unwrap_err().to_string();
    assert!(err.contains("expert 1 has W_fc [4, 2]"), "{err}");
    Ok(())
}
