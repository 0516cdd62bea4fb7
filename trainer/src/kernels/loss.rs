//! Mean next-token cross-entropy of logits against target ids, with optional label smoothing.
//!
//! From candle primitives it is a log-softmax, a gather and a mean: ~8 ops forward and ~15
//! backward over the (N, V) logits. The fused CPU op computes each row's log-softmax and
//! negative log-likelihood in one pass, and its backward (softmax − one-hot, times the row's
//! gradient) in another, in parallel blocks of rows.
//!
//! Label smoothing ε mixes the one-hot target with the uniform distribution over the V classes:
//! loss = (1 − ε)·(lse − x_t) + ε·(lse − mean(x)) = lse − (1 − ε)·x_t − ε·mean(x), whose
//! gradient is softmax − (1 − ε)·onehot − ε/V. The fused CPU op computes that in the same passes;
//! the CUDA kernel knows only ε = 0, so a smoothed loss on a GPU takes the primitive path.

use candle_core::{
    bail, CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D,
};

use super::parallel::filled_by_chunks;
use super::real::{float_kernel, slice, Real};

/// Mean next-token cross-entropy. `logits` (.., V) float, `targets` (..) u32 with the same
/// leading dims. Computed in f32 at least, whatever the logits' dtype: fused on CPU, elsewhere a
/// log-softmax from differentiable primitives, shifted by the (constant) row max for stability.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    smoothed_cross_entropy(logits, targets, 0.0)
}

/// [`cross_entropy`] against targets smoothed by `smoothing` (ε in [0, 1)): the mean over rows
/// of lse − (1 − ε)·x_target − ε·mean(x). ε = 0 is the plain cross-entropy.
pub fn smoothed_cross_entropy(logits: &Tensor, targets: &Tensor, smoothing: f64) -> Result<Tensor> {
    if !(0.0..1.0).contains(&smoothing) {
        bail!("cross-entropy: label smoothing must be in [0, 1), got {smoothing}");
    }
    let v = logits.dim(D::Minus1)?;
    let logits = match logits.dtype() {
        DType::F64 | DType::F32 => logits.clone(),
        _ => logits.to_dtype(DType::F32)?,
    };
    let logits = logits.reshape(((), v))?; // (N, V)
    let fused = super::use_fused(&logits)
        || (smoothing == 0.0 && super::use_cuda_kernel(&logits, super::CudaKernel::CrossEntropy));
    if fused && targets.dtype() == DType::U32 {
        return fused_smoothed_cross_entropy(&logits, &targets.flatten_all()?, smoothing);
    }
    let targets = targets.flatten_all()?.unsqueeze(1)?; // (N, 1)
    let max = logits.max_keepdim(1)?.detach(); // (N, 1)
    let z = logits.broadcast_sub(&max)?; // (N, V)
    let lse = z.exp()?.sum_keepdim(1)?.log()?; // (N, 1)
    let picked = z.gather(&targets, 1)?; // (N, 1)
    if smoothing == 0.0 {
        return (lse - picked)?.mean_all();
    }
    // −mean log-softmax over the vocabulary is lse − mean(z).
    let mean = z.mean_keepdim(1)?; // (N, 1)
    (lse - (picked.affine(1.0 - smoothing, 0.0)? + mean.affine(smoothing, 0.0)?)?)?.mean_all()
}

/// The fused path of `cross_entropy` (CPU in f32 or f64, CUDA in f32): logits (N, V), targets
/// (N,) u32.
pub fn fused_cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    fused_smoothed_cross_entropy(logits, targets, 0.0)
}

/// The fused path of `smoothed_cross_entropy`: on the CPU for any ε, on CUDA for ε = 0 only.
pub fn fused_smoothed_cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    smoothing: f64,
) -> Result<Tensor> {
    let losses = logits
        .contiguous()?
        .apply_op2(&targets.contiguous()?, CrossEntropyRows { smoothing })?; // (N,)
    losses.mean_all()
}

/// (N, V) logits, (N,) u32 targets → (N,) losses logsumexp(row) − (1 − ε)·row[target] −
/// ε·mean(row), ε = `smoothing`.
#[derive(Debug, Clone, Copy)]
struct CrossEntropyRows {
    smoothing: f64,
}

/// Row max and Σ exp(x − max); `scratch` (the row's length) ends holding exp(x − max).
fn max_and_exp_sum<T: Real>(row: &[T], scratch: &mut [T]) -> (T, T) {
    let mut max = row[0];
    for &v in &row[1..] {
        if v > max {
            max = v;
        }
    }
    for (s, &v) in scratch.iter_mut().zip(row) {
        *s = v - max;
    }
    T::exp_slice(scratch);
    (max, T::sum_slice(scratch))
}

fn check_target(t: u32, v: usize) -> Result<usize> {
    let t = t as usize;
    if t >= v {
        bail!("cross-entropy: target {t} out of range for vocabulary size {v}");
    }
    Ok(t)
}

