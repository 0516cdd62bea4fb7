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
//! candle's custom ops take at most three tensors, and each graph edge costs a zero-filled
//! gradient buffer and an add, so the op is two nodes: `Link` on (W_proj, b_fc, b_proj), which
//! computes nothing and returns one value, and `GeluMlp` on (x, W_fc, that value), which holds
//! the three tensors and reads them itself. Its backward leaves their gradients for `Link`'s.
//! The experts' tensors are concatenated along their first dim (W_fc (E·F, D), b_fc (E·F),
//! W_proj (E·O, F), b_proj (E·O)); a dense MLP's are used as they are.

use std::sync::{Arc, Mutex};

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Storage, Tensor,
};

use super::gemm::{gemm_bias_into, View};
use super::grouped::{bias_grads_into, groups, weight_grads_into};
use super::linear::{as_rows, with_last};
use super::parallel::{for_each_block, SharedMut};
use super::products::row_blocks;
use super::real::{float_kernel, Real, Stash};

/// One MLP's tensors: W_fc (F, D), b_fc (F), W_proj (O, F), b_proj (O).
pub type MlpWeights<'a> = [&'a Tensor; 4];

/// x (.., D) through a GELU MLP → (.., O): with one expert, every row through it; with E
/// experts, x (M, D) with its rows grouped by `counts` (E groups summing to M). One op on the
/// fused CPU path; elsewhere `linear_gelu` then `linear` (one expert), or two `grouped_linear`
/// ops on the stacked weights.
pub fn gelu_mlp(x: &Tensor, experts: &[MlpWeights], counts: &[usize]) -> Result<Tensor> {
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
    if !super::use_fused(x) || super::autocast::is_active() {
        return unfused(x, experts, counts);
    }
    // Each kind of tensor of every expert, concatenated along the first dim.
    let joined = |i: usize| -> Result<Tensor> {
        match experts {
            [one] => one[i].contiguous(),
            _ => Tensor::cat(&experts.iter().map(|e| e[i]).collect::<Vec<_>>(), 0),
        }
    };
    let (w_fc, b_fc, w_proj, b_proj) = (joined(0)?, joined(1)?, joined(2)?, joined(3)?);
    let grads = Arc::new(Mutex::new(None));
    let link = w_proj.apply_op3(&b_fc, &b_proj, Link(grads.clone()))?; // (1,)
    let op = GeluMlp {
        counts: counts.to_vec(),
        widths: [d, f, o],
        held: [b_fc, w_proj, b_proj],
        grads,
        pre: Stash::default(),
        h: Stash::default(),
    };
    x.contiguous()?.apply_op3(&w_fc, &link, op) // (.., O)
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

/// Values per piece of the element-wise passes inside a block of rows (64 KiB of f32), so each
/// piece is zeroed or copied and then written while it is in the core's L1/L2.
const PIECE: usize = 16 * 1024;

/// The sizes of a call: rows, and the input, hidden and output widths.
#[derive(Clone, Copy)]
struct Sizes {
    m: usize,
    d: usize,
    f: usize,
    o: usize,
}

/// The gradients of (W_proj, b_fc, b_proj) that `GeluMlp`'s backward leaves for `Link`'s.
type Held = Arc<Mutex<Option<[Tensor; 3]>>>;

/// The MLP (or the experts' MLPs) as one op on (x, W_fc, `Link`'s value).
#[derive(Clone)]
struct GeluMlp {
    counts: Vec<usize>,
    /// (D, F, O): the input, hidden and output widths.
    widths: [usize; 3],
    /// b_fc (E·F), W_proj (E·O, F), b_proj (E·O): the inputs of `Link`, read here.
    held: [Tensor; 3],
    /// Their gradients, from the backward, for `Link`'s backward.
    grads: Held,
    /// The pre-activations x·W_fcᵀ + b_fc (M, F), for the GELU's derivative.
    pre: Stash,
    /// The hidden activations gelu(pre) (M, F), for dW_proj.
    h: Stash,
}

/// The values of a contiguous CPU tensor in `T`, for `f`.
fn with_values<T: Real, R>(t: &Tensor, f: impl FnOnce(&[T]) -> Result<R>) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => f(super::real::slice(
            T::cpu_storage_as_slice(cpu)?,
            layout,
            "gelu-mlp",
        )?),
        _ => bail!("gelu-mlp: the fused MLP runs on the CPU only"),
    }
}

