//! An MoE layer's expert outputs back in token order, each weighted by its gate:
//!
//! ```text
//!   y[t]            = Σ_{m : tokens[m] = t} gates[slots[m]] · ys[m]     (m in order)
//!   dL/dys[m]       = dL/dy[tokens[m]] · gates[slots[m]]
//!   dL/dgates[s]    = dL/dy[tokens[m]] · ys[m]  over D, for the m with slots[m] = s (0 if none)
//! ```
//!
//! ys (M, D) holds the experts' outputs on their kept assignments, grouped by expert; gates
//! (N, k) every token's gate per choice; `tokens[m]` the token of assignment m, and `slots[m] =
//! t·k + j` the gate it uses. An assignment dropped by the capacity has no row, so its gate gets
//! no gradient, and a token with no kept assignment gets a zero row.
//!
//! Why one op: from candle's primitives this is a gather of the gates, a broadcast multiply
//! over (M, D) and an index-add into a zero-filled (N, D) (the index ops on one thread while
//! the pool waits); backward, a gather of dL/dy, two (M, D) products and a row sum, each graph
//! edge with a zero-filled buffer of its own. Here the forward writes each token's row once,
//! and the backward writes dL/dys and dL/dgates once each, in parallel blocks. y and dL/dys
//! are the primitive path's bits (the same products, added in the same order); dL/dgates sums
//! its D products in `dot_slice`'s fixed lanes instead of candle's order.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::parallel::{filled_by_chunks, filled_by_rows};
use super::real::{float_kernel, Real};

/// y (N, D) = `Σ gates[slots[m]] · ys[m]` into row `tokens[m]`, from ys (M, D) and gates (N, k).
/// One op on the fused CPU path; elsewhere a gather, a broadcast multiply and an index-add.
pub fn combine_rows(ys: &Tensor, gates: &Tensor, tokens: &[u32], slots: &[u32]) -> Result<Tensor> {
    let (m, d) = ys.dims2()?;
    let (n, k) = gates.dims2()?;
    let plan = Arc::new(Plan::new((n, k), tokens, slots)?);
    if plan.tokens.len() != m {
        bail!("combine-rows: {} assignments for {m} rows", tokens.len());
    }
    if !super::use_fused(ys) || super::autocast::is_active() || ys.dtype() != gates.dtype() {
        let dev = ys.device();
        let tokens = Tensor::from_vec(tokens.to_vec(), m, dev)?; // (M,)
        let slots = Tensor::from_vec(slots.to_vec(), m, dev)?; // (M,)
        let g = super::gather_rows(&gates.reshape(((), 1))?, &slots)?; // (M, 1)
        let zeros = Tensor::zeros((n, d), ys.dtype(), dev)?;
        return super::add_rows(&zeros, &tokens, &ys.broadcast_mul(&g)?); // (N, D)
    }
    ys.contiguous()?
        .apply_op2(&gates.contiguous()?, Combine(plan)) // (N, D)
}

/// The routing the op follows, with its two inverses.
#[derive(Debug)]
struct Plan {
    /// (N, k): tokens and choices per token.
    gates: (usize, usize),
    /// The token of each assignment (M).
    tokens: Vec<u32>,
    /// The gate of each assignment (M), t·k + j.
    slots: Vec<u32>,
    /// Each token's assignments in order: rows[starts[t]..starts[t + 1]].
    starts: Vec<usize>,
    rows: Vec<u32>,
    /// The assignment of each gate (N·k), or None when it was dropped.
    slot_row: Vec<Option<u32>>,
}

impl Plan {
    fn new((n, k): (usize, usize), tokens: &[u32], slots: &[u32]) -> Result<Self> {
        if tokens.len() != slots.len() {
            bail!(
                "combine-rows: {} tokens for {} gate slots",
                tokens.len(),
                slots.len()
            );
        }
        let mut slot_row = vec![None; n * k];
        let mut per_token = vec![0usize; n];
        for (m, (&t, &s)) in tokens.iter().zip(slots).enumerate() {
            let (t, s) = (t as usize, s as usize);
            if t >= n || s >= n * k || s / k != t {
                bail!("combine-rows: assignment {m} is token {t} with gate {s}, for {n} tokens of {k} gates each");
            }
            if slot_row[s].replace(m as u32).is_some() {
                bail!("combine-rows: gate {s} is used by two assignments");
            }
            per_token[t] += 1;
        }
        let mut starts = Vec::with_capacity(n + 1);
        starts.push(0);
        for c in &per_token {
            starts.push(starts[starts.len() - 1] + c);
        }
        let mut next = starts[..n].to_vec();
        let mut rows = vec![0u32; tokens.len()];
        for (m, &t) in tokens.iter().enumerate() {
            rows[next[t as usize]] = m as u32;
            next[t as usize] += 1;
        }
        Ok(Plan {
            gates: (n, k),
            tokens: tokens.to_vec(),
            slots: slots.to_vec(),
            starts,
            rows,
            slot_row,
        })
    }

