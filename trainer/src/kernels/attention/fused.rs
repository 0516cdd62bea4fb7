//! Fused causal self-attention on CPU: from the packed `c_attn` output (B, T, 3·D) straight to
//! the head-merged result (B, T, D), forward and backward each in one op.
//!
//! Built from candle primitives, attention is a permute copy of q/k/v, three `narrow`s (whose
//! backward pads each gradient back to the full 3·D width), a transposed copy of k, two batched
//! matmuls and the softmax over (B·H, T, T) scores, and a transpose copy of the result; every
//! edge of that graph costs a zeroed gradient buffer and an add in candle's backward. Here each
//! (batch, head) pair runs its GEMMs on strided views of the packed buffer, the heads are split
//! across candle's thread pool, and the softmax probabilities are kept for the backward. Each
//! head's GEMMs run in causal blocks of rows that skip the masked keys (`causal_blocks`).
//! Rotary positions, when configured, are applied to q and k inside the op.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

use crate::kernels::gemm::{gemm_into, View};
use crate::kernels::parallel::{for_each_block, SharedMut};
use crate::kernels::real::{float_kernel, Real, Stash};

/// cos/sin tables of rotary positions, (max_T, head_dim/2) each, row-major.
#[derive(Debug)]
pub struct RopeTables {
    pub cos: Vec<f64>,
    pub sin: Vec<f64>,
    pub half: usize,
}

/// softmax(q·kᵀ·scale + causal mask)·v for every head; see the module docs.
#[derive(Clone)]
pub(super) struct FusedAttention {
    n_heads: usize,
    scale: f64,
    rope: Option<Arc<RopeTables>>,
    /// Probabilities (B·H, T, T) of this op's forward, for its backward.
    probs: Stash,
}

/// Shapes of one call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    b: usize,
    t: usize,
    h: usize,
    hd: usize,
}

impl Dims {
    fn d(&self) -> usize {
        self.h * self.hd
    }
    /// Offset of head `h`'s q in batch `b` of the packed (B, T, 3·D) buffer.
    fn q_off(&self, b: usize, h: usize) -> usize {
        b * self.t * 3 * self.d() + h * self.hd
    }
}

/// Copies head `(b, h)` of q or k (`col` = 0 or D) into a contiguous (T, hd) buffer, rotated
/// by the rotary tables when given.
fn gather_rotated<T: Real>(
    qkv: &[T],
    dims: Dims,
    b: usize,
    h: usize,
    col: usize,
    rope: &RopeTables,
    out: &mut [T],
) {
    let (t, hd, half) = (dims.t, dims.hd, rope.half);
    let base = dims.q_off(b, h) + col;
    for pos in 0..t {
        let x = &qkv[base + pos * 3 * dims.d()..][..hd];
        let o = &mut out[pos * hd..(pos + 1) * hd];
        for i in 0..half {
            let (c, s) = (
                T::from_f64(rope.cos[pos * half + i]),
                T::from_f64(rope.sin[pos * half + i]),
            );
            o[i] = x[i] * c - x[i + half] * s;
            o[i + half] = x[i + half] * c + x[i] * s;
        }
    }
}

/// Writes the gradient of a rotated (T, hd) head back through the rotation into `dqkv`.
fn scatter_unrotated<T: Real>(
    g: &[T],
    dims: Dims,
    b: usize,
    h: usize,
    col: usize,
    rope: &RopeTables,
    dqkv: SharedMut<T>,
) {
    let (t, hd, half) = (dims.t, dims.hd, rope.half);
    let base = dims.q_off(b, h) + col;
    for pos in 0..t {
        let gr = &g[pos * hd..(pos + 1) * hd];
        for i in 0..half {
            let (c, s) = (
                T::from_f64(rope.cos[pos * half + i]),
                T::from_f64(rope.sin[pos * half + i]),
            );
            // SAFETY: inside this pair's own q or k columns of the (B, T, 3·D) buffer.
            unsafe {
                let d = dqkv.ptr().add(base + pos * 3 * dims.d());
                *d.add(i) = gr[i] * c + gr[i + half] * s;
                *d.add(i + half) = gr[i + half] * c - gr[i] * s;
            }
        }
    }
}

/// Rows of the causal blocks: attention of rows i0..i1 needs keys 0..i1 only, so each block
/// of rows runs its GEMMs on that many columns (or k), skipping the masked part: 75 % of the
/// full products' work at T = 128, about half at long T. Blocks of 64 rows: of 32, 48 and 64,
/// 64 was fastest at the benchmark's T = 128 (each block packs its operands again). P's masked
/// entries are exact zeros, so the skipped terms only ever added zero: the values are the full
/// products' bits.
fn causal_blocks(t: usize) -> impl Iterator<Item = (usize, usize)> {
    const ROWS: usize = 64;
    (0..t).step_by(ROWS).map(move |i0| (i0, t.min(i0 + ROWS)))
}

