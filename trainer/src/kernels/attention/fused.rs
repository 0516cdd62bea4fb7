//! Fused causal self-attention on CPU: from the packed `c_attn` output (B, T, 3·D) straight to
//! the head-merged result (B, T, D), forward and backward each in one op.
//!
//! Built from candle primitives, attention is a permute copy of q/k/v, three `narrow`s (whose
//! backward pads each gradient back to the full 3·D width), a transposed copy of k, two batched
//! matmuls and the softmax over (B·H, T, T) scores, and a transpose copy of the result; every
//! edge of that graph costs a zeroed gradient buffer and an add in candle's backward. Here each
//! (batch, head) pair runs its GEMMs on strided views of the packed buffer, the heads are split
//! across candle's thread pool, and the softmax probabilities are kept for the backward.
//! Rotary positions, when configured, are applied to q and k inside the op.

use std::sync::Arc;

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};

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
struct FusedAttention {
    n_heads: usize,
    scale: f64,
    rope: Option<Arc<RopeTables>>,
    /// Probabilities (B·H, T, T) of this op's forward, for its backward.
    probs: Stash,
}

/// Shapes of one call.
#[derive(Debug, Clone, Copy)]
struct Dims {
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

/// Softmax of each row `i` of a (T, T) score matrix over columns `0..=i`; the rest become 0.
fn causal_softmax_inplace<T: Real>(s: &mut [T], t: usize) {
    for (i, row) in s.chunks_mut(t).enumerate() {
        let (keep, masked) = row.split_at_mut(i + 1);
        let mut max = keep[0];
        for &v in &keep[1..] {
            if v > max {
                max = v;
            }
        }
        for v in keep.iter_mut() {
            *v -= max;
        }
        T::exp_slice(keep);
        let inv = T::one() / T::sum_slice(keep);
        for v in keep.iter_mut() {
            *v *= inv;
        }
        masked.fill(T::zero());
    }
}

impl FusedAttention {
    fn new(n_heads: usize, scale: f64, rope: Option<Arc<RopeTables>>) -> Self {
        FusedAttention {
            n_heads,
            scale,
            rope,
            probs: Stash::default(),
        }
    }

