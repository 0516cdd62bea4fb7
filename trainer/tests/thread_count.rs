//! The fused CPU ops give the same bits whatever the number of threads: every way they split
//! work across threads (blocks of rows, whole MoE experts, the (batch, head) pairs of the
//! attention, the chunks of a weight gradient's sum over the tokens, the MLP's blocks of rows,
//! the MoE combine's blocks of tokens and of assignments) leaves each value summed in the same
//! order. One test in a binary of its own, since the thread count is process-wide (candle reads
//! it from the environment at every op).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Result, Tensor};

mod op_kit;
use op_kit::{autograd, bits, output_and_grads, outputs_and_grads, values};

use trainer::kernels::attention::fused_causal_attention;
use trainer::kernels::linear::{fused_linear, linear_gelu};
use trainer::kernels::norm::fused_layer_norm;
use trainer::kernels::{combine_rows, gelu_mlp, grouped_linear};

/// The bits of the outputs and gradients of each op, on shapes that split across threads.
fn every_op() -> Result<Vec<Vec<u32>>> {
    let mut all = Vec::new();
    // A linear layer (and one with GELU) over 3,000 rows: the forward and the input gradient
    // in blocks of rows, the weight gradient summed over the rows in two chunks.
    let (n, d_in, d_out) = (3000, 48, 40);
    let x = values(&[n, d_in], DType::F32, 0.3)?;
    let w = (values(&[d_out, d_in], DType::F32, 1.1)? * 0.1)?;
    let b = values(&[d_out], DType::F32, 2.3)?;
    let g = values(&[n, d_out], DType::F32, 0.7)?;
    all.extend(output_and_grads(&|x, w, b| fused_linear(x, w, Some(b)), [&x, &w, &b], &g)?.1);
    all.extend(output_and_grads(&|x, w, b| linear_gelu(x, w, Some(b)), [&x, &w, &b], &g)?.1);

    // MoE experts with uneven rows, one without any and one long enough for chunks.
    let counts = [900, 40, 0, 2100, 500];
    let m = counts.iter().sum::<usize>();
    let x = values(&[m, d_in], DType::F32, 0.4)?;
    let w = (values(&[counts.len(), d_out, d_in], DType::F32, 1.3)? * 0.1)?;
    let b = values(&[counts.len(), d_out], DType::F32, 2.1)?;
    let g = values(&[m, d_out], DType::F32, 0.9)?;
    let grouped = |x: &Tensor, w: &Tensor, b: &Tensor| grouped_linear(x, w, b, &counts, true);
    all.extend(output_and_grads(&grouped, [&x, &w, &b], &g)?.1);

    // The same experts as whole GELU MLPs (fc, GELU and proj per block of rows), as one op.
    let w_fc: Vec<Tensor> = (0..counts.len()).map(|e| w.get(e)).collect::<Result<_>>()?;
    let b_fc: Vec<Tensor> = (0..counts.len()).map(|e| b.get(e)).collect::<Result<_>>()?;
    let w_proj: Vec<Tensor> = w_fc
        .iter()
        .map(|w| w.t()?.contiguous())
        .collect::<Result<_>>()?;
    let b_proj: Vec<Tensor> = (0..counts.len())
        .map(|e| values(&[d_in], DType::F32, 0.2 * e as f64))
        .collect::<Result<_>>()?;
    let mut inputs = vec![&x];
    for e in 0..counts.len() {
        inputs.extend([&w_fc[e], &b_fc[e], &w_proj[e], &b_proj[e]]);
    }
    let mlp = |t: &[Tensor]| {
        let experts: Vec<[&Tensor; 4]> = t[1..]
            .chunks(4)
            .map(|w| [&w[0], &w[1], &w[2], &w[3]])
            .collect();
        gelu_mlp(&t[0], &experts, &counts)
    };
    let g_mlp = values(&[m, d_in], DType::F32, 1.1)?;
    all.extend(outputs_and_grads(&mlp, &inputs, &g_mlp)?.1);

    // The experts' outputs back into 3,000 tokens of top-2, weighted by their gates.
    let (tokens, slots): (Vec<u32>, Vec<u32>) = (0..n as u32)
        .flat_map(|t| [(t, 2 * t), (t, 2 * t + 1)])
        .filter(|&(t, _)| t % 5 != 2)
        .unzip();
    let ys = values(&[tokens.len(), d_in], DType::F32, 0.6)?;
    let gates = values(&[n, 2], DType::F32, 1.4)?;
    let g = values(&[n, d_in], DType::F32, 0.8)?;
    let combine = |t: &[Tensor]| combine_rows(&t[0], &t[1], &tokens, &slots);
    all.extend(outputs_and_grads(&combine, &[&ys, &gates], &g)?.1);

    // Causal attention at T = 150 (three blocks of rows per head), 3 × 4 (batch, head) pairs.
    let (bsz, t, h, hd) = (3, 150, 4, 8);
    let qkv = values(&[bsz, t, 3 * h * hd], DType::F32, 0.3)?;
    let wy = values(&[bsz, t, h * hd], DType::F32, 1.7)?;
    let attention = |x: &Tensor| fused_causal_attention(x, h, 0.35, None);
    all.push(bits(&attention(&qkv)?)?);
    all.push(bits(&autograd(attention, &qkv, &wy)?)?);

    // Layer norm over 3,000 rows (its gain and bias gradients reduced over blocks of rows).
    let x = values(&[n, d_in], DType::F32, 0.5)?;
    let gain = values(&[d_in], DType::F32, 1.9)?;
    let shift = values(&[d_in], DType::F32, 2.7)?;
    let g = values(&[n, d_in], DType::F32, 0.8)?;
    let norm = |x: &Tensor, w: &Tensor, b: &Tensor| fused_layer_norm(x, w, b, 1e-5);
    all.extend(output_and_grads(&norm, [&x, &gain, &shift], &g)?.1);
    Ok(all)
}

#[test]
fn the_fused_ops_give_the_same_bits_on_one_two_and_three_threads() -> Result<()> {
    let mut runs = Vec::new();
    // Three first, so candle's pool starts with two workers beside the calling thread.
    for threads in [3, 1, 2] {
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
        assert_eq!(candle_core::utils::get_num_threads(), threads);
        runs.push((threads, every_op()?));
    }
    let (_, first) = &runs[0];
    for (threads, run) in &runs[1..] {
        assert_eq!(run.len(), first.len());
        for (i, (a, b)) in run.iter().zip(first).enumerate() {
            assert!(
                a == b,
                "result {i} differs on {threads} threads from 3 threads"
            );
        }
    }
    Ok(())
}