/// dst (T, T) ← scale · a·bᵀ below and on the diagonal, 0 above it: for each causal block of
/// rows, one GEMM against the block's first i1 columns (a and b are (T, k) views), then each
/// row's masked columns set to 0, so every value is written once and the whole matrix is
/// initialised (the scores before the softmax, dP before dS).
fn causal_product<T: Real>(
    dst: *mut T,
    t: usize,
    k: usize,
    (a, av): (&[T], View),
    (b, bv): (&[T], View),
    scale: T,
) -> Result<()> {
    for (i0, i1) in causal_blocks(t) {
        gemm_into(
            (i1 - i0, i1, k),
            dst,
            t * t,
            View::rows(i0 * t, t),
            a,
            av.skip_rows(i0),
            b,
            bv.transposed(),
            scale,
            false,
        )?;
        for i in i0..i1 {
            // SAFETY: row i's columns i+1..t lie inside the T × T buffer (`gemm_into` checked
            // the block's bounds against t · t), and the caller's block is this caller's alone.
            unsafe { std::ptr::write_bytes(dst.add(i * t + i + 1), 0, t - i - 1) };
        }
    }
    Ok(())
}

/// q and k of head (b, h), each as (data, view of a (T, hd) matrix): views into the packed
/// buffer, or with rotary tables, the rotated copies made in `rotated`.
fn q_and_k<'a, T: Real>(
    rope: Option<&RopeTables>,
    qkv: &'a [T],
    dims: Dims,
    (b, h): (usize, usize),
    rotated: &'a mut (Vec<T>, Vec<T>),
) -> [(&'a [T], View); 2] {
    let (q_off, d) = (dims.q_off(b, h), dims.d());
    match rope {
        None => [
            (qkv, View::rows(q_off, 3 * d)),
            (qkv, View::rows(q_off + d, 3 * d)),
        ],
        Some(rope) => {
            let (q, k) = rotated;
            *q = vec![T::zero(); dims.t * dims.hd];
            *k = vec![T::zero(); dims.t * dims.hd];
            gather_rotated(qkv, dims, b, h, 0, rope, q);
            gather_rotated(qkv, dims, b, h, d, rope, k);
            let hv = View::rows(0, dims.hd);
            [(&q[..], hv), (&k[..], hv)]
        }
    }
}

/// Softmax of each row `i` of a (T, T) score matrix over columns `0..=i`; the rest are left
/// as they are (0, from `causal_product`).
fn causal_softmax_inplace<T: Real>(s: &mut [T], t: usize) {
    for (i, row) in s.chunks_mut(t).enumerate() {
        T::softmax_slice(&mut row[..=i]);
    }
}

impl FusedAttention {
    pub(super) fn new(n_heads: usize, scale: f64, rope: Option<Arc<RopeTables>>) -> Self {
        FusedAttention {
            n_heads,
            scale,
            rope,
            probs: Stash::default(),
        }
    }

    pub(super) fn dims(&self, layout: &Layout) -> Result<Dims> {
        let (b, t, d3) = layout.shape().dims3()?;
        if d3 == 0 || d3 % (3 * self.n_heads) != 0 {
            // (Heads of width 0 would leave the outputs, which are not zeroed, unwritten.)
            bail!("fused-attention: last dim {d3} is not 3·n_heads·head_dim, head_dim ≥ 1");
        }
        let hd = d3 / 3 / self.n_heads;
        if let Some(rope) = &self.rope {
            if rope.half * 2 != hd || rope.cos.len() < t * rope.half {
                bail!("fused-attention: rotary tables do not cover T={t}, head_dim={hd}");
            }
        }
        Ok(Dims {
            b,
            t,
            h: self.n_heads,
            hd,
        })
    }

    pub(super) fn forward<T: Real>(&self, qkv: &[T], dims: Dims) -> Result<Vec<T>> {
        let Dims { b, t, h, hd } = dims;
        let d = dims.d();
        // Not zeroed: each (batch, head) pair overwrites all of its probabilities and its
        // output columns through raw pointers (the GEMMs do not accumulate), before `set_len`
        // below; zeroing them first was one more pass over both (5 MB a layer at the
        // benchmark's shape).
        let (y_len, p_len) = (b * t * d, b * h * t * t);
        let mut y = Vec::<T>::with_capacity(y_len);
        let mut probs = Vec::<T>::with_capacity(p_len);
        let (y_ptr, p_ptr) = (SharedMut(y.as_mut_ptr()), SharedMut(probs.as_mut_ptr()));
        let scale = T::from_f64(self.scale);
        for_each_block(b * h, b * h * t * t * hd, |pair| {
            let (bi, hi) = (pair / h, pair % h);
            let q_off = dims.q_off(bi, hi);
            // SAFETY: this pair's (T, T) block lies inside the probabilities' capacity, and
            // only this pair writes it.
            let scores_dst = unsafe { p_ptr.ptr().add(pair * t * t) };
            // The scores of rows i0..i1 against keys 0..i1 only: the rest are masked.
            let mut rotated = (Vec::new(), Vec::new());
            let [qs, ks] = q_and_k(self.rope.as_deref(), qkv, dims, (bi, hi), &mut rotated);
            causal_product(scores_dst, t, hd, qs, ks, scale)?;
            // SAFETY: `causal_product` wrote every value of the block.
            let p = unsafe { std::slice::from_raw_parts_mut(scores_dst, t * t) };
            causal_softmax_inplace(p, t);
            // Rows i0..i1 of P·V: P is 0 past column i1, so only the first i1 rows of V count.
            let y_view = View::rows(bi * t * d + hi * hd, d);
            for (i0, i1) in causal_blocks(t) {
                gemm_into(
                    (i1 - i0, hd, i1),
                    y_ptr.ptr(),
                    y_len,
                    y_view.skip_rows(i0),
                    p,
                    View::rows(i0 * t, t),
                    qkv,
                    View::rows(q_off + 2 * d, 3 * d),
                    T::one(),
                    false,
                )?;
            }
            Ok(())
        })?;
        // SAFETY: the pairs cover every (batch, head), so every value of both was written.
        unsafe {
            y.set_len(y_len);
            probs.set_len(p_len);
        }
        self.probs.keep(probs);
        Ok(y)
    }
}

impl std::fmt::Debug for FusedAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusedAttention")
            .field("n_heads", &self.n_heads)
            .field("scale", &self.scale)
            .field("rope", &self.rope.is_some())
            .finish()
    }
}

