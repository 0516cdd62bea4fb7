//! The linear layer under bf16 autocast on a GPU: y = x·Wᵀ + b with x, W and b in f32 (W is the
//! optimizer's master copy), multiplied in bf16 on the tensor cores with f32 accumulation, and
//! the product written by cuBLAS straight into an f32 output that already holds the bias.
//!
//! From candle's primitives the same layer is a cast of x, a transposing cast of W, a bf16
//! product, a cast of the product back to f32 and a broadcast bias add; its backward adds the
//! casts' backwards, a strided accumulation of the transposed weight gradient and candle's
//! strided column reduction for the bias gradient. Here the forward is two casts, one bias fill
//! and one GEMM; the backward three casts, two GEMMs (dx = g·W, dW = gᵀ·x) and one f32
//! matrix-vector product for db = gᵀ·1, every operand contiguous. The bf16 copies of x and W are
//! not kept for the backward (it casts again), so the layer holds no more memory than its f32
//! input.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cublas::{result as blas, sys as blas_sys};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DevicePtr, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{
    bail, CpuStorage, CudaDevice, CudaStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout,
    Result, Shape, Tensor,
};
use half::bf16;

use super::gemm::{gemm, Mat};
use super::{elementwise_cfg, output, view, wrap, MODULE, PTX};

/// x (.., in) · weight (out, in)ᵀ [+ bias (out,)] → (.., out), all f32 CUDA tensors, the product
/// in bf16 with f32 accumulation, over the flattened leading dims without reshaping x.
pub fn bf16_linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let x = x.contiguous()?;
    let weight = weight.contiguous()?;
    match bias {
        Some(b) => x.apply_op3(&weight, &b.contiguous()?, Bf16Linear),
        None => x.apply_op2(&weight, Bf16Linear),
    }
}

#[derive(Debug, Clone, Copy)]
struct Bf16Linear;

const NAME: &str = "bf16-linear";

fn cpu_refused() -> Result<(CpuStorage, Shape)> {
    bail!("{NAME}: a GPU-only op was given CPU tensors")
}

/// The forward: bias fill (or none), casts, one GEMM accumulating onto the output.
fn forward(
    (sx, lx): (&CudaStorage, &Layout),
    (sw, lw): (&CudaStorage, &Layout),
    bias: Option<(&CudaStorage, &Layout)>,
) -> Result<(CudaStorage, Shape)> {
    let dev = sx.device();
    let (out_dim, k) = lw.shape().dims2()?;
    let mut dims = lx.dims().to_vec();
    if dims.pop() != Some(k) {
        bail!(
            "{NAME}: input {:?} does not fit weight {:?}",
            lx.dims(),
            lw.dims()
        );
    }
    let n = lx.shape().elem_count() / k.max(1);
    dims.push(out_dim);
    let xb = to_bf16(dev, &view::<f32>(sx, lx, NAME)?, n * k)?;
    let wb = to_bf16(dev, &view::<f32>(sw, lw, NAME)?, out_dim * k)?;
    let y = output(dev, n * out_dim)?;
    let beta = match bias {
        Some((sb, lb)) => {
            if lb.dims() != [out_dim] {
                bail!(
                    "{NAME}: bias {:?} does not match weight {:?}",
                    lb.dims(),
                    lw.dims()
                );
            }
            let b = view::<f32>(sb, lb, NAME)?;
            let (rows, cols) = (n as u64, out_dim as u64);
            launch!(
                dev,
                "ty_fill_rows_f32",
                elementwise_cfg(n * out_dim),
                &b,
                &y,
                &rows,
                &cols
            );
            1.0
        }
        None => 0.0,
    };
    let stream = dev.cuda_stream();
    let ((xp, _x), (wp, _w), (yp, _y)) = (
        xb.device_ptr(&stream),
        wb.device_ptr(&stream),
        y.device_ptr(&stream),
    );
    // y (N, out) = x (N, in) · Wᵀ, W stored (out, in).
    // SAFETY: the three buffers hold N·in, out·in and N·out elements, written on this stream.
    unsafe {
        gemm(
            dev,
            (n, out_dim, k),
            Mat::bf16(xp, k),
            Mat::bf16(wp, k).t(),
            Mat::f32(yp, out_dim),
            beta,
            1,
        )
    }?;
    drop((_x, _w, _y));
    Ok(wrap(y, dev, dims))
}