impl std::fmt::Debug for GeluMlp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GeluMlp({:?}, widths {:?})", self.counts, self.widths)
    }
}

impl GeluMlp {
    /// The sizes of x and W_fc, checked against the widths and the groups (the held tensors
    /// were checked when the op was made).
    fn sizes(&self, x: &Layout, w_fc: &Layout) -> Result<Sizes> {
        let (m, d) = as_rows(x)?;
        let [wd, f, o] = self.widths;
        let e = self.counts.len();
        if d != wd || w_fc.dims() != [e * f, d] {
            bail!(
                "gelu-mlp: input {:?} and W_fc {:?} for {e} experts of widths {:?}",
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

    /// y (M, O), keeping pre and h: each block of rows through fc, GELU and proj in turn.
    fn forward<T: Real>(&self, x: &[T], w_fc: &[T], s: Sizes) -> Result<Vec<T>> {
        let [b_fc, w_proj, b_proj] = &self.held;
        with_values(b_fc, |b_fc| {
            with_values(w_proj, |w_proj| {
                with_values(b_proj, |b_proj| {
                    self.run(x, [w_fc, b_fc, w_proj, b_proj], s)
                })
            })
        })
    }

    fn run<T: Real>(
        &self,
        x: &[T],
        [w_fc, b_fc, w_proj, b_proj]: [&[T]; 4],
        s: Sizes,
    ) -> Result<Vec<T>> {
        let Sizes { m, d, f, o } = s;
        let mut pre = Vec::<T>::with_capacity(m * f);
        let mut h = Vec::<T>::with_capacity(m * f);
        let mut y = Vec::<T>::with_capacity(m * o);
        let (pre_p, h_p, y_p) = (
            SharedMut(pre.as_mut_ptr()),
            SharedMut(h.as_mut_ptr()),
            SharedMut(y.as_mut_ptr()),
        );
        let (blocks, work) = self.blocks(f * (d + o));
        for_each_block(blocks.len(), work, |i| {
            let (ex, r0, r1) = blocks[i];
            let rows = r1 - r0;
            let w_fc_t = View::rows(ex * f * d, d).transposed(); // W_fcᵀ (D, F)
            let b = &b_fc[ex * f..(ex + 1) * f];
            rows_product((r0, r1), (pre_p, m, f), (x, r0, d), (w_fc, w_fc_t), Some(b))?;
            // SAFETY: rows r0..r1 of pre and h belong to this block alone, pre's were written
            // just above, and h's are written (after zeroing, piece by piece) before being read.
            let h_rows = unsafe {
                let pre_rows = std::slice::from_raw_parts(pre_p.ptr().add(r0 * f), rows * f);
                let h_rows = h_p.ptr().add(r0 * f);
                for (k, piece) in pre_rows.chunks(PIECE).enumerate() {
                    let dst = h_rows.add(k * PIECE);
                    std::ptr::write_bytes(dst, 0, piece.len());
                    T::gelu_slice(piece, std::slice::from_raw_parts_mut(dst, piece.len()));
                }
                std::slice::from_raw_parts(h_rows, rows * f)
            };
            let w_proj_t = View::rows(ex * o * f, f).transposed(); // W_projᵀ (F, O)
            let b = &b_proj[ex * o..(ex + 1) * o];
            rows_product(
                (r0, r1),
                (y_p, m, o),
                (h_rows, 0, f),
                (w_proj, w_proj_t),
                Some(b),
            )
        })?;
        // SAFETY: the blocks cover every group's rows, and each wrote all of its rows of the
        // three buffers.
        unsafe {
            pre.set_len(m * f);
            h.set_len(m * f);
            y.set_len(m * o);
        }
        self.pre.keep(pre);
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
        let fc = x.apply_op1_no_bwd(&FcGrads(back.clone()))?; // [dW_fc | db_fc]
        let proj = g.apply_op1_no_bwd(&ProjGrads(back))?; // [dW_proj | db_proj]
        let dw_fc = fc.narrow(0, 0, e * f * d)?.reshape((e * f, d))?;
        let db_fc = fc.narrow(0, e * f * d, e * f)?;
        let dw_proj = proj.narrow(0, 0, e * o * f)?.reshape((e * o, f))?;
        let db_proj = proj.narrow(0, e * o * f, e * o)?;
        let mut held = self.grads.lock().unwrap_or_else(|p| p.into_inner());
        *held = Some([dw_proj, db_fc, db_proj]);
        Ok((Some(dx), Some(dw_fc), Some(link.zeros_like()?)))
    }
}

/// The graph node of (W_proj, b_fc, b_proj): one value that `GeluMlp` takes as its third input,
/// so candle's backward reaches these tensors, with the gradients that `GeluMlp`'s backward
/// left.
struct Link(Held);

impl CustomOp3 for Link {
    fn name(&self) -> &'static str {
        "gelu-mlp-link"
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
        let name = self.name();
        let out = float_kernel!(name; _w = (s1, l1), _b1 = (s2, l2), _b2 = (s3, l3) => vec![Default::default()]);
        Ok((out, Shape::from(1)))
    }

    fn bwd(
        &self,
        _w_proj: &Tensor,
        _b_fc: &Tensor,
        _b_proj: &Tensor,
        _res: &Tensor,
        _grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some([dw_proj, db_fc, db_proj]) = held.take() else {
            bail!("gelu-mlp: the parameters' backward ran before the MLP's");
        };
        Ok((Some(dw_proj), Some(db_fc), Some(db_proj)))
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
    /// gelu'(pre) and dx = dpre·W_fc in turn; keeps dpre.
    fn input<T: Real>(&self, g: &[T], w_fc: &[T], s: Sizes) -> Result<Vec<T>> {
        with_values(&self.mlp.held[1], |w_proj| {
            self.input_with(g, w_fc, w_proj, s)
        })
    }

    fn input_with<T: Real>(&self, g: &[T], w_fc: &[T], w_proj: &[T], s: Sizes) -> Result<Vec<T>> {
        let Sizes { m, d, f, o } = s;
        let mut dpre = Vec::<T>::with_capacity(m * f);
        let mut dx = Vec::<T>::with_capacity(m * d);
        let (dpre_p, dx_p) = (SharedMut(dpre.as_mut_ptr()), SharedMut(dx.as_mut_ptr()));
        let (blocks, work) = self.mlp.blocks(f * (o + d));
        self.mlp.pre.with(self.name(), |pre: &[T]| {
            if pre.len() != m * f {
                bail!(
                    "gelu-mlp: backward for {m} rows after a forward of {}",
                    pre.len() / f
                );
            }
            for_each_block(blocks.len(), work, |i| {
                let (ex, r0, r1) = blocks[i];
                let rows = r1 - r0;
                let w_proj_v = View::rows(ex * o * f, f); // W_proj (O, F)
                rows_product(
                    (r0, r1),
                    (dpre_p, m, f),
                    (g, r0, o),
                    (w_proj, w_proj_v),
                    None,
                )?;
                // dpre ← dh ⊙ gelu'(pre), piece by piece through a copy of dh.
                let mut dh = vec![T::zero(); PIECE.min(rows * f)];
                for start in (r0 * f..r1 * f).step_by(PIECE) {
                    let n = PIECE.min(r1 * f - start);
                    // SAFETY: rows r0..r1 of dpre belong to this block, and the GEMM above
                    // wrote them.
                    let out = unsafe { std::slice::from_raw_parts_mut(dpre_p.ptr().add(start), n) };
                    dh[..n].copy_from_slice(out);
                    T::gelu_backward_slice(&pre[start..start + n], &dh[..n], out);
                }
                // SAFETY: as above; the loop wrote every value of these rows.
                let dpre_rows =
                    unsafe { std::slice::from_raw_parts(dpre_p.ptr().add(r0 * f), rows * f) };
                let w_fc_v = View::rows(ex * f * d, d); // W_fc (F, D)
                rows_product(
                    (r0, r1),
                    (dx_p, m, d),
                    (dpre_rows, 0, f),
                    (w_fc, w_fc_v),
                    None,
                )
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
