//! A GELU MLP as one op: y = gelu(x·W_fcᵀ + b_fc)·W_projᵀ + b_proj, for a dense block's MLP
//! (one group of rows) or every expert of an MoE layer, each on its own group of rows (the
//! first `counts[0]` rows go to expert 0, the next `counts[1]` to expert 1, ..., as `grouped`).
//!
//! Why one op: as two (`linear_gelu`, then `linear`), the hidden activation h (.., d_ff), the
//! widest tensor of a block, is an edge of candle's graph, and candle's backward zero-fills a
//! gradient buffer of its size and adds dL/dh into it (with top-2 routing, twice the tokens);
//! the GELU derivative was one more pass over (.., d_ff) values into one more zero-filled
//! buffer, and each piece ran in a parallel section of its own. Here each block of rows runs
//! the fc GEMM, the GELU on the values just written and the proj GEMM; the backward runs dL/dh,
//! the GELU derivative and dL/dx the same way, and dL/dh never leaves the op. Every value is
//! computed by the same kernels in the same order as by the two ops, so it is the same bits.
//!
//! The forward keeps gelu'(pre), not pre: the GELU and its derivative share an exp and a
//! division per value, so computed side by side the derivative costs a few multiply-adds and a
//! second division, and the backward's dL/dpre is one product in place. Recomputed from pre
//! in the backward (with a copy of dL/dh, and h zero-filled before the GELU wrote it), the
//! two GELU passes and those fills were 7.8 % of a dense step and 9.0 % of an MoE step on a
//! Zen 3; 5.9 % and 6.4 % this way (docs/benchmarks-journal.md).
//!
//! The 4E weights reach the op through a chain of link nodes (`link.rs`): `GeluMlp` is the
//! node on (x, W_fc of expert 0, the last link), reads every expert's tensors itself, and its
//! backward leaves their gradients for the links' backward. The experts' tensors are used as
//! they are: joined into one tensor per kind, they would cost a copy forward, and backward a
//! zero-filled buffer and an add for the joined tensor (an MoE layer of 8 experts: some 20 MB
//! of memory traffic a step for nothing).

use std::sync::{Arc, Mutex};

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Storage, Tensor,
};

use super::gemm::{gemm_bias_into, View};
use super::grouped::{bias_grads_into, groups, weight_grads_into};
use super::linear::{as_rows, with_last};
use super::link::{self, Held};
use super::parallel::{for_each_block, SharedMut};
use super::products::row_blocks;
use super::real::{float_kernel, Real, Stash};
use super::residual::Step;

/// One MLP's tensors: W_fc (F, D), b_fc (F), W_proj (O, F), b_proj (O).
pub type MlpWeights<'a> = [&'a Tensor; 4];

/// x (.., D) through a GELU MLP → (.., O): with one expert, every row through it; with E
/// experts, x (M, D) with its rows grouped by `counts` (E groups summing to M). One op on the
/// fused CPU path; elsewhere `linear_gelu` then `linear` (one expert), or two `grouped_linear`
/// ops on the stacked weights.
pub fn gelu_mlp(x: &Tensor, experts: &[MlpWeights], counts: &[usize]) -> Result<Tensor> {
    let widths = checked_widths(experts, counts)?;
    if !super::use_fused(x) || super::autocast::is_active() {
        return unfused(x, experts, counts);
    }
    let (op, tensors) = GeluMlp::new(experts, counts, widths)?;
    // W_fc of expert 0 is the op's second input, the other 4E − 1 tensors reach the graph
    // through links.
    let chain = link::chain(&tensors, &op.grads, "gelu-mlp-link")?; // (1,)
    x.contiguous()?.apply_op3(&tensors[0], &chain, op) // (.., O)
}

