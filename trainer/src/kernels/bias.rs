//! Bias add (N, C) + (C,), and the column sums its backward needs (also the bias gradient of
//! the fused linear layer).
//!
//! candle's broadcast add is fine forward, but its backward reduces the (N, C) gradient over N
//! with a strided fold; here the bias gradient is summed one contiguous row at a time, in
//! parallel blocks of columns.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

use super::parallel::filled_by_chunks;
use super::real::{float_kernel, Real};

/// x (N, C) + bias (C,); on CPU in f32 and f64 with the row-wise bias gradient, elsewhere
/// candle's broadcast add.
pub fn add_bias(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    if super::use_fused(x) {
        fused_add_bias(x, bias)
    } else {
        x.broadcast_add(bias)
    }
}

/// The fused CPU path of `add_bias`.
pub fn fused_add_bias(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&bias.contiguous()?, AddBias)
}

/// (.., C) → (C,): column sums of a CPU tensor taken as rows, without a backward.
pub(crate) fn sum_rows(g: &Tensor) -> Result<Tensor> {
    g.contiguous()?.apply_op1_no_bwd(&SumRows)
}

/// (N, C) + (C,), with the bias gradient summed row by row.
#[derive(Debug, Clone, Copy)]
struct AddBias;

fn add_bias_rows<T: Real>(x: &[T], b: &[T]) -> Vec<T> {
    let mut out = x.to_vec();
    for row in out.chunks_mut(b.len()) {
        for (o, &bv) in row.iter_mut().zip(b) {
            *o += bv;
        }
    }
    out
}

impl CustomOp2 for AddBias {
    fn name(&self) -> &'static str {
        "add-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, c) = l1.shape().dims2()?;
        if l2.dims() != [c] {
            bail!(
                "add-bias: bias {:?} does not match {:?}",
                l2.dims(),
                l1.dims()
            );
        }
        let n = self.name();
        let out = float_kernel!(n; x = (s1, l1), b = (s2, l2) => add_bias_rows(x, b));
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = grad_res.contiguous()?; // (N, C)
        let grad_b = g.apply_op1_no_bwd(&SumRows)?; // (C,)
        Ok((Some(g), Some(grad_b)))
    }
}

/// (N, C) → (C,): the sum over rows, accumulated one contiguous row at a time.
#[derive(Debug, Clone, Copy)]
struct SumRows;

/// Column sums of g taken as rows of c values.
pub(crate) fn column_sums<T: Real>(g: &[T], c: usize) -> Result<Vec<T>> {
    // Column blocks in parallel; each sums its columns over all rows, in row order.
    const BLOCK_COLS: usize = 64;
    let rows = g.len() / c.max(1);
    let work = c.div_ceil(BLOCK_COLS) * BLOCK_COLS * rows;
    let acc = filled_by_chunks(c, BLOCK_COLS, work, |blk, out| {
        add_column_sums(g, c, blk * BLOCK_COLS, out);
        Ok(())
    })?;
    Ok(acc)
}

/// out += the sums over the rows of g (rows of c values) of columns c0..c0 + out.len(), each
/// column summed in row order.
pub(crate) fn add_column_sums<T: Real>(g: &[T], c: usize, c0: usize, out: &mut [T]) {
    if c == 0 {
        return; // rows without columns: `out` is empty too
    }
    T::add_column_sums(g, c, c0, out)
}

impl CustomOp1 for SumRows {
    fn name(&self) -> &'static str {
        "sum-rows"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, c) = super::linear::as_rows(layout)?;
        let n = self.name();
        let out = float_kernel!(n; v = (storage, layout) => column_sums(v, c)?);
        Ok((out, Shape::from(c)))
    }
}
