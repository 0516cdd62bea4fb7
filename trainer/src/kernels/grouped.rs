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
use super::parallel::{filled_by_chunks, SharedMut};
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
            pre: Stash::default(),
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
fn groups(counts: &[usize]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
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
    /// With `gelu`, the pre-activations, for the backward.
    pre: Stash,
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
            true => gelu_keeping(y, &self.pre),
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
            g = g.apply_op1_no_bwd(&GeluGradOfStash::new(&self.pre))?;
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

    /// dW (E, out, in) from g (M, out) and x (M, in), each group summed over its rows in
    /// chunks as a linear layer's dW is (`summed_products_into`); zero for a group without rows.
    fn weight<T: Real>(&self, g: &[T], x: &[T], d_in: usize, d_out: usize) -> Result<Vec<T>> {
        let len = self.0.len() * d_out * d_in;
        let mut out = Vec::<T>::with_capacity(len);
        let dst = SharedMut(out.as_mut_ptr());
        let mut products = Vec::with_capacity(self.0.len());
        for (e, row, c) in groups(&self.0) {
            let off = e * d_out * d_in;
            if c == 0 {
                // SAFETY: dW_e's values lie inside `out`'s capacity and no product writes them.
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
        summed_products_into(&products, (dst, len))?;
        // SAFETY: the groups cover 0..E, and each dW_e was written whole (zeros when empty).
        unsafe { out.set_len(len) };
        Ok(out)
    }

    /// db (E, out) from g (M, out): one block per group in one parallel section (a section per
    /// group left the threads waiting at the end of each), each column summed over the group's
    /// rows in order.
    fn bias<T: Real>(&self, g: &[T], d_out: usize) -> Result<Vec<T>> {
        let starts: Vec<(usize, usize)> = groups(&self.0).map(|(_, row, c)| (row, c)).collect();
        filled_by_chunks(self.0.len() * d_out, d_out, g.len(), |e, out| {
            let (row, c) = starts[e];
            add_column_sums(&g[row * d_out..(row + c) * d_out], d_out, 0, out);
            Ok(())
        })
    }
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