impl CustomOp1 for FusedAttention {
    fn name(&self) -> &'static str {
        "fused-attention"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = self.dims(layout)?;
        let out = float_kernel!(self.name(); v = (storage, layout) => self.forward(v, dims)?);
        Ok((out, Shape::from((dims.b, dims.t, dims.d()))))
    }

    fn bwd(&self, qkv: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let g = grad_res.contiguous()?;
        let backward = AttentionBackward { fwd: self.clone() };
        Ok(Some(qkv.apply_op2_no_bwd(&g, &backward)?))
    }
}

/// The backward of `FusedAttention`: (qkv, dy) → dqkv, using the forward's probabilities.
pub(super) struct AttentionBackward {
    pub(super) fwd: FusedAttention,
}

impl AttentionBackward {
    pub(super) fn backward<T: Real>(&self, qkv: &[T], dy: &[T], dims: Dims) -> Result<Vec<T>> {
        let probs = &self.fwd.probs;
        probs.with("fused-attention", |probs: &[T]| {
            self.backward_from(qkv, dy, probs, dims)
        })
    }

    /// dqkv from qkv, dy and the forward's probabilities.
    fn backward_from<T: Real>(
        &self,
        qkv: &[T],
        dy: &[T],
        probs: &[T],
        dims: Dims,
    ) -> Result<Vec<T>> {
        let Dims { b, t, h, hd } = dims;
        let d = dims.d();
        if probs.len() != b * h * t * t {
            bail!("fused-attention: probabilities do not match the gradient's shape");
        }
        // Not zeroed: each pair overwrites its q, k and v columns (below), before `set_len`.
        let len = qkv.len();
        let mut dqkv = Vec::<T>::with_capacity(len);
        let out = SharedMut(dqkv.as_mut_ptr());
        let scale = T::from_f64(self.fwd.scale);
        for_each_block(b * h, b * h * t * t * hd, |pair| {
            let (bi, hi) = (pair / h, pair % h);
            let q_off = dims.q_off(bi, hi);
            let p = &probs[pair * t * t..(pair + 1) * t * t];
            let dy_view = View::rows(bi * t * d + hi * hd, d);
            let v_view = View::rows(q_off + 2 * d, 3 * d);
            // Pᵀ and dSᵀ, as views of the (T, T) row-major P and dS.
            let tr = View::rows(0, t).transposed();
            // dV = Pᵀ·dY, straight into dqkv's v columns: row j sums over rows i ≥ j of P.
            for (j0, j1) in causal_blocks(t) {
                gemm_into(
                    (j1 - j0, hd, t - j0),
                    out.ptr(),
                    len,
                    v_view.skip_rows(j0),
                    p,
                    tr.skip_rows(j0).skip_cols(j0),
                    dy,
                    dy_view.skip_rows(j0),
                    T::one(),
                    false,
                )?;
            }
            // dP = dY·Vᵀ (rows i0..i1 against 0..i1), then dS = scale · P ⊙ (dP − Σ_j dP⊙P) in
            // place, 0 where masked.
            let mut ds = Vec::<T>::with_capacity(t * t);
            causal_product(
                ds.as_mut_ptr(),
                t,
                hd,
                (dy, dy_view),
                (qkv, v_view),
                T::one(),
            )?;
            // SAFETY: `causal_product` wrote all T × T values.
            unsafe { ds.set_len(t * t) };
            for (i, (dr, pr)) in ds.chunks_mut(t).zip(p.chunks(t)).enumerate() {
                let keep = &mut dr[..=i]; // the masked rest is 0 already
                let dot = T::dot_slice(keep, &pr[..=i]);
                for (x, &pv) in keep.iter_mut().zip(pr) {
                    *x = scale * pv * (*x - dot);
                }
            }
            // dQ = dS·K (rows i0..i1 over keys 0..i1) and dK = dSᵀ·Q (row j over rows i ≥ j):
            // straight into dqkv's q and k columns, or through the rotation back into them.
            let mut rotated = (Vec::new(), Vec::new());
            let [(q, qv), (k, kv)] =
                q_and_k(self.fwd.rope.as_deref(), qkv, dims, (bi, hi), &mut rotated);
            let (mut dq, mut dk) = match self.fwd.rope {
                None => (Vec::new(), Vec::new()),
                Some(_) => (vec![T::zero(); t * hd], vec![T::zero(); t * hd]),
            };
            let [(dq_ptr, dq_len, dqv), (dk_ptr, dk_len, dkv)] = match self.fwd.rope {
                None => [
                    (out.ptr(), len, View::rows(q_off, 3 * d)),
                    (out.ptr(), len, View::rows(q_off + d, 3 * d)),
                ],
                Some(_) => [
                    (dq.as_mut_ptr(), t * hd, View::rows(0, hd)),
                    (dk.as_mut_ptr(), t * hd, View::rows(0, hd)),
                ],
            };
            for (i0, i1) in causal_blocks(t) {
                gemm_into(
                    (i1 - i0, hd, i1),
                    dq_ptr,
                    dq_len,
                    dqv.skip_rows(i0),
                    &ds,
                    View::rows(i0 * t, t),
                    k,
                    kv,
                    T::one(),
                    false,
                )?;
                gemm_into(
                    (i1 - i0, hd, t - i0),
                    dk_ptr,
                    dk_len,
                    dkv.skip_rows(i0),
                    &ds,
                    tr.skip_rows(i0).skip_cols(i0),
                    q,
                    qv.skip_rows(i0),
                    T::one(),
                    false,
                )?;
            }
            if let Some(rope) = &self.fwd.rope {
                scatter_unrotated(&dq, dims, bi, hi, 0, rope, out);
                scatter_unrotated(&dk, dims, bi, hi, d, rope, out);
            }
            Ok(())
        })?;
        // SAFETY: every pair wrote its q, k and v columns of every position (the GEMMs, or the
        // rotary scatter, which writes both halves of each head), so all of dqkv.
        unsafe { dqkv.set_len(len) };
        Ok(dqkv)
    }
}

impl CustomOp2 for AttentionBackward {
    fn name(&self) -> &'static str {
        "fused-attention-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dims = self.fwd.dims(l1)?;
        if l2.dims() != [dims.b, dims.t, dims.d()] {
            bail!(
                "fused-attention-backward: gradient {:?} for input {:?}",
                l2.dims(),
                l1.dims()
            );
        }
        let n = self.name();
        let out = float_kernel!(n; x = (s1, l1), g = (s2, l2) => self.backward(x, g, dims)?);
        Ok((out, l1.shape().clone()))
    }
}

/// Causal attention of packed qkv (B, T, 3·D) → (B, T, D), `scale` applied to the scores and
/// rotary positions to q and k when given; CPU, f32/f64.
pub fn fused_causal_attention(
    qkv: &Tensor,
    n_heads: usize,
    scale: f64,
    rope: Option<Arc<RopeTables>>,
) -> Result<Tensor> {
    qkv.contiguous()?
        .apply_op1(FusedAttention::new(n_heads, scale, rope))
}
