//! The grouped linear op of MoE experts (`trainer::kernels::grouped_linear`): the same bits as
//! one fused linear op per expert on its rows, and gradients that match finite differences.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Result, Tensor, Var};

use trainer::kernels::grouped_linear;
use trainer::kernels::linear::{fused_linear, linear_gelu};

mod op_kit;
use op_kit::{check_gradient, output_and_grads, values};

/// One expert at a time, as the MoE layer ran before the grouped op: each group's rows through
/// its own fused linear (and GELU) op, the outputs concatenated.
fn one_expert_at_a_time(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    counts: &[usize],
    gelu: bool,
) -> Result<Tensor> {
    let mut outs = Vec::new();
    let mut row = 0;
    for (e, &c) in counts.iter().enumerate() {
        if c > 0 {
            let (xe, we, be) = (x.narrow(0, row, c)?, w.get(e)?, b.get(e)?);
            outs.push(match gelu {
                true => linear_gelu(&xe, &we, Some(&be))?,
                false => fused_linear(&xe, &we, Some(&be))?,
            });
            row += c;
        }
    }
    Tensor::cat(&outs, 0)
}

#[test]
fn grouped_experts_give_the_bits_of_one_op_per_expert_with_and_without_gelu() -> Result<()> {
    // Four experts, one without rows in the middle and one at the end; groups big enough to
    // be split across threads and one of a single row. Then one expert with enough rows for
    // its weight gradient to be summed over them in chunks.
    let cases: [(&[usize], usize, usize); 2] = [
        (&[300, 0, 1, 211, 0], 128, 96),
        (&[2100, 7, 0, 300], 32, 24),
    ];
    for (counts, d_in, d_out) in cases {
        let m = counts.iter().sum::<usize>();
        let x = values(&[m, d_in], DType::F32, 0.3)?;
        let w = (values(&[counts.len(), d_out, d_in], DType::F32, 1.1)? * 0.1)?;
        let b = values(&[counts.len(), d_out], DType::F32, 2.3)?;
        let g = values(&[m, d_out], DType::F32, 0.7)?;
        for gelu in [false, true] {
            let (dims, grouped) = output_and_grads(
                &|x, w, b| grouped_linear(x, w, b, counts, gelu),
                [&x, &w, &b],
                &g,
            )?;
            assert_eq!(dims, [m, d_out]);
            let (_, separate) = output_and_grads(
                &|x, w, b| one_expert_at_a_time(x, w, b, counts, gelu),
                [&x, &w, &b],
                &g,
            )?;
            for (i, what) in ["y", "dx", "dw", "db"].iter().enumerate() {
                assert_eq!(grouped[i], separate[i], "{what}, gelu {gelu}, {counts:?}");
            }
        }
    }
    Ok(())
}

#[test]
fn an_expert_without_rows_gets_zero_weight_and_bias_gradients() -> Result<()> {
    let counts = [3, 0, 2];
    let x = Var::from_tensor(&values(&[5, 4], DType::F32, 0.3)?)?;
    let w = Var::from_tensor(&values(&[3, 6, 4], DType::F32, 1.1)?)?;
    let b = Var::from_tensor(&values(&[3, 6], DType::F32, 2.3)?)?;
    let y = grouped_linear(x.as_tensor(), w.as_tensor(), b.as_tensor(), &counts, true)?;
    let grads = y.sum_all()?.backward()?;
    let dw = grads.get(w.as_tensor()).expect("dw");
    let db = grads.get(b.as_tensor()).expect("db");
    assert_eq!(dw.get(1)?.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
    assert_eq!(db.get(1)?.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
    assert!(dw.get(0)?.abs()?.sum_all()?.to_scalar::<f32>()? > 0.0);
    Ok(())
}

#[test]
fn grouped_linear_gradients_match_finite_differences_on_the_fused_and_primitive_paths() -> Result<()>
{
    let counts = [2, 0, 3];
    let x = values(&[5, 3], DType::F64, 0.3)?;
    let w = values(&[3, 4, 3], DType::F64, 1.1)?;
    let b = values(&[3, 4], DType::F64, 2.3)?;
    for (gelu, primitive) in [(false, false), (true, false), (false, true), (true, true)] {
        // The primitive path is the one a GPU takes: one linear op per group, concatenated.
        let _scope = primitive.then(trainer::kernels::primitives_only);
        let f = |x: &Tensor, w: &Tensor, b: &Tensor| grouped_linear(x, w, b, &counts, gelu);
        for (name, worst) in [
            ("x", check_gradient(|x| f(x, &w, &b), &[5, 3])?),
            ("w", check_gradient(|w| f(&x, w, &b), &[3, 4, 3])?),
            ("b", check_gradient(|b| f(&x, &w, b), &[3, 4])?),
        ] {
            // candle's own GELU backward (the primitive path's) rounds its constants to six
            // digits, about 5e-7 off the exact derivative.
            let tolerance = if gelu && primitive { 2e-6 } else { 1e-7 };
            assert!(
                worst < tolerance,
                "d{name}, gelu {gelu}, primitive {primitive}: worst relative error {worst}"
            );
        }
    }
    Ok(())
}

#[test]
fn groups_that_do_not_cover_the_rows_are_refused() -> Result<()> {
    let x = values(&[5, 3], DType::F32, 0.3)?;
    let w = values(&[2, 4, 3], DType::F32, 1.1)?;
    let b = values(&[2, 4], DType::F32, 2.3)?;
    let err = grouped_linear(&x, &w, &b, &[2, 2], false).unwrap_err();
    assert!(err.to_string().contains("groups"), "{err}");
    let err = grouped_linear(&x, &w, &b, &[2, 2, 1], false).unwrap_err();
    assert!(err.to_string().contains("3 groups"), "{err}");
    Ok(())
}