/// (N, V) of the logits, checking that every per-row argument (targets, row gradients) is (N,);
/// for the CPU and CUDA paths alike.
fn rows_and_vocab(logits: &Layout, per_row: &[&Layout], op: &str) -> Result<(usize, usize)> {
    let (n, v) = logits.shape().dims2()?;
    if per_row.iter().any(|l| l.dims() != [n]) {
        let dims: Vec<&[usize]> = per_row.iter().map(|l| l.dims()).collect();
        bail!(
            "{op}: per-row arguments {dims:?} for logits {:?}",
            logits.dims()
        );
    }
    Ok((n, v))
}

/// Rows per parallel block of the loss and its backward.
const BLOCK_ROWS: usize = 64;

fn ce_rows<T: Real>(x: &[T], targets: &[u32], v: usize, smoothing: f64) -> Result<Vec<T>> {
    let n = targets.len();
    let keep = T::from_f64(1.0 - smoothing);
    let spread = T::from_f64(smoothing);
    let inv_v = T::from_f64(1.0 / v as f64);
    let work = n.div_ceil(BLOCK_ROWS) * BLOCK_ROWS * v;
    let out = filled_by_chunks(n, BLOCK_ROWS, work, |blk, losses| {
        let mut scratch = vec![T::zero(); v];
        for (i, loss) in losses.iter_mut().enumerate() {
            let r = blk * BLOCK_ROWS + i;
            let row = &x[r * v..(r + 1) * v];
            let t = check_target(targets[r], v)?;
            let (max, sum) = max_and_exp_sum(row, &mut scratch);
            let lse = T::from_f64(sum.to_f64().ln());
            *loss = lse - (row[t] - max);
            if smoothing != 0.0 {
                // Relative to the max, like lse: lse − (1 − ε)(x_t − max) − ε(mean − max).
                let mean = T::sum_slice(row) * inv_v - max;
                *loss = lse - keep * (row[t] - max) - spread * mean;
            }
        }
        Ok(())
    })?;
    Ok(out)
}

impl CustomOp2 for CrossEntropyRows {
    fn name(&self) -> &'static str {
        "cross-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, v) = rows_and_vocab(l1, &[l2], self.name())?;
        let name = self.name();
        let CpuStorage::U32(t) = s2 else {
            bail!("cross-entropy: targets must be u32");
        };
        let t = slice(t, l2, name)?;
        let out = float_kernel!(name; x = (s1, l1) => ce_rows(x, t, v, self.smoothing)?);
        Ok((out, Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        rows_and_vocab(l1, &[l2], self.name())?;
        if self.smoothing != 0.0 {
            // `smoothed_cross_entropy` sends smoothed losses on a GPU to the primitive path.
            bail!("cross-entropy: the CUDA kernel has no label smoothing");
        }
        super::cuda::cross_entropy(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = grad_res.contiguous()?; // (N,)
        let backward = CrossEntropyBackward {
            smoothing: self.smoothing,
        };
        let dx = logits.apply_op3_no_bwd(targets, &g, &backward)?; // (N, V)
        Ok((Some(dx), None))
    }
}

/// d loss_n / d x_n = g_n · (softmax(x_n) − (1 − ε)·onehot(target_n) − ε/V).
#[derive(Debug, Clone, Copy)]
struct CrossEntropyBackward {
    smoothing: f64,
}

fn ce_backward_rows<T: Real>(
    x: &[T],
    targets: &[u32],
    g: &[T],
    v: usize,
    smoothing: f64,
) -> Result<Vec<T>> {
    let n = targets.len();
    let keep = T::from_f64(1.0 - smoothing);
    let spread = T::from_f64(smoothing / v as f64);
    let work = n.div_ceil(BLOCK_ROWS) * BLOCK_ROWS * v;
    let out = filled_by_chunks(x.len(), BLOCK_ROWS * v, work, |blk, rows| {
        for (i, d) in rows.chunks_mut(v).enumerate() {
            let r = blk * BLOCK_ROWS + i;
            let t = check_target(targets[r], v)?;
            // d holds exp(x − max) after this; softmax = that / its sum.
            let (_, sum) = max_and_exp_sum(&x[r * v..(r + 1) * v], d);
            let scale = g[r] / sum;
            if smoothing == 0.0 {
                for di in d.iter_mut() {
                    *di *= scale;
                }
                d[t] -= g[r];
            } else {
                let uniform = g[r] * spread;
                for di in d.iter_mut() {
                    *di = *di * scale - uniform;
                }
                d[t] -= g[r] * keep;
            }
        }
        Ok(())
    })?;
    Ok(out)
}

impl CustomOp3 for CrossEntropyBackward {
    fn name(&self) -> &'static str {
        "cross-entropy-backward"
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
        let (_, v) = rows_and_vocab(l1, &[l2, l3], self.name())?;
        let name = self.name();
        let CpuStorage::U32(t) = s2 else {
            bail!("cross-entropy-backward: targets must be u32");
        };
        let t = slice(t, l2, name)?;
        let out = float_kernel!(name; x = (s1, l1), g = (s3, l3) => ce_backward_rows(x, t, g, v, self.smoothing)?);
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        rows_and_vocab(l1, &[l2, l3], self.name())?;
        if self.smoothing != 0.0 {
            bail!("cross-entropy-backward: the CUDA kernel has no label smoothing");
        }
        super::cuda::cross_entropy_backward((s1, l1), (s2, l2), (s3, l3))
    }
}