/// A dense GELU MLP on x of `rows` rows as a step of a residual branch (`residual`): the
/// fused op, outside the graph.
pub fn gelu_mlp_step(weights: MlpWeights, rows: usize) -> Result<Box<dyn Step>> {
    let widths = checked_widths(&[weights], &[rows])?;
    let (op, tensors) = GeluMlp::new(&[weights], &[rows], widths)?;
    let no_link = Tensor::zeros(1, tensors[0].dtype(), tensors[0].device())?;
    Ok(Box::new(MlpStep {
        op,
        tensors,
        no_link,
    }))
}

/// (D, F, O) of the experts' tensors, all checked against expert 0's, and one group of rows
/// per expert.
fn checked_widths(experts: &[MlpWeights], counts: &[usize]) -> Result<[usize; 3]> {
    let Some(&[w_fc, _, w_proj, _]) = experts.first() else {
        bail!("gelu-mlp: no experts");
    };
    if counts.len() != experts.len() {
        bail!(
            "gelu-mlp: {} groups of rows for {} experts",
            counts.len(),
            experts.len()
        );
    }
    let (f, d) = w_fc.dims2()?;
    let o = w_proj.dim(0)?;
    for (e, [w_fc, b_fc, w_proj, b_proj]) in experts.iter().enumerate() {
        if w_fc.dims() != [f, d]
            || b_fc.dims() != [f]
            || w_proj.dims() != [o, f]
            || b_proj.dims() != [o]
        {
            bail!(
                "gelu-mlp: expert {e} has W_fc {:?}, b_fc {:?}, W_proj {:?}, b_proj {:?}; expert 0 has W_fc [{f}, {d}] and W_proj [{o}, {f}]",
                w_fc.dims(),
                b_fc.dims(),
                w_proj.dims(),
                b_proj.dims()
            );
        }
    }
    Ok([d, f, o])
}

/// The same MLP from the one-layer ops (the GPU and autocast path).
fn unfused(x: &Tensor, experts: &[MlpWeights], counts: &[usize]) -> Result<Tensor> {
    if let [[w_fc, b_fc, w_proj, b_proj]] = experts {
        let h = super::linear_gelu(x, w_fc, Some(b_fc))?; // (.., F)
        return super::linear(&h, w_proj, Some(b_proj)); // (.., O)
    }
    let stack = |i: usize| Tensor::stack(&experts.iter().map(|e| e[i]).collect::<Vec<_>>(), 0);
    let h = super::grouped_linear(x, &stack(0)?, &stack(1)?, counts, true)?; // (M, F)
    super::grouped_linear(&h, &stack(2)?, &stack(3)?, counts, false) // (M, O)
}

/// Rows r0..r1 of `dst` (M rows of n values) = rows a_row0.. of `a` (rows of k values) · B
/// [+ bias]: one single-threaded GEMM that writes (never reads) those rows.
fn rows_product<T: Real>(
    (r0, r1): (usize, usize),
    (dst, m, n): (SharedMut<T>, usize, usize),
    (a, a_row0, k): (&[T], usize, usize),
    (b, bv): (&[T], View),
    bias: Option<&[T]>,
) -> Result<()> {
    let (av, dv) = (View::rows(a_row0 * k, k), View::rows(r0 * n, n));
    gemm_bias_into(
        (r1 - r0, n, k),
        dst.ptr(),
        m * n,
        dv,
        a,
        av,
        b,
        bv,
        T::one(),
        false,
        bias,
    )
}

/// The sizes of a call: rows, and the input, hidden and output widths.
#[derive(Clone, Copy)]
struct Sizes {
    m: usize,
    d: usize,
    f: usize,
    o: usize,
}

/// The MLP (or the experts' MLPs) as one op on (x, W_fc of expert 0, the last link's value).
#[derive(Clone)]
struct GeluMlp {
    counts: Vec<usize>,
    /// (D, F, O): the input, hidden and output widths.
    widths: [usize; 3],
    /// Every expert's tensors but the first (b_fc (F), W_proj (O, F), b_proj (O) of expert 0,
    /// then W_fc (F, D), b_fc, W_proj, b_proj of expert 1, ...): the links' inputs, read here.
    held: Vec<Tensor>,
    /// The gradients of all 4E tensors, from the backward, for the links' backward.
    grads: Held,
    /// The GELU's derivative at the pre-activations x·W_fcᵀ + b_fc (M, F), computed in the
    /// forward beside the GELU (which shares its exp and division), so that the backward's
    /// dL/dpre is one product instead of the derivative recomputed.
    gelu_grad: Stash,
    /// The hidden activations gelu(pre) (M, F), for dW_proj.
    h: Stash,
}