/// The three gradients from the output gradient g (N, out): dx = g·W, dW = gᵀ·x in bf16 with
/// f32 results, db = column sums of g in f32.
fn backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    with_bias: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let (out_dim, k) = w.dims2()?;
    let g = g.contiguous()?.reshape(((), out_dim))?; // (N, out)
    let x2 = x.reshape(((), k))?; // (N, in)
    let gb = g.to_dtype(DType::BF16)?;
    let dx = gb.apply_op2_no_bwd(&w.to_dtype(DType::BF16)?, &Bf16Gemm { ta: false })?; // (N, in)
    let dx = dx.reshape(x.dims())?; // (.., in)
    let dw = gb.apply_op2_no_bwd(&x2.to_dtype(DType::BF16)?, &Bf16Gemm { ta: true })?; // (out, in)
    let db = if with_bias {
        Some(g.apply_op1_no_bwd(&ColumnSums)?) // (out,)
    } else {
        None
    };
    Ok((dx, dw, db))
}

impl CustomOp2 for Bf16Linear {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_refused()
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        forward((s1, l1), (s2, l2), None)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = backward(x, w, g, false)?;
        Ok((Some(dx), Some(dw)))
    }
}

impl CustomOp3 for Bf16Linear {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_refused()
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        forward((s1, l1), (s2, l2), Some((s3, l3)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = backward(x, w, g, true)?;
        Ok((Some(dx), Some(dw), db))
    }
}

/// C (M, N) f32 = A · B for bf16 A (M, K), or Aᵀ when `ta` with A stored (K, M), and bf16 B
/// (K, N); no backward (it serves the linear layer's backward).
#[derive(Debug, Clone, Copy)]
struct Bf16Gemm {
    ta: bool,
}

impl CustomOp2 for Bf16Gemm {
    fn name(&self) -> &'static str {
        "bf16-gemm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_refused()
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = s1.device();
        let (r, c) = l1.shape().dims2()?;
        let (m, k) = if self.ta { (c, r) } else { (r, c) };
        let (k_b, n) = l2.shape().dims2()?;
        if k != k_b {
            bail!("bf16-gemm: {:?} does not fit {:?}", l1.dims(), l2.dims());
        }
        let a = view::<bf16>(s1, l1, "bf16-gemm")?;
        let b = view::<bf16>(s2, l2, "bf16-gemm")?;
        let out = output(dev, m * n)?;
        let stream = dev.cuda_stream();
        let ((ap, _a), (bp, _b), (cp, _c)) = (
            a.device_ptr(&stream),
            b.device_ptr(&stream),
            out.device_ptr(&stream),
        );
        let a = if self.ta {
            Mat::bf16(ap, m).t() // stored (K, M)
        } else {
            Mat::bf16(ap, k)
        };
        // SAFETY: a, b and out hold M·K, K·N and M·N elements, written on this stream.
        unsafe { gemm(dev, (m, n, k), a, Mat::bf16(bp, n), Mat::f32(cp, n), 0.0, 1) }?;
        drop((_a, _b, _c));
        Ok(wrap(out, dev, (m, n)))
    }
}

/// (N, C) f32 → (C,): the sum over rows, as one f32 matrix-vector product with a ones vector
/// (deterministic, unlike atomic column sums).
#[derive(Debug, Clone, Copy)]
struct ColumnSums;

impl CustomOp1 for ColumnSums {
    fn name(&self) -> &'static str {
        "column-sums"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_refused()
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = s.device();
        let (rows, cols) = l.shape().dims2()?;
        let g = view::<f32>(s, l, "column-sums")?;
        let ones = output(dev, rows)?;
        launch!(
            dev,
            "ty_fill_f32",
            elementwise_cfg(rows),
            &ones,
            &1.0f32,
            &(rows as u64)
        );
        let out = output(dev, cols)?;
        column_sums(dev, &g, &ones, &out, rows, cols)?;
        Ok(wrap(out, dev, cols))
    }
}

/// y (cols,) = Σ over rows of g (rows, cols), as g's column-major (cols × rows) view times ones.
fn column_sums(
    dev: &CudaDevice,
    g: &CudaView<f32>,
    ones: &CudaSlice<f32>,
    y: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let stream = dev.cuda_stream();
    let handle = dev.cublas_handle();
    let (gp, _g) = g.device_ptr(&stream);
    let (op, _o) = ones.device_ptr(&stream);
    let (yp, _y) = y.device_ptr(&stream);
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the pointers cover rows·cols, rows and cols f32, on the handle's stream.
    unsafe {
        blas::sgemv(
            *handle.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            cols as i32,
            rows as i32,
            &alpha,
            gp as *const f32,
            cols as i32,
            op as *const f32,
            1,
            &beta,
            yp as *mut f32,
            1,
        )
    }
    .w()?;
    Ok(())
}

/// `n` f32 elements cast to bf16 (round to nearest even, as candle's cast).
fn to_bf16(dev: &CudaDevice, x: &CudaView<f32>, n: usize) -> Result<CudaSlice<bf16>> {
    // SAFETY: the kernel writes every element.
    let out = unsafe { dev.alloc::<bf16>(n) }?;
    launch!(
        dev,
        "ty_cast_f32_bf16",
        elementwise_cfg(n),
        x,
        &out,
        &(n as u64)
    );
    Ok(out)
}
