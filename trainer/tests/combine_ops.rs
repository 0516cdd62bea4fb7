//! The MoE combine op (`trainer::kernels::combine_rows`): the output and the rows' gradient are
//! the bits of the primitive ops (gather, broadcast multiply, index-add), the gates' gradient
//! matches them to rounding, both paths match finite differences, dropped assignments and
//! tokens without any get nothing, and an inconsistent routing is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Result, Tensor};

use trainer::kernels::{combine_rows, primitives_only};

mod op_kit;
use op_kit::{check_gradient, max_abs_diff, outputs_and_grads, values};

/// A routing of n tokens with k choices each over 4 experts: (tokens, slots) grouped by expert,
/// every 7th assignment dropped (as by a capacity), and the last token with none kept.
fn routing(n: usize, k: usize) -> (Vec<u32>, Vec<u32>) {
    let mut pairs = Vec::new();
    for e in 0..4 {
        for t in 0..n {
            for j in 0..k {
                let s = t * k + j;
                if (t * 3 + j * 5) % 4 == e && s % 7 != 3 && t + 1 < n {
                    pairs.push((t as u32, s as u32));
                }
            }
        }
    }
    pairs.into_iter().unzip()
}

/// The routing of n tokens with k choices, expert outputs ys (M, d), gates (N, k) and an
/// upstream gradient (N, d) in `dtype`.
type Inputs = (Vec<u32>, Vec<u32>, Tensor, Tensor, Tensor);

fn inputs((n, k, d): (usize, usize, usize), dtype: DType) -> Result<Inputs> {
    let (tokens, slots) = routing(n, k);
    let ys = values(&[tokens.len(), d], dtype, 0.3)?;
    let gates = values(&[n, k], dtype, 1.1)?;
    let g = values(&[n, d], dtype, 0.7)?;
    Ok((tokens, slots, ys, gates, g))
}

/// The f32 values of `bits`.
fn floats(bits: &[u32]) -> Vec<f32> {
    bits.iter().map(|&b| f32::from_bits(b)).collect()
}

#[test]
fn the_output_and_rows_gradient_are_the_primitive_ops_bits_and_the_gates_gradient_their_value(
) -> Result<()> {
    // 3,000 tokens of top-2: blocks on both threads; a width that is no multiple of 16.
    let (n, k, d) = (3000, 2, 37);
    let (tokens, slots, ys, gates, g) = inputs((n, k, d), DType::F32)?;
    let gates = (gates * 0.25)?;
    let op = |t: &[Tensor]| combine_rows(&t[0], &t[1], &tokens, &slots);
    let (dims, fused) = outputs_and_grads(&op, &[&ys, &gates], &g)?;
    assert_eq!(dims, [n, d]);
    let (_, primitive) = {
        let _scope = primitives_only();
        outputs_and_grads(&op, &[&ys, &gates], &g)?
    };
    assert_eq!(fused[0], primitive[0], "y");
    assert_eq!(fused[1], primitive[1], "dL/dys");
    // dL/dgates sums D products in another order: equal to rounding, not bit for bit.
    let as_tensor = |b: &[u32]| Tensor::from_vec(floats(b), (n, k), &candle_core::Device::Cpu);
    let (fused_dg, primitive_dg) = (as_tensor(&fused[2])?, as_tensor(&primitive[2])?);
    let diff = max_abs_diff(&fused_dg, &primitive_dg)?;
    let scale: f32 = primitive_dg.abs()?.flatten_all()?.max(0)?.to_scalar()?;
    // A few units in the last place of the largest value (sums of 37 products).
    assert!(
        diff < 1e-6 * f64::from(scale),
        "dL/dgates differs by {diff} at scale {scale}"
    );
    Ok(())
}

#[test]
fn dropped_assignments_and_tokens_without_any_get_no_output_and_no_gradient() -> Result<()> {
    let (n, k, d) = (6, 2, 3);
    let (tokens, slots, ys, gates, g) = inputs((n, k, d), DType::F32)?;
    let op = |t: &[Tensor]| combine_rows(&t[0], &t[1], &tokens, &slots);
    let (_, fused) = outputs_and_grads(&op, &[&ys, &gates], &g)?;
    let (y, dgates) = (floats(&fused[0]), floats(&fused[2]));
    // The last token kept nothing: a zero row.
    assert!(y[(n - 1) * d..].iter().all(|&v| v == 0.0), "{y:?}");
    for (s, &dg) in dgates.iter().enumerate() {
        let kept = slots.contains(&(s as u32));
        assert_eq!(dg != 0.0, kept, "gate {s}: {dg}");
    }
    // A kept gate's gradient is its row of dL/dy dotted with its expert's output.
    let (m, s) = (0, slots[0] as usize);
    let t = tokens[m] as usize;
    let gv: Vec<f32> = g.flatten_all()?.to_vec1()?;
    let yv: Vec<f32> = ys.flatten_all()?.to_vec1()?;
    let dot: f32 = (0..d).map(|j| gv[t * d + j] * yv[m * d + j]).sum();
    assert!((dgates[s] - dot).abs() < 1e-5, "{} vs {dot}", dgates[s]);
    Ok(())
}

#[test]
fn combine_gradients_match_finite_differences_on_the_fused_and_primitive_paths() -> Result<()> {
    let (tokens, slots, ys, gates, _) = inputs((5, 2, 3), DType::F64)?;
    for primitive in [false, true] {
        let _scope = primitive.then(primitives_only);
        let worst = check_gradient(|v| combine_rows(v, &gates, &tokens, &slots), ys.dims())?;
        assert!(worst < 1e-8, "ys, primitive {primitive}: {worst}");
        let worst = check_gradient(|v| combine_rows(&ys, v, &tokens, &slots), gates.dims())?;
        assert!(worst < 1e-8, "gates, primitive {primitive}: {worst}");
    }
    Ok(())
}

#[test]
fn an_inconsistent_routing_is_refused_with_its_reason() -> Result<()> {
    let ys = values(&[3, 2], DType::F32, 0.3)?;
    let gates = values(&[2, 2], DType::F32, 1.1)?;
    let cases: [(&[u32], &[u32], &str); 5] = [
        (&[0, 1], &[0, 2], "2 assignments for 3 rows"),
        (&[0, 1, 1], &[0, 2], "3 tokens for 2 gate slots"),
        (&[0, 1, 2], &[0, 2, 3], "assignment 2 is token 2"),
        (
            &[0, 1, 0],
            &[0, 2, 2],
            "assignment 2 is token 0 with gate 2",
        ),
        (&[0, 1, 1], &[0, 2, 2], "gate 2 is used by two assignments"),
    ];
    for (tokens, slots, reason) in cases {
        let err = combine_rows(&ys, &gates, tokens, slots)
            .unwrap_err()
            .to_string();
        assert!(err.contains(reason), "{reason}: {err}");
    }
    Ok(())
}
