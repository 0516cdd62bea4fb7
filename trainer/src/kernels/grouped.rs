//! Grouped linear layers: the experts of an MoE layer as one op. The rows of x come grouped by
//! expert (the first `counts[0]` rows go to expert 0, the next `counts[1]` to expert 1, ...) and
//! group e goes through its own layer, y_e = x_e·W_eᵀ + b_e (then tanh-GELU, for a GELU MLP's
//! first layer), with W stacked (E, out, in) and b (E, out).
//!
//! Why one op: one expert at a time, each expert's input is a `narrow` of the routed rows and
//! the outputs are `cat`ed back. candle's backward of each `narrow` zero-pads the expert's
//! gradient to all M routed rows and adds it into the running sum, and its `cat` backward
//! copies every slice out again, so an 8-expert layer moved about ten times its activations per
//! step just to put gradients back in place. Here each group's GEMMs read and write their own
//! rows of one buffer. Each group runs the same kernels in the same order as the one-expert
//! ops, so the values are the same bits.

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape};
use candle_core::{Tensor, D};

use super::bias::add_column_sums;
use super::gemm::View;
use super::linear::{as_rows, gelu_keeping, GeluGradOfStash};
use super::parallel::{for_each_block, SharedMut};
use super::products::{summed_products_into, written_by, Product};
use super::real::{float_kernel, Real, Stash};

/// x (M, in), rows grouped by `counts` (E groups summing to M), through W (E, out, in) and
/// b (E, out) → (M, out); with `gelu`, tanh-GELU of each output. Fused on CPU in f32 and f64;
/// elsewhere one `linear` (or `linear_gelu`) per group on a `narrow` of x, `cat`ed back.
pub fn grouped_linear(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    counts: &[usize],
    gelu: bool,
) -> Result<Tensor> {
    if super::use_fused(x) && !super::autocast::is_active() {
        let op = GroupedLinear {
            counts: counts.to_vec(),
            gelu,
            gelu_grad: Stash::default(),
        };
        return x
            .contiguous()?
            .apply_op3(&w.contiguous()?, &b.contiguous()?, op);
    }
    let mut outs = Vec::with_capacity(counts.len());
    let mut offset = 0;
    for (e, &count) in counts.iter().enumerate() {
        if count > 0 {
            let (xe, we, be) = (x.narrow(0, offset, count)?, w.get(e)?, b.get(e)?);
            outs.push(match gelu {
                true => super::linear_gelu(&xe, &we, Some(&be))?,
                false => super::linear(&xe, &we, Some(&be))?,
            }); // (count, out)
            offset += count;
        }
    }
    if outs.is_empty() {
        return x.zeros_like()?.narrow(D::Minus1, 0, 0); // no rows
    }
    Tensor::cat(&outs, 0) // (M, out)
}

/// The shapes of a call, checked: (E, M, in, out).
fn check(counts: &[usize], x: &Layout, w: &Layout, b: &Layout) -> Result<[usize; 4]> {
    let (m, d_in) = as_rows(x)?;
    let (e, d_out, w_in) = w.shape().dims3()?;
    if e != counts.len() || b.dims() != [e, d_out] || w_in != d_in {
        bail!(
            "grouped-linear: weight {:?} and bias {:?} for {} groups of input {:?}",
            w.dims(),
            b.dims(),
            counts.len(),
            x.dims()
        );
    }
    if counts.iter().sum::<usize>() != m {
        bail!("grouped-linear: groups of {counts:?} rows for {m} rows");
    }
    Ok([e, m, d_in, d_out])
}

/// (e, first row, rows) of every group.
pub(crate) fn groups(counts: &[usize]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    counts.iter().enumerate().scan(0, |row, (e, &c)| {
        let first = *row;
        *row += c;
        Some((e, first, c))
    })
}

/// y (M, out) = x_e·W_eᵀ + b_e for every group, all groups in one parallel section.
fn forward<T: Real>(counts: &[usize], x: &[T], w: &[T], b: &[T], d: [usize; 4]) -> Result<Vec<T>> {
    let [_, m, d_in, d_out] = d;
    let len = m * d_out;
    let products: Vec<_> = groups(counts)
        .filter(|g| g.2 > 0)
        .map(|(e, row, c)| Product {
            dims: (c, d_out, d_in),
            off: row * d_out,
            lhs: x,
            lv: View::rows(row * d_in, d_in),
            rhs: w,
            rv: View::rows(e * d_out * d_in, d_in).transposed(), // W_eᵀ (in, out)
            bias: Some(&b[e * d_out..(e + 1) * d_out]),
        })
        .collect();
    // SAFETY: the groups cover rows 0..M, and each product all `out` values of its rows.
    unsafe { written_by(len, &products) }
}