    fn dims(&self, layout: &Layout) -> Result<Dims> {
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

    fn forward<T: Real>(&self, qkv: &[T], dims: Dims) -> Result<Vec<T>> {
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
            let sv = View::rows(0, t);
            match &self.rope {
                None => gemm_into(
                    (t, t, hd),
                    scores_dst,
                    t * t,
                    sv,
                    qkv,
                    View::rows(q_off, 3 * d),
                    qkv,
                    View::rows(q_off + d, 3 * d).transposed(),
                    scale,
                    false,
                )?,
                Some(rope) => {
                    let mut q = vec![T::zero(); t * hd];
                    let mut k = vec![T::zero(); t * hd];
                    gather_rotated(qkv, dims, bi, hi, 0, rope, &mut q);
                    gather_rotated(qkv, dims, bi, hi, d, rope, &mut k);
                    gemm_into(
                        (t, t, hd),
                        scores_dst,
                        t * t,
                        sv,
                        &q,
                        View::rows(0, hd),
                        &k,
                        View::rows(0, hd).transposed(),
                        scale,
                        false,
                    )?
                }
            }
            // SAFETY: the scores GEMM (k = head_dim ≥ 1) wrote all T × T values of the block.
            let p = unsafe { std::slice::from_raw_parts_mut(scores_dst, t * t) };
            causal_softmax_inplace(p, t);
            let y_view = View::rows(bi * t * d + hi * hd, d);
            gemm_into(
                (t, hd, t),
                y_ptr.ptr(),
                y_len,
                y_view,
                p,
                View::rows(0, t),
                qkv,
                View::rows(q_off + 2 * d, 3 * d),
                T::one(),
                false,
            )?;
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
struct AttentionBackward {
    fwd: FusedAttention,
}

impl AttentionBackward {
    fn backward<T: Real>(&self, qkv: &[T], dy: &[T], dims: Dims) -> Result<Vec<T>> {
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
            // dV = Pᵀ·dY, straight into dqkv's v columns.
            gemm_into(
                (t, hd, t),
                out.ptr(),
                len,
                v_view,
                p,
                View::rows(0, t).transposed(),
                dy,
                dy_view,
                T::one(),
                false,
            )?;
            // dP = dY·Vᵀ, then dS = scale · P ⊙ (dP − Σ_j dP⊙P) in place.
            let mut ds = Vec::<T>::with_capacity(t * t);
            gemm_into(
                (t, t, hd),
                ds.as_mut_ptr(),
                t * t,
                View::rows(0, t),
                dy,
                dy_view,
                qkv,
                v_view.transposed(),
                T::one(),
                false,
            )?;
            // SAFETY: the GEMM (k = head_dim ≥ 1) wrote all T × T values.
            unsafe { ds.set_len(t * t) };
            for (dr, pr) in ds.chunks_mut(t).zip(p.chunks(t)) {
                let dot = T::dot_slice(dr, pr);
                for (x, &pv) in dr.iter_mut().zip(pr) {
                    *x = scale * pv * (*x - dot);
                }
            }
            match &self.fwd.rope {
                None => {
                    // dQ = dS·K and dK = dSᵀ·Q, straight into dqkv's q and k columns.
                    let (qv, kv) = (View::rows(q_off, 3 * d), View::rows(q_off + d, 3 * d));
                    gemm_into(
                        (t, hd, t),
                        out.ptr(),
                        len,
                        qv,
                        &ds,
                        View::rows(0, t),
                        qkv,
                        kv,
                        T::one(),
                        false,
                    )?;
                    gemm_into(
                        (t, hd, t),
                        out.ptr(),
                        len,
                        kv,
                        &ds,
                        View::rows(0, t).transposed(),
                        qkv,
                        qv,
                        T::one(),
                        false,
                    )?;
                }
                Some(rope) => {
                    let mut q = vec![T::zero(); t * hd];
                    let mut k = vec![T::zero(); t * hd];
                    gather_rotated(qkv, dims, bi, hi, 0, rope, &mut q);
                    gather_rotated(qkv, dims, bi, hi, d, rope, &mut k);
                    let hv = View::rows(0, hd);
                    let mut dq = vec![T::zero(); t * hd];
                    let mut dk = vec![T::zero(); t * hd];
                    gemm_into(
                        (t, hd, t),
                        dq.as_mut_ptr(),
                        t * hd,
                        hv,
                        &ds,
                        View::rows(0, t),
                        &k,
                        hv,
                        T::one(),
                        false,
                    )?;
                    gemm_into(
                        (t, hd, t),
                        dk.as_mut_ptr(),
                        t * hd,
                        hv,
                        &ds,
                        View::rows(0, t).transposed(),
                        &q,
                        hv,
                        T::one(),
                        false,
                    )?;
                    scatter_unrotated(&dq, dims, bi, hi, 0, rope, out);
                    scatter_unrotated(&dk, dims, bi, hi, d, rope, out);
                }
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

/// c_attn and the attention as one op: x (B, T, C), W (3·D, C), b (3·D,) → y (B, T, D). The
/// packed q/k/v stay inside the op (kept for the backward, as the attention node kept its
/// input), so candle's backward zero-fills and adds one (B, T, 3·D) buffer less per layer. The
/// same kernels run in the same order as `linear` then `fused_causal_attention`.
pub fn fused_qkv_attention(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    n_heads: usize,
    scale: f64,
    rope: Option<Arc<RopeTables>>,
) -> Result<Tensor> {
    let op = QkvAttention {
        attn: FusedAttention::new(n_heads, scale, rope),
        qkv: Stash::default(),
    };
    x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, op)
}

#[derive(Clone)]
struct QkvAttention {
    attn: FusedAttention,
    /// The packed q/k/v of this op's forward, for its backward.
    qkv: Stash,
}

impl std::fmt::Debug for QkvAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QkvAttention")
            .field("attn", &self.attn)
            .finish()
    }
}

impl QkvAttention {
    fn forward<T: Real>(
        &self,
        x: &[T],
        w: &[T],
        b: &[T],
        (bsz, t, d_in, d3): (usize, usize, usize, usize),
    ) -> Result<Vec<T>> {
        let dims = self.attn.dims(&Layout::contiguous((bsz, t, d3)))?;
        let qkv = crate::kernels::linear::forward(x, w, Some(b), (bsz * t, d_in, d3))?;
        let y = self.attn.forward(&qkv, dims)?;
        self.qkv.keep(qkv);
        Ok(y)
    }
}

impl CustomOp3 for QkvAttention {
    fn name(&self) -> &'static str {
        "qkv-attention"
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
        let (bsz, t, d_in) = l1.shape().dims3()?;
        let (d3, w_in) = l2.shape().dims2()?;
        if w_in != d_in || l3.dims() != [d3] {
            bail!(
                "{name}: weight {:?} and bias {:?} for input {:?}",
                l2.dims(),
                l3.dims(),
                l1.dims()
            );
        }
        let out = float_kernel!(name; x = (s1, l1), w = (s2, l2), b = (s3, l3) => self.forward(x, w, b, (bsz, t, d_in, d3))?);
        Ok((out, Shape::from((bsz, t, d3 / 3))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // The attention's backward to the packed q/k/v, then the linear layer's from there.
        let g = grad.contiguous()?; // (B, T, D)
        let dqkv = g.apply_op1_no_bwd(&QkvAttentionGrad { op: self.clone() })?; // (B, T, 3D)
        let (dx, dw) = crate::kernels::linear::input_and_weight_grads(&dqkv, x, w)?;
        let db = crate::kernels::bias::sum_rows(&dqkv)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// dy (B, T, D) → dqkv (B, T, 3·D), from the q/k/v and probabilities `QkvAttention` kept.
struct QkvAttentionGrad {
    op: QkvAttention,
}

impl QkvAttentionGrad {
    fn grad<T: Real>(&self, dy: &[T], dims: Dims) -> Result<Vec<T>> {
        let backward = AttentionBackward {
            fwd: self.op.attn.clone(),
        };
        self.op.qkv.with("qkv-attention", |qkv: &[T]| {
            backward.backward(qkv, dy, dims)
        })
    }
}

impl CustomOp1 for QkvAttentionGrad {
    fn name(&self) -> &'static str {
        "qkv-attention-grad"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (bsz, t, d) = layout.shape().dims3()?;
        let dims = self.op.attn.dims(&Layout::contiguous((bsz, t, 3 * d)))?;
        let out = float_kernel!(self.name(); dy = (storage, layout) => self.grad(dy, dims)?);
        Ok((out, Shape::from((bsz, t, 3 * d))))
    }
}
