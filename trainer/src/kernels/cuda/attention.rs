//! Causal attention under bf16 autocast on a GPU as one graph node: from the packed q/k/v
//! projection (B, T, 3·D) in f32 to the merged heads (B, T, D) in f32,
//! y = softmax(scale·q·kᵀ + causal mask)·v per head, products in bf16 with f32 accumulation.
//!
//! Why one node: built from candle's ops the same attention is about twenty graph nodes per
//! layer (reshapes, a permute and its copy, three head selections, casts, a transpose, the two
//! products, the softmax), and candle's backward zero-fills a gradient buffer and adds into it
//! for every node's input, up to the (B·H, T, T) scores. Here the forward is one relayout-and-
//! cast kernel, two cuBLAS products around the causal softmax kernel (the second writing each
//! head's slice of the merged output directly), and the backward one relayout of q/k/v and of
//! the output gradient plus four products around the softmax backward, writing dq, dk and dv
//! into their places in the packed gradient.
//!
//! The softmax probabilities (bf16, (B·H, T, T)) are kept for the backward, as the reference
//! path keeps them; q, k and v are recomputed from the f32 input (one pass) rather than kept.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{
    bail, CpuStorage, CudaDevice, CudaStorage, CustomOp1, Layout, Result, Shape, Storage, Tensor,
};
use half::bf16;

use super::gemm::{gemm, Mat};
use super::{elementwise_cfg, output, rows_cfg, view, wrap, MODULE, PTX};

const NAME: &str = "bf16-causal-attention";

/// qkv (B, T, 3·D) f32 on a GPU, q then k then v along the last dim, each head-major, with
/// `heads` heads → y (B, T, D) f32.
pub fn bf16_causal_attention(qkv: &Tensor, heads: usize, scale: f64) -> Result<Tensor> {
    qkv.contiguous()?.apply_op1(Bf16Attention {
        heads,
        scale,
        probs: Mutex::new(None),
    })
}

struct Bf16Attention {
    heads: usize,
    scale: f64,
    /// The forward's softmax probabilities (B·H·T·T bf16), for the backward.
    probs: Mutex<Option<CudaSlice<bf16>>>,
}

/// (B, T, H, hd) sizes of one call.
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    t: usize,
    h: usize,
    hd: usize,
}

impl Dims {
    fn of(shape: &Shape, heads: usize) -> Result<Self> {
        let (b, t, d3) = shape.dims3()?;
        if heads == 0 || d3 % (3 * heads) != 0 {
            bail!("{NAME}: width {d3} is not 3 x heads ({heads}) x head size");
        }
        Ok(Dims {
            b,
            t,
            h: heads,
            hd: d3 / 3 / heads,
        })
    }

    /// Elements of one of q, k, v (or of y).
    fn part(&self) -> usize {
        self.b * self.h * self.t * self.hd
    }

    fn scores(&self) -> usize {
        self.b * self.h * self.t * self.t
    }
}

/// `parts` head-major f32 tensors packed along the last dim of src (B, T, parts·H·hd) →
/// (parts, B, H, T, hd) bf16: one pass that casts and puts each head's rows together.
fn split_heads(
    dev: &CudaDevice,
    src: &CudaStorage,
    l: &Layout,
    d: Dims,
    parts: usize,
) -> Result<CudaSlice<bf16>> {
    let x = view::<f32>(src, l, NAME)?;
    let n = parts * d.part();
    // SAFETY: the kernel writes every element.
    let out = unsafe { dev.alloc::<bf16>(n) }?;
    let sizes = [d.b, d.t, parts, d.h, d.hd].map(|v| v as u64);
    launch!(
        dev,
        "ty_split_heads_bf16",
        elementwise_cfg(n),
        &x,
        &out,
        &sizes[0],
        &sizes[1],
        &sizes[2],
        &sizes[3],
        &sizes[4]
    );
    Ok(out)
}