/// Every expert's four tensors as slices, in `gelu_mlp`'s order.
struct Weights<'a, T>(Vec<&'a [T]>);

impl<'a, T> Weights<'a, T> {
    /// W_fc (F, D) of expert e.
    fn fc(&self, e: usize) -> &'a [T] {
        self.0[4 * e]
    }

    /// b_fc (F) of expert e.
    fn fc_bias(&self, e: usize) -> &'a [T] {
        self.0[4 * e + 1]
    }

    /// W_proj (O, F) of expert e.
    fn proj(&self, e: usize) -> &'a [T] {
        self.0[4 * e + 2]
    }

    /// b_proj (O) of expert e.
    fn proj_bias(&self, e: usize) -> &'a [T] {
        self.0[4 * e + 3]
    }
}

impl std::fmt::Debug for GeluMlp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GeluMlp({:?}, widths {:?})", self.counts, self.widths)
    }
}

impl GeluMlp {
    /// The op, and every expert's four tensors in order (W_fc, b_fc, W_proj, b_proj of expert
    /// 0, then of expert 1, ...), contiguous.
    fn new(
        experts: &[MlpWeights],
        counts: &[usize],
        widths: [usize; 3],
    ) -> Result<(Self, Vec<Tensor>)> {
        let tensors = experts
            .iter()
            .flatten()
            .map(|t| t.contiguous())
            .collect::<Result<Vec<_>>>()?;
        let op = GeluMlp {
            counts: counts.to_vec(),
            widths,
            held: tensors[1..].to_vec(),
            grads: Arc::new(Mutex::new(vec![None; tensors.len()])),
            gelu_grad: Stash::default(),
            h: Stash::default(),
        };
        Ok((op, tensors))
    }

    /// The sizes of x and expert 0's W_fc, checked against the widths and the groups (the
    /// held tensors were checked when the op was made).
    fn sizes(&self, x: &Layout, w_fc: &Layout) -> Result<Sizes> {
        let (m, d) = as_rows(x)?;
        let [wd, f, o] = self.widths;
        if d != wd || w_fc.dims() != [f, d] {
            bail!(
                "gelu-mlp: input {:?} and W_fc {:?} for widths {:?}",
                x.dims(),
                w_fc.dims(),
                self.widths
            );
        }
        if self.counts.iter().sum::<usize>() != m {
            bail!("gelu-mlp: groups of {:?} rows for {m} rows", self.counts);
        }
        Ok(Sizes { m, d, f, o })
    }

    /// Blocks (expert, first row, end row) of the groups' rows for one parallel section
    /// (`row_blocks`, each row costing `per_row` multiply-adds), and their total work.
    fn blocks(&self, per_row: usize) -> (Vec<(usize, usize, usize)>, usize) {
        let groups: Vec<_> = groups(&self.counts).filter(|g| g.2 > 0).collect();
        let dims: Vec<_> = groups.iter().map(|&(_, _, c)| (c, per_row, 1)).collect();
        let threads = candle_core::utils::get_num_threads();
        let (blocks, work) = row_blocks(&dims, threads);
        let blocks = blocks
            .into_iter()
            .map(|(g, r0, r1)| (groups[g].0, groups[g].1 + r0, groups[g].1 + r1))
            .collect();
        (blocks, work)
    }

