//! The q/k/v projection and the causal attention as one op (`fused_qkv_attention`): the
//! packed q/k/v never become a graph node, so candle's backward has one (B, T, 3·D) gradient
//! buffer fewer to zero-fill and add per layer. The kernels are `fused.rs`'s and the linear
//! layer's, in the same order as the two ops.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor};

use super::fused::{AttentionBackward, Dims, FusedAttention, RopeTables};
use crate::kernels::real::{float_kernel, Real, Stash};
use crate::kernels::residual::{Op3Step, Step};

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

/// `fused_qkv_attention` as a step of a residual branch (`residual`), outside the graph.
pub fn qkv_attention_step(
    w: &Tensor,
    b: &Tensor,
    n_heads: usize,
    scale: f64,
    rope: Option<Arc<RopeTables>>,
) -> Result<Box<dyn Step>> {
    let op = QkvAttention {
        attn: FusedAttention::new(n_heads, scale, rope),
        qkv: Stash::default(),
    };
    Op3Step::boxed(op, w, b)
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