impl CustomOp1 for Bf16Attention {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("{NAME}: a GPU-only op was given CPU tensors")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = s.device();
        let d = Dims::of(l.shape(), self.heads)?;
        let (t, hd, bh) = (d.t, d.hd, d.b * d.h);
        let qkv = split_heads(dev, s, l, d, 3)?; // (3, B, H, T, hd)
                                                 // SAFETY: the kernels and products below write every element before it is read.
        let scores = unsafe { dev.alloc::<bf16>(d.scores()) }?; // (BH, T, T)
        let probs = unsafe { dev.alloc::<bf16>(d.scores()) }?;
        let y = output(dev, d.part())?; // (B, T, H·hd)
        let stream = dev.cuda_stream();
        {
            let (qp, _q) = qkv.device_ptr(&stream);
            let (sp, _s) = scores.device_ptr(&stream);
            let bytes = 2 * d.part() as u64; // one of q, k, v in bf16
                                             // scores (BH, T, T) = q · kᵀ per head.
                                             // SAFETY: q and k each hold BH matrices of (T, hd), scores BH of (T, T).
            unsafe {
                gemm(
                    dev,
                    (t, t, hd),
                    Mat::bf16(qp, hd).every(t * hd),
                    Mat::bf16(qp + bytes, hd).t().every(t * hd),
                    Mat::bf16(sp, t).every(t * t),
                    0.0,
                    bh,
                )
            }?;
        }
        launch!(
            dev,
            "ty_causal_softmax_fwd_bf16",
            rows_cfg(bh * t, t),
            &scores,
            &probs,
            &(t as u64),
            &(self.scale as f32)
        );
        drop(scores);
        {
            let (qp, _q) = qkv.device_ptr(&stream);
            let (pp, _p) = probs.device_ptr(&stream);
            let (yp, _y) = y.device_ptr(&stream);
            let vp = qp + 4 * d.part() as u64;
            let width = d.h * hd;
            for b in 0..d.b {
                // y[b, :, h, :] = probs[b, h] · v[b, h] for every head h: the product lands in
                // its head's columns of the merged (T, H·hd) rows (row stride H·hd).
                let head = t * hd;
                // SAFETY: batch b's H matrices of probs (T, T) and v (T, hd), and y's rows of
                // batch b, H·hd wide, are inside their buffers.
                unsafe {
                    gemm(
                        dev,
                        (t, hd, t),
                        Mat::bf16(pp + (2 * b * d.h * t * t) as u64, t).every(t * t),
                        Mat::bf16(vp + (2 * b * d.h * head) as u64, hd).every(head),
                        Mat::f32(yp + (4 * b * t * width) as u64, width).every(hd),
                        0.0,
                        d.h,
                    )
                }?;
            }
        }
        *self
            .probs
            .lock()
            .map_err(|_| candle_core::Error::Msg(format!("{NAME}: lock poisoned")))? = Some(probs);
        Ok(wrap(y, dev, (d.b, d.t, d.h * d.hd)))
    }

    fn bwd(&self, qkv: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let probs = self
            .probs
            .lock()
            .map_err(|_| candle_core::Error::Msg(format!("{NAME}: lock poisoned")))?
            .take();
        let Some(probs) = probs else {
            bail!("{NAME}: the backward ran without the forward's probabilities");
        };
        let grad = grad.contiguous()?;
        let (qs, ql) = qkv.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (Storage::Cuda(qs), Storage::Cuda(gs)) = (&*qs, &*gs) else {
            bail!("{NAME}: expected CUDA tensors");
        };
        let dev = qs.device().clone();
        let d = Dims::of(ql.shape(), self.heads)?;
        let dqkv = backward(&dev, d, self.scale, (qs, ql), (gs, gl), &probs)?;
        Ok(Some(Tensor::from_storage(
            Storage::Cuda(CudaStorage::wrap_cuda_slice(dqkv, dev)),
            ql.shape().clone(),
            candle_core::op::BackpropOp::none(),
            false,
        )))
    }
}