    /// `f` of every expert's tensors: expert 0's W_fc is `w_fc` (the op's input, which candle
    /// has locked for the call), the rest are read from the held tensors.
    fn with_weights<T: Real, R>(
        &self,
        w_fc: &[T],
        f: impl FnOnce(&Weights<T>) -> Result<R>,
    ) -> Result<R> {
        let locked: Vec<_> = self.held.iter().map(|t| t.storage_and_layout()).collect();
        let mut all = Vec::with_capacity(locked.len() + 1);
        all.push(w_fc);
        for (storage, layout) in &locked {
            match &**storage {
                Storage::Cpu(cpu) => all.push(super::real::slice(
                    T::cpu_storage_as_slice(cpu)?,
                    layout,
                    "gelu-mlp",
                )?),
                _ => bail!("gelu-mlp: the fused MLP runs on the CPU only"),
            }
        }
        f(&Weights(all))
    }

    /// y (M, O), keeping gelu'(pre) and h: each block of rows through fc, GELU and proj in
    /// turn.
    fn forward<T: Real>(&self, x: &[T], w_fc: &[T], s: Sizes) -> Result<Vec<T>> {
        self.with_weights(w_fc, |w| self.run(x, w, s))
    }

    fn run<T: Real>(&self, x: &[T], w: &Weights<T>, s: Sizes) -> Result<Vec<T>> {
        let Sizes { m, d, f, o } = s;
        let mut grad = Vec::<T>::with_capacity(m * f);
        let mut h = Vec::<T>::with_capacity(m * f);
        let mut y = Vec::<T>::with_capacity(m * o);
        let (grad_p, h_p, y_p) = (
            SharedMut(grad.as_mut_ptr()),
            SharedMut(h.as_mut_ptr()),
            SharedMut(y.as_mut_ptr()),
        );
        let (blocks, work) = self.blocks(f * (d + o));
        for_each_block(blocks.len(), work, |i| {
            let (ex, r0, r1) = blocks[i];
            let rows = r1 - r0;
            let w_fc_t = View::rows(0, d).transposed(); // W_fcᵀ (D, F)
            let (w_fc, b) = (w.fc(ex), Some(w.fc_bias(ex)));
            rows_product((r0, r1), (grad_p, m, f), (x, r0, d), (w_fc, w_fc_t), b)?;
            // h ← gelu(pre), and pre ← gelu'(pre) in place for the backward.
            // SAFETY: rows r0..r1 of both buffers belong to this block alone; pre's were
            // written just above, and h's are written (never read) by the GELU.
            let h_rows = unsafe {
                let pre_rows = std::slice::from_raw_parts_mut(grad_p.ptr().add(r0 * f), rows * f);
                let h_rows = h_p.ptr().add(r0 * f);
                let h_out = std::slice::from_raw_parts_mut(h_rows.cast(), rows * f);
                T::gelu_and_grad_slice(pre_rows, h_out);
                std::slice::from_raw_parts(h_rows, rows * f)
            };
            let w_proj_t = View::rows(0, f).transposed(); // W_projᵀ (F, O)
            let (w_proj, b) = (w.proj(ex), Some(w.proj_bias(ex)));
            rows_product((r0, r1), (y_p, m, o), (h_rows, 0, f), (w_proj, w_proj_t), b)
        })?;
        // SAFETY: the blocks cover every group's rows, and each wrote all of its rows of the
        // three buffers.
        unsafe {
            grad.set_len(m * f);
            h.set_len(m * f);
            y.set_len(m * o);
        }
        self.gelu_grad.keep(grad);
        self.h.keep(h);
        Ok(y)
    }
}