/// Experts' linear layers (and GELU) as one op.
#[derive(Clone)]
struct GroupedLinear {
    counts: Vec<usize>,
    gelu: bool,
    /// With `gelu`, the GELU's derivative at the pre-activations, for the backward
    /// (`gelu_keeping`).
    gelu_grad: Stash,
}

impl std::fmt::Debug for GroupedLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupedLinear({:?}, gelu: {})", self.counts, self.gelu)
    }
}

impl GroupedLinear {
    fn run<T: Real>(&self, x: &[T], w: &[T], b: &[T], d: [usize; 4]) -> Result<Vec<T>> {
        let y = forward(&self.counts, x, w, b, d)?;
        match self.gelu {
            true => gelu_keeping(y, &self.gelu_grad),
            false => Ok(y),
        }
    }
}

impl CustomOp3 for GroupedLinear {
    fn name(&self) -> &'static str {
        "grouped-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = check(&self.counts, l1, l2, l3)?;
        let name = self.name();
        let out =
            float_kernel!(name; x = (s1, l1), w = (s2, l2), b = (s3, l3) => self.run(x, w, b, d)?);
        Ok((out, Shape::from((d[1], d[3]))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let mut g = grad.contiguous()?; // (M, out)
        if self.gelu {
            g = g.apply_op1_no_bwd(&GeluGradOfStash::new(&self.gelu_grad))?;
        }
        let groups = Groups(self.counts.clone());
        let dx = g.apply_op2_no_bwd(w, &GradInput(groups.clone()))?; // (M, in)
        let dw = g.apply_op2_no_bwd(x, &GradWeight(groups.clone()))?; // (E, out, in)
        let db = g.apply_op1_no_bwd(&GradBias(groups))?; // (E, out)
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// The gradients of `GroupedLinear` from g = dL/d(pre-activation) (M, out), per group of
/// rows: dx_e = g_e·W_e, dW_e = g_eᵀ·x_e, db_e = Σ rows of g_e.
#[derive(Clone)]
struct Groups(Vec<usize>);

impl Groups {
    /// dx (M, in) from g (M, out) and W (E, out, in).
    fn input<T: Real>(&self, g: &[T], w: &[T], d_in: usize, d_out: usize) -> Result<Vec<T>> {
        let len = g.len() / d_out * d_in;
        let products: Vec<_> = groups(&self.0)
            .filter(|g| g.2 > 0)
            .map(|(e, row, c)| Product {
                dims: (c, d_in, d_out),
                off: row * d_in,
                lhs: g,
                lv: View::rows(row * d_out, d_out),
                rhs: w,
                rv: View::rows(e * d_out * d_in, d_in),
                bias: None,
            })
            .collect();
        // SAFETY: the groups cover rows 0..M, and each product all `in` values of its rows.
        unsafe { written_by(len, &products) }
    }

    /// dW (E, out, in) from g (M, out) and x (M, in) (`weight_grads_into`).
    fn weight<T: Real>(&self, g: &[T], x: &[T], d_in: usize, d_out: usize) -> Result<Vec<T>> {
        let len = self.0.len() * d_out * d_in;
        let mut out = Vec::<T>::with_capacity(len);
        weight_grads_into(
            &self.0,
            g,
            x,
            (d_in, d_out),
            (SharedMut(out.as_mut_ptr()), len),
        )?;
        // SAFETY: `weight_grads_into` wrote all E·out·in values.
        unsafe { out.set_len(len) };
        Ok(out)
    }

    /// db (E, out) from g (M, out) (`bias_grads_into`).
    fn bias<T: Real>(&self, g: &[T], d_out: usize) -> Result<Vec<T>> {
        let len = self.0.len() * d_out;
        let mut out = Vec::<T>::with_capacity(len);
        bias_grads_into(&self.0, g, d_out, (SharedMut(out.as_mut_ptr()), len))?;
        // SAFETY: `bias_grads_into` wrote all E·out values.
        unsafe { out.set_len(len) };
        Ok(out)
    }
}

/// dW_e = g_eᵀ·x_e (out, in) of every group of rows (`counts`) into `dst` = (pointer, E·out·in
/// values), from g (M, out) and x (M, in): each group summed over its rows in chunks as a linear
/// layer's dW is (`summed_products_into`), zero for a group without rows. Every value of `dst`
/// is written.
pub(crate) fn weight_grads_into<T: Real>(
    counts: &[usize],
    g: &[T],
    x: &[T],
    (d_in, d_out): (usize, usize),
    (dst, len): (SharedMut<T>, usize),
) -> Result<()> {
    if len != counts.len() * d_out * d_in {
        bail!(
            "grouped-linear: a weight gradient of {len} values for {} groups",
            counts.len()
        );
    }
    let mut products = Vec::with_capacity(counts.len());
    for (e, row, c) in groups(counts) {
        let off = e * d_out * d_in;
        if c == 0 {
            // SAFETY: dW_e's values lie inside `dst` and no product writes them.
            unsafe { std::ptr::write_bytes(dst.ptr().add(off), 0, d_out * d_in) };
            continue;
        }
        products.push(Product {
            dims: (d_out, d_in, c),
            off,
            lhs: g,
            lv: View::rows(row * d_out, d_out).transposed(), // g_eᵀ (out, c)
            rhs: x,
            rv: View::rows(row * d_in, d_in),
            bias: None,
        });
    }
    summed_products_into(&products, (dst, len))
}

/// db_e = Σ rows of g_e (out values) of every group of rows (`counts`) into `dst` = (pointer,
/// E·out values), from g (M, out): blocks of 64 columns of one group in one parallel section (a
/// section per group left the threads waiting at the end of each), each column summed over the
/// group's rows in order. Every value of `dst` is written.
pub(crate) fn bias_grads_into<T: Real>(
    counts: &[usize],
    g: &[T],
    d_out: usize,
    (dst, len): (SharedMut<T>, usize),
) -> Result<()> {
    const BLOCK_COLS: usize = 64;
    if len != counts.len() * d_out {
        bail!(
            "grouped-linear: a bias gradient of {len} values for {} groups",
            counts.len()
        );
    }
    let per_group = d_out.div_ceil(BLOCK_COLS);
    let starts: Vec<(usize, usize)> = groups(counts).map(|(_, row, c)| (row, c)).collect();
    for_each_block(counts.len() * per_group, g.len(), |blk| {
        let (e, c0) = (blk / per_group, blk % per_group * BLOCK_COLS);
        let (row, c) = starts[e];
        let cols = BLOCK_COLS.min(d_out - c0);
        // SAFETY: columns c0..c0 + cols of db_e lie inside `dst` and belong to this block
        // alone; they are zeroed before the slice is made.
        let out = unsafe {
            let p = dst.ptr().add(e * d_out + c0);
            std::ptr::write_bytes(p, 0, cols);
            std::slice::from_raw_parts_mut(p, cols)
        };
        add_column_sums(&g[row * d_out..(row + c) * d_out], d_out, c0, out);
        Ok(())
    })
}

/// (g (M, out), W (E, out, in)) → dx (M, in).
struct GradInput(Groups);

impl CustomOp2 for GradInput {
    fn name(&self) -> &'static str {
        "grouped-linear-grad-input"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (m, d_out) = as_rows(l1)?;
        let (_, _, d_in) = l2.shape().dims3()?;
        let out = float_kernel!(self.name(); g = (s1, l1), w = (s2, l2) => self.0.input(g, w, d_in, d_out)?);
        Ok((out, Shape::from((m, d_in))))
    }
}

/// (g (M, out), x (M, in)) → dW (E, out, in).
struct GradWeight(Groups);

impl CustomOp2 for GradWeight {
    fn name(&self) -> &'static str {
        "grouped-linear-grad-weight"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, d_out) = as_rows(l1)?;
        let (_, d_in) = as_rows(l2)?;
        let out = float_kernel!(self.name(); g = (s1, l1), x = (s2, l2) => self.0.weight(g, x, d_in, d_out)?);
        Ok((out, Shape::from((self.0 .0.len(), d_out, d_in))))
    }
}

/// g (M, out) → db (E, out).
struct GradBias(Groups);

impl CustomOp1 for GradBias {
    fn name(&self) -> &'static str {
        "grouped-linear-grad-bias"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, d_out) = as_rows(l)?;
        let out = float_kernel!(self.name(); g = (s, l) => self.0.bias(g, d_out)?);
        Ok((out, Shape::from((self.0 .0.len(), d_out))))
    }
}