    /// The width D of an operand with a row per assignment (M, D).
    fn per_row(&self, op: &str, l: &Layout) -> Result<usize> {
        let (m, d) = l.shape().dims2()?;
        if m != self.tokens.len() {
            bail!("{op}: {:?} for {} assignments", l.dims(), self.tokens.len());
        }
        Ok(d)
    }

    /// The width of an operand with a row per token (N, ·), which must be `width` if given.
    fn per_token(&self, op: &str, l: &Layout, width: Option<usize>) -> Result<usize> {
        let (n, w) = l.shape().dims2()?;
        if n != self.gates.0 || width.is_some_and(|want| want != w) {
            bail!("{op}: {:?} for {} tokens", l.dims(), self.gates.0);
        }
        Ok(w)
    }
}

/// The op on (ys, gates).
#[derive(Debug, Clone)]
struct Combine(Arc<Plan>);

impl Combine {
    fn forward<T: Real>(&self, ys: &[T], gates: &[T], d: usize) -> Result<Vec<T>> {
        let p = &self.0;
        filled_by_rows(p.gates.0 * d, d, |t, row| {
            for &m in &p.rows[p.starts[t]..p.starts[t + 1]] {
                let m = m as usize;
                let g = gates[p.slots[m] as usize];
                for (o, &v) in row.iter_mut().zip(&ys[m * d..(m + 1) * d]) {
                    *o += v * g;
                }
            }
        })
    }
}

impl CustomOp2 for Combine {
    fn name(&self) -> &'static str {
        "combine-rows"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let name = self.name();
        let d = self.0.per_row(name, l1)?; // ys (M, D)
        self.0.per_token(name, l2, Some(self.0.gates.1))?; // gates (N, k)
        let out =
            float_kernel!(name; ys = (s1, l1), gates = (s2, l2) => self.forward(ys, gates, d)?);
        Ok((out, Shape::from((self.0.gates.0, d))))
    }

    fn bwd(
        &self,
        ys: &Tensor,
        gates: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = grad.contiguous()?; // (N, D)
        let dys = dy.apply_op2_no_bwd(gates, &RowGrads(self.0.clone()))?; // (M, D)
        let dgates = dy.apply_op2_no_bwd(ys, &GateGrads(self.0.clone()))?; // (N, k)
        Ok((Some(dys), Some(dgates)))
    }
}

/// (dL/dy (N, D), gates) → dL/dys (M, D).
struct RowGrads(Arc<Plan>);

impl CustomOp2 for RowGrads {
    fn name(&self) -> &'static str {
        "combine-rows-grad-rows"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (p, name) = (&self.0, self.name());
        let d = p.per_token(name, l1, None)?; // dL/dy (N, D)
        p.per_token(name, l2, Some(p.gates.1))?; // gates (N, k)
        let m = p.tokens.len();
        let out = float_kernel!(name; dy = (s1, l1), gates = (s2, l2) => filled_by_rows(m * d, d, |i, row| {
            let (t, g) = (p.tokens[i] as usize, gates[p.slots[i] as usize]);
            for (o, &v) in row.iter_mut().zip(&dy[t * d..(t + 1) * d]) {
                *o = v * g;
            }
        })?);
        Ok((out, Shape::from((m, d))))
    }
}

/// (dL/dy (N, D), ys (M, D)) → dL/dgates (N, k).
struct GateGrads(Arc<Plan>);

/// Gates per parallel block of `GateGrads`.
const GATE_BLOCK: usize = 256;

impl CustomOp2 for GateGrads {
    fn name(&self) -> &'static str {
        "combine-rows-grad-gates"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (p, name) = (&self.0, self.name());
        let d = p.per_row(name, l2)?; // ys (M, D)
        p.per_token(name, l1, Some(d))?; // dL/dy (N, D)
        let (n, k) = p.gates;
        let work = p.tokens.len() * d;
        let out = float_kernel!(name; dy = (s1, l1), ys = (s2, l2) => filled_by_chunks(n * k, GATE_BLOCK, work, |b, chunk| {
            for (i, o) in chunk.iter_mut().enumerate() {
                let s = b * GATE_BLOCK + i;
                if let Some(m) = p.slot_row[s] {
                    let (m, t) = (m as usize, s / k);
                    *o = Real::dot_slice(&dy[t * d..(t + 1) * d], &ys[m * d..(m + 1) * d]);
                }
            }
            Ok(())
        })?);
        Ok((out, Shape::from((n, k))))
    }
}