impl CustomOp3 for GeluMlp {
    fn name(&self) -> &'static str {
        "gelu-mlp"
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
        let s = self.sizes(l1, l2)?;
        let name = self.name();
        let out = float_kernel!(name; x = (s1, l1), w = (s2, l2), _link = (s3, l3) => self.forward(x, w, s)?);
        Ok((out, with_last(l1.dims(), s.o)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w_fc: &Tensor,
        link: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = grad.contiguous()?; // (.., O)
        let back = Backward {
            mlp: self.clone(),
            dpre: Stash::default(),
        };
        let [d, f, o] = self.widths;
        let e = self.counts.len();
        let dx = g.apply_op2_no_bwd(w_fc, &back)?; // (.., D), keeping dL/dpre
        let fc = x.apply_op1_no_bwd(&FcGrads(back.clone()))?; // [dW_fc .. | db_fc ..]
        let proj = g.apply_op1_no_bwd(&ProjGrads(back))?; // [dW_proj .. | db_proj ..]

        // Each expert's gradients are views of those two buffers, in `gelu_mlp`'s order.
        let mut all = Vec::with_capacity(4 * e);
        for ex in 0..e {
            all.push(Some(fc.narrow(0, ex * f * d, f * d)?.reshape((f, d))?));
            all.push(Some(fc.narrow(0, e * f * d + ex * f, f)?));
            all.push(Some(proj.narrow(0, ex * o * f, o * f)?.reshape((o, f))?));
            all.push(Some(proj.narrow(0, e * o * f + ex * o, o)?));
        }
        let dw_fc = all[0].take();
        *self.grads.lock().unwrap_or_else(|p| p.into_inner()) = all;
        Ok((Some(dx), dw_fc, Some(link.zeros_like()?)))
    }
}

/// `GeluMlp` of one expert as a residual branch's step.
struct MlpStep {
    op: GeluMlp,
    /// W_fc, b_fc, W_proj, b_proj.
    tensors: Vec<Tensor>,
    /// A (1,) stand-in for the link the op takes in a graph.
    no_link: Tensor,
}

impl Step for MlpStep {
    fn tensors(&self) -> Vec<Tensor> {
        self.tensors.clone()
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.apply_op3_no_bwd(&self.tensors[0], &self.no_link, &self.op)
    }

    fn backward(&self, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let (Some(dx), Some(dw_fc), _) = self.op.bwd(x, &self.tensors[0], &self.no_link, y, g)?
        else {
            bail!("gelu-mlp: no gradient for the input or W_fc");
        };
        let mut held = self.op.grads.lock().unwrap_or_else(|p| p.into_inner());
        let mut grads = vec![dw_fc];
        for i in 1..self.tensors.len() {
            match held.get_mut(i).and_then(Option::take) {
                Some(g) => grads.push(g),
                None => bail!("gelu-mlp: no gradient for tensor {i}"),
            }
        }
        Ok((dx, grads))
    }
}

/// The backward of `GeluMlp`. As an op on (g, W_fc): dL/dx, keeping dL/dpre.
#[derive(Clone)]
struct Backward {
    mlp: GeluMlp,
    /// dL/dpre (M, F), for dW_fc and db_fc.
    dpre: Stash,
}

impl Backward {
    /// dx (M, D) from g (M, O): each block of rows through dh = g·W_proj, dpre = dh ⊙
    /// gelu'(pre) (kept by the forward) and dx = dpre·W_fc in turn; keeps dpre.
    fn input<T: Real>(&self, g: &[T], w_fc: &[T], s: Sizes) -> Result<Vec<T>> {
        self.mlp.with_weights(w_fc, |w| self.input_with(g, w, s))
    }