/// d qkv (B, T, 3·H·hd) f32 from qkv, the output gradient (B, T, H·hd) f32 and the forward's
/// probabilities P: dv = Pᵀ·dy, dP = dy·vᵀ, dS = scale·P⊙(dP − rowsum(dP⊙P)), dq = dS·k,
/// dk = dSᵀ·q, per head.
fn backward(
    dev: &CudaDevice,
    d: Dims,
    scale: f64,
    (qs, ql): (&CudaStorage, &Layout),
    (gs, gl): (&CudaStorage, &Layout),
    probs: &CudaSlice<bf16>,
) -> Result<CudaSlice<f32>> {
    let (t, hd, bh) = (d.t, d.hd, d.b * d.h);
    let qkv = split_heads(dev, qs, ql, d, 3)?; // (3, B, H, T, hd)
    let dy = split_heads(dev, gs, gl, d, 1)?; // (B, H, T, hd)
                                              // SAFETY: written by the product below before the softmax backward reads it.
    let dp = unsafe { dev.alloc::<bf16>(d.scores()) }?; // (BH, T, T)
    let ds = unsafe { dev.alloc::<bf16>(d.scores()) }?;
    let dqkv = output(dev, 3 * d.part())?; // (B, T, 3, H, hd): every element written below
    let stream = dev.cuda_stream();
    let head = t * hd;
    let width3 = 3 * d.h * hd;
    {
        let (qp, _q) = qkv.device_ptr(&stream);
        let (yp, _y) = dy.device_ptr(&stream);
        let (dpp, _dp) = dp.device_ptr(&stream);
        let vp = qp + 4 * d.part() as u64;
        // dP (BH, T, T) = dy · vᵀ.
        // SAFETY: dy and v hold BH matrices of (T, hd), dP BH of (T, T).
        unsafe {
            gemm(
                dev,
                (t, t, hd),
                Mat::bf16(yp, hd).every(head),
                Mat::bf16(vp, hd).t().every(head),
                Mat::bf16(dpp, t).every(t * t),
                0.0,
                bh,
            )
        }?;
    }
    launch!(
        dev,
        "ty_softmax_bwd_bf16",
        rows_cfg(bh * t, t),
        probs,
        &dp,
        &ds,
        &(t as u64),
        &(scale as f32)
    );
    drop(dp);
    {
        let (qp, _q) = qkv.device_ptr(&stream);
        let (yp, _y) = dy.device_ptr(&stream);
        let (pp, _p) = probs.device_ptr(&stream);
        let (sp, _s) = ds.device_ptr(&stream);
        let (op, _o) = dqkv.device_ptr(&stream);
        let kp = qp + 2 * d.part() as u64;
        for b in 0..d.b {
            let scores_b = (2 * b * d.h * t * t) as u64; // bytes into P or dS
            let heads_b = (2 * b * d.h * head) as u64; // bytes into q, k, v or dy
                                                       // Batch b's rows of the packed gradient: part s of head h at column (s·H + h)·hd.
            let out = |part: usize| {
                Mat::f32(op + (4 * (b * t * width3 + part * d.h * hd)) as u64, width3).every(hd)
            };
            let pmat = |base: u64| Mat::bf16(base + scores_b, t).every(t * t);
            let hmat = |base: u64| Mat::bf16(base + heads_b, hd).every(head);
            // SAFETY: every matrix is batch b's H heads inside its buffer; the outputs are the
            // disjoint (T, hd) column blocks of dq, dk and dv in batch b's rows.
            unsafe {
                // dq = dS · k
                gemm(dev, (t, hd, t), pmat(sp), hmat(kp), out(0), 0.0, d.h)?;
                // dk = dSᵀ · q
                gemm(dev, (t, hd, t), pmat(sp).t(), hmat(qp), out(1), 0.0, d.h)?;
                // dv = Pᵀ · dy
                gemm(dev, (t, hd, t), pmat(pp).t(), hmat(yp), out(2), 0.0, d.h)?;
            }
        }
    }
    Ok(dqkv)
}