    fn input_with<T: Real>(&self, g: &[T], w: &Weights<T>, s: Sizes) -> Result<Vec<T>> {
        let Sizes { m, d, f, o } = s;
        let mut dpre = Vec::<T>::with_capacity(m * f);
        let mut dx = Vec::<T>::with_capacity(m * d);
        let (dpre_p, dx_p) = (SharedMut(dpre.as_mut_ptr()), SharedMut(dx.as_mut_ptr()));
        let (blocks, work) = self.mlp.blocks(f * (o + d));
        self.mlp.gelu_grad.with(self.name(), |gelu_grad: &[T]| {
            if gelu_grad.len() != m * f {
                bail!(
                    "gelu-mlp: backward for {m} rows after a forward of {}",
                    gelu_grad.len() / f
                );
            }
            for_each_block(blocks.len(), work, |i| {
                let (ex, r0, r1) = blocks[i];
                let rows = r1 - r0;
                let w_proj = (w.proj(ex), View::rows(0, f)); // W_proj (O, F)
                rows_product((r0, r1), (dpre_p, m, f), (g, r0, o), w_proj, None)?;
                // dpre ← dh ⊙ gelu'(pre), in place.
                // SAFETY: rows r0..r1 of dpre belong to this block, and the GEMM above wrote
                // them.
                let dpre_rows =
                    unsafe { std::slice::from_raw_parts_mut(dpre_p.ptr().add(r0 * f), rows * f) };
                T::mul_slice(dpre_rows, &gelu_grad[r0 * f..r1 * f]);
                let dpre_rows = &*dpre_rows;
                let w_fc = (w.fc(ex), View::rows(0, d)); // W_fc (F, D)
                rows_product((r0, r1), (dx_p, m, d), (dpre_rows, 0, f), w_fc, None)
            })
        })?;
        // SAFETY: the blocks cover every group's rows, each wrote all of its rows of both.
        unsafe {
            dpre.set_len(m * f);
            dx.set_len(m * d);
        }
        self.dpre.keep(dpre);
        Ok(dx)
    }

    /// The gradient of a layer's flat parameters, [dW_e = g_eᵀ·a_e (out, in) of every
    /// expert, then db_e = Σ rows of g_e of every expert], from g (M, out) and its input a
    /// (M, in).
    fn params<T: Real>(&self, g: &[T], a: &[T], (d_in, d_out): (usize, usize)) -> Result<Vec<T>> {
        let counts = &self.mlp.counts;
        let w_len = counts.len() * d_out * d_in;
        let len = w_len + counts.len() * d_out;
        let mut out = Vec::<T>::with_capacity(len);
        let dst = SharedMut(out.as_mut_ptr());
        weight_grads_into(counts, g, a, (d_in, d_out), (dst, w_len))?;
        // SAFETY: the biases' region follows the weights' inside `out`'s capacity.
        let bias_dst = SharedMut(unsafe { dst.ptr().add(w_len) });
        bias_grads_into(counts, g, d_out, (bias_dst, len - w_len))?;
        // SAFETY: both calls wrote all of their regions, which together are 0..len.
        unsafe { out.set_len(len) };
        Ok(out)
    }
}

impl CustomOp2 for Backward {
    fn name(&self) -> &'static str {
        "gelu-mlp-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let [d, _, o] = self.mlp.widths;
        let (m, g_o) = as_rows(l1)?;
        if g_o != o {
            bail!("gelu-mlp: gradient {:?} for {o} outputs", l1.dims());
        }
        let s = self.mlp.sizes(&Layout::contiguous((m, d)), l2)?;
        let name = self.name();
        let out = float_kernel!(name; g = (s1, l1), w = (s2, l2) => self.input(g, w, s)?);
        Ok((out, with_last(l1.dims(), d)))
    }
}

/// x (M, D) → [dW_fc | db_fc] flat, from the dpre its `Backward` kept.
struct FcGrads(Backward);

impl CustomOp1 for FcGrads {
    fn name(&self) -> &'static str {
        "gelu-mlp-fc-grads"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let [d, f, _] = self.0.mlp.widths;
        let name = self.name();
        let out = float_kernel!(name; x = (s, l) => self.0.dpre.with(name, |dpre| self.0.params(dpre, x, (d, f)))?);
        Ok((out, Shape::from(self.0.mlp.counts.len() * (f * d + f))))
    }
}

/// g (M, O) → [dW_proj | db_proj] flat, with h from the forward.
struct ProjGrads(Backward);

impl CustomOp1 for ProjGrads {
    fn name(&self) -> &'static str {
        "gelu-mlp-proj-grads"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let [_, f, o] = self.0.mlp.widths;
        let name = self.name();
        let out = float_kernel!(name; g = (s, l) => self.0.mlp.h.with(name, |h| self.0.params(g, h, (f, o)))?);
        Ok((out, Shape::from(self.0.mlp.counts.len() * (o * f + o))))
    }
}
