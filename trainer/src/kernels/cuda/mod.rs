//! The CUDA side of the fused ops: launches the kernels of `kernels.cu` (compiled to PTX by
//! `build.rs`, loaded once per device) for the ops' `cuda_fwd`, and the optimizer's in-place
//! AdamW and gradient-norm kernels, and (`linear`) the bf16 linear layer on cuBLAS. Every entry
//! point takes contiguous f32 storage (the ops make
//! their inputs contiguous; [`super::use_cuda_kernel`] routes only f32 here, and says which
//! kernels `TRAINYARD_CUDA_KERNELS` switches on).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    sys, CudaSlice, CudaView, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::op::BackpropOp;
use half::bf16;

use candle_core::{
    bail, CudaDevice, CudaStorage, DType, Device, Layout, Result, Shape, Storage, Tensor,
};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/trainyard_kernels.ptx"));
const MODULE: &str = "trainyard";

/// Keeps freed GPU memory in the CUDA memory pool instead of returning it to the driver at every
/// synchronisation (the pool's default release threshold is 0): candle allocates every
/// intermediate with `cuMemAllocAsync`, and a step frees and reallocates gigabytes.
pub fn keep_freed_memory(dev: &Device) -> Result<()> {
    let Device::Cuda(cuda) = dev else {
        return Ok(());
    };
    let cu_device = cuda.cuda_stream().context().cu_device();
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold: u64 = u64::MAX;
    // SAFETY: plain driver calls on a live context's device; `threshold` outlives the call.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, cu_device)
            .result()
            .w()?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .w()?;
    }
    Ok(())
}

/// Stops cudarc from creating two CUDA events with every buffer it allocates (and destroying
/// them when the buffer is freed). The events order a buffer's uses across streams; the trainer
/// issues all its work on the device's one stream, where cudarc never records them, so they are
/// only host time on each of the thousands of allocations of a step. Buffers allocated before
/// the call keep theirs. `TRAINYARD_CUDA_EVENTS=1` keeps them (for measuring the difference).
pub fn skip_stream_events(dev: &Device) {
    let Device::Cuda(cuda) = dev else {
        return;
    };
    if std::env::var("TRAINYARD_CUDA_EVENTS").is_ok_and(|v| v == "1") {
        return;
    }
    // SAFETY: cudarc's events only synchronise one buffer's uses on several streams; every
    // kernel, copy and free of the trainer goes to this device's single stream, in order.
    unsafe { cuda.disable_event_tracking() }
}

/// The most memory the device's pool has had in use since the program started, in bytes
/// (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`: every tensor candle allocates comes from this pool; cuBLAS's
/// workspace and the loaded kernels do not). `None` on the CPU.
pub fn peak_pool_bytes(dev: &Device) -> Result<Option<u64>> {
    let Device::Cuda(cuda) = dev else {
        return Ok(None);
    };
    let cu_device = cuda.cuda_stream().context().cu_device();
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut high: u64 = 0;
    // SAFETY: plain driver queries; `high` outlives the call.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, cu_device)
            .result()
            .w()?;
        sys::cuMemPoolGetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            (&mut high as *mut u64).cast(),
        )
        .result()
        .w()?;
    }
    Ok(Some(high))
}

/// The contiguous elements of `s` that `l` describes.
fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout, op: &str) -> Result<CudaView<'a, T>> {
    let Some((start, end)) = l.contiguous_offsets() else {
        bail!("{op}: the CUDA kernel needs a contiguous tensor");
    };
    Ok(s.as_cuda_slice::<T>()?.slice(start..end))
}

fn output(dev: &CudaDevice, len: usize) -> Result<CudaSlice<f32>> {
    // SAFETY: every element is written by the kernel that receives it.
    unsafe { dev.alloc::<f32>(len) }
}

/// Threads per block for a row of `cols` elements: about 4 per thread, 32 to 1024.
fn row_threads(cols: usize) -> u32 {
    (cols.div_ceil(4).next_power_of_two()).clamp(32, 1024) as u32
}

fn rows_cfg(rows: usize, cols: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (row_threads(cols), 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A grid-stride launch over `n` elements.
fn elementwise_cfg(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 132 * 16);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Runs kernel `name` with `cfg`; `args` pushes its arguments in order.
macro_rules! launch {
    ($dev:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let func = $dev.get_or_load_custom_func($name, MODULE, PTX)?;
        let mut builder = func.builder();
        // `let` keeps temporaries such as `&(n as u64)` alive until the launch.
        $(let arg = $arg; builder.arg(arg);)+
        // SAFETY: the argument list matches the kernel's signature in kernels.cu, and every
        // pointer covers the elements the launch configuration lets the kernel touch.
        unsafe { builder.launch($cfg) }.w()?;
    }};
}

fn wrap(slice: CudaSlice<f32>, dev: &CudaDevice, shape: impl Into<Shape>) -> (CudaStorage, Shape) {
    (
        CudaStorage::wrap_cuda_slice(slice, dev.clone()),
        shape.into(),
    )
}

/// tanh-GELU of every element.
pub fn gelu(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let dev = s.device();
    let x = view::<f32>(s, l, "gelu-tanh")?;
    let n = l.shape().elem_count();
    let out = output(dev, n)?;
    launch!(
        dev,
        "ty_gelu_fwd_f32",
        elementwise_cfg(n),
        &x,
        &out,
        &(n as u64)
    );
    Ok(wrap(out, dev, l.shape().clone()))
}

/// dx of tanh-GELU from x and the output gradient.
pub fn gelu_backward(
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device();
    let (x, g) = (
        view::<f32>(s1, l1, "gelu-backward")?,
        view::<f32>(s2, l2, "gelu-backward")?,
    );
    let n = l1.shape().elem_count();
    let out = output(dev, n)?;
    launch!(
        dev,
        "ty_gelu_bwd_f32",
        elementwise_cfg(n),
        &x,
        &g,
        &out,
        &(n as u64)
    );
    Ok(wrap(out, dev, l1.shape().clone()))
}

/// Per-row losses of (N, V) logits against (N,) u32 targets.
pub fn cross_entropy(
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device();
    let (n, v) = l1.shape().dims2()?;
    let x = view::<f32>(s1, l1, "cross-entropy")?;
    let t = view::<u32>(s2, l2, "cross-entropy")?;
    let out = output(dev, n)?;
    launch!(
        dev,
        "ty_ce_fwd_f32",
        rows_cfg(n, v),
        &x,
        &t,
        &out,
        &(v as u64)
    );
    Ok(wrap(out, dev, n))
}

/// d loss / d logits for (N, V) logits, (N,) targets and (N,) loss gradients.
pub fn cross_entropy_backward(
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device();
    let (n, v) = l1.shape().dims2()?;
    let x = view::<f32>(s1, l1, "cross-entropy-backward")?;
    let t = view::<u32>(s2, l2, "cross-entropy-backward")?;
    let g = view::<f32>(s3, l3, "cross-entropy-backward")?;
    let out = output(dev, n * v)?;
    launch!(
        dev,
        "ty_ce_bwd_f32",
        rows_cfg(n, v),
        &x,
        &t,
        &g,
        &out,
        &(v as u64)
    );
    Ok(wrap(out, dev, (n, v)))
}

/// Causally masked softmax of (.., T, T) scores times `scale`, f32 or bf16 (f32 arithmetic).
pub fn causal_softmax(s: &CudaStorage, l: &Layout, scale: f64) -> Result<(CudaStorage, Shape)> {
    let dev = s.device();
    let t = l.dims().last().copied().unwrap_or(1);
    let n = l.shape().elem_count();
    let cfg = rows_cfg(n / t.max(1), t);
    let (t64, scale) = (t as u64, scale as f32);
    let out = match s.dtype() {
        DType::F32 => {
            let x = view::<f32>(s, l, "causal-softmax")?;
            let out = output(dev, n)?;
            launch!(
                dev,
                "ty_causal_softmax_fwd_f32",
                cfg,
                &x,
                &out,
                &t64,
                &scale
            );
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        }
        DType::BF16 => {
            let x = view::<bf16>(s, l, "causal-softmax")?;
            // SAFETY: the kernel writes every element.
            let out = unsafe { dev.alloc::<bf16>(n) }?;
            launch!(
                dev,
                "ty_causal_softmax_fwd_bf16",
                cfg,
                &x,
                &out,
                &t64,
                &scale
            );
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        }
        other => bail!("causal-softmax: no CUDA kernel for {other:?}"),
    };
    Ok((out, l.shape().clone()))
}

/// Softmax backward per row of the last dim, from the output y and its gradient g (both f32 or
/// both bf16).
pub fn softmax_backward(
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
    scale: f64,
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device();
    let cols = l1.dims().last().copied().unwrap_or(1);
    let n = l1.shape().elem_count();
    let cfg = rows_cfg(n / cols.max(1), cols);
    let (c64, scale) = (cols as u64, scale as f32);
    let out = match (s1.dtype(), s2.dtype()) {
        (DType::F32, DType::F32) => {
            let y = view::<f32>(s1, l1, "softmax-backward")?;
            let g = view::<f32>(s2, l2, "softmax-backward")?;
            let out = output(dev, n)?;
            launch!(dev, "ty_softmax_bwd_f32", cfg, &y, &g, &out, &c64, &scale);
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        }
        (DType::BF16, DType::BF16) => {
            let y = view::<bf16>(s1, l1, "softmax-backward")?;
            let g = view::<bf16>(s2, l2, "softmax-backward")?;
            // SAFETY: the kernel writes every element.
            let out = unsafe { dev.alloc::<bf16>(n) }?;
            launch!(dev, "ty_softmax_bwd_bf16", cfg, &y, &g, &out, &c64, &scale);
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        }
        (a, b) => bail!("softmax-backward: no CUDA kernel for {a:?} and {b:?}"),
    };
    Ok((out, l1.shape().clone()))
}

/// LayerNorm of (N, C) rows with weight and bias (C,).
pub fn layer_norm(
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
    eps: f64,
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device();
    let (n, c) = l1.shape().dims2()?;
    let x = view::<f32>(s1, l1, "layer-norm")?;
    let w = view::<f32>(s2, l2, "layer-norm")?;
    let b = view::<f32>(s3, l3, "layer-norm")?;
    let out = output(dev, n * c)?;
    let cfg = rows_cfg(n, c);
    launch!(
        dev,
        "ty_layer_norm_fwd_f32",
        cfg,
        &x,
        &w,
        &b,
        &out,
        &(c as u64),
        &(eps as f32)
    );
    Ok(wrap(out, dev, (n, c)))
}

/// Columns one thread of the LayerNorm backward owns (`LN_MAX_COLS_PER_THREAD` in kernels.cu).
const LN_MAX_COLS_PER_THREAD: usize = 16;
/// Warps per block and columns per lane of the one-warp-per-row LayerNorm backward
/// (`LN_WARPS`, `LN_WARP_MAX_COLS` in kernels.cu).
const LN_WARPS: usize = 8;
const LN_WARP_MAX_COLS: usize = 32;
/// Rows per block of the LayerNorm backward: enough blocks to fill an H100 at 8 × 1024 rows,
/// few enough partial column sums to add afterwards.
const LN_ROWS_PER_BLOCK: usize = 32;

/// LayerNorm backward from x (N, C), weight (C,) and the output gradient (N, C), packed as
/// (N + 2, C): dx rows, then dweight, then dbias (as the CPU op).
pub fn layer_norm_backward(
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
    eps: f64,
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device();
    let (n, c) = l1.shape().dims2()?;
    // One warp per row where a lane can hold its columns in registers (`..._warp_f32`).
    let by_warps = c <= 32 * LN_WARP_MAX_COLS;
    let threads = if by_warps {
        32 * LN_WARPS
    } else {
        c.div_ceil(LN_MAX_COLS_PER_THREAD)
            .next_multiple_of(32)
            .clamp(128, 1024)
    };
    if c > threads * LN_MAX_COLS_PER_THREAD {
        bail!("layer-norm-backward: {c} columns is more than the CUDA kernel handles");
    }
    let x = view::<f32>(s1, l1, "layer-norm-backward")?;
    let w = view::<f32>(s2, l2, "layer-norm-backward")?;
    let g = view::<f32>(s3, l3, "layer-norm-backward")?;
    let blocks = n.div_ceil(LN_ROWS_PER_BLOCK).max(1);
    let out = output(dev, (n + 2) * c)?;
    let partial = output(dev, blocks * 2 * c)?;
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (rows, cols, per_block) = (n as u64, c as u64, LN_ROWS_PER_BLOCK as u64);
    let (dx, sums) = (out.slice(0..n * c), out.slice(n * c..(n + 2) * c));
    let kernel = if by_warps {
        "ty_layer_norm_bwd_warp_f32"
    } else {
        "ty_layer_norm_bwd_f32"
    };
    launch!(
        dev,
        kernel,
        cfg,
        &x,
        &w,
        &g,
        &dx,
        &partial,
        &rows,
        &cols,
        &per_block,
        &(eps as f32)
    );
    let width = 2 * c;
    launch!(
        dev,
        "ty_column_sums_f32",
        elementwise_cfg(width),
        &partial,
        &sums,
        &(blocks as u64),
        &(width as u64)
    );
    drop((dx, sums));
    Ok(wrap(out, dev, (n + 2, c)))
}

/// `table` (R, D) rows picked by u32 `ids` (M,) → (M, D).
pub fn gather_rows(
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device();
    let (r, d) = l1.shape().dims2()?;
    let m = l2.shape().elem_count();
    let table = view::<f32>(s1, l1, "gather-rows")?;
    let ids = view::<u32>(s2, l2, "gather-rows")?;
    let out = output(dev, m * d)?;
    let (m64, d64, r64) = (m as u64, d as u64, r as u64);
    launch!(
        dev,
        "ty_gather_rows_f32",
        elementwise_cfg(m * d),
        &table,
        &ids,
        &out,
        &m64,
        &d64,
        &r64
    );
    Ok(wrap(out, dev, (m, d)))
}

/// `src` (M, D) rows added into a zero (rows, D) at u32 `ids` (M,).
pub fn scatter_add_rows(
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
    rows: usize,
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device();
    let (m, d) = l1.shape().dims2()?;
    let src = view::<f32>(s1, l1, "scatter-add-rows")?;
    let ids = view::<u32>(s2, l2, "scatter-add-rows")?;
    let out = dev.alloc_zeros::<f32>(rows * d)?;
    let (m64, d64, r64) = (m as u64, d as u64, rows as u64);
    launch!(
        dev,
        "ty_scatter_add_rows_f32",
        elementwise_cfg(m * d),
        &src,
        &ids,
        &out,
        &m64,
        &d64,
        &r64
    );
    Ok(wrap(out, dev, (rows, d)))
}

/// The CUDA storage of a tensor and where its elements start: for the optimizer's in-place
/// kernels, which get their own pointers to parameter and state buffers.
fn f32_view<'a>(storage: &'a Storage, layout: &Layout, what: &str) -> Result<CudaView<'a, f32>> {
    match storage {
        Storage::Cuda(s) => view::<f32>(s, layout, what),
        _ => bail!("{what}: expected a CUDA tensor"),
    }
}

/// AdamW's per-tensor constants for one step.
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// lr / (1 − β1ᵗ)
    pub lr_bc1: f32,
    /// 1 / √(1 − β2ᵗ)
    pub inv_sqrt_bc2: f32,
    /// 1 − lr·weight_decay for decayed tensors, 1 for the others.
    pub shrink: f32,
}

/// One AdamW update of parameter `p` with gradient `g`, moments `m` and `v`, all f32 CUDA
/// tensors of one shape, updated in place (one kernel instead of about ten whole-tensor ops).
pub fn adamw_update(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, k: AdamWStep) -> Result<()> {
    let n = p.elem_count();
    if g.elem_count() != n || m.elem_count() != n || v.elem_count() != n {
        bail!("adamw: parameter, gradient and moments differ in size");
    }
    let g = g.contiguous()?;
    let Device::Cuda(dev) = p.device() else {
        bail!("adamw: expected a CUDA tensor");
    };
    let (ps, pl) = p.storage_and_layout();
    let (gs, gl) = g.storage_and_layout();
    let (ms, ml) = m.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    // The kernel writes p, m and v through these views: in-place updates of buffers that only
    // the optimizer (m, v) and the parameter's Var (p) own, on the device's one stream.
    let p = f32_view(&ps, pl, "adamw")?;
    let g = f32_view(&gs, gl, "adamw")?;
    let m = f32_view(&ms, ml, "adamw")?;
    let v = f32_view(&vs, vl, "adamw")?;
    launch!(
        dev,
        "ty_adamw_f32",
        elementwise_cfg(n),
        &p,
        &g,
        &m,
        &v,
        &(n as u64),
        &k.beta1,
        &k.beta2,
        &k.eps,
        &k.lr_bc1,
        &k.inv_sqrt_bc2,
        &k.shrink
    );
    Ok(())
}

/// Blocks per tensor of the sum of squares (each writes one partial sum).
const NORM_BLOCKS: usize = 128;

/// The global L2 norm of `grads` and the factor clipping to `max_norm` scales them by (see
/// `ty_norm_and_clip_f32`), as a (2,) f32 tensor on the device: nothing is read back.
pub fn norm_and_clip_scale(grads: &[&Tensor], max_norm: f64) -> Result<Tensor> {
    let Some(Device::Cuda(dev)) = grads.first().map(|g| g.device()) else {
        bail!("gradient norm: expected CUDA tensors");
    };
    let partial = dev.alloc_zeros::<f32>(grads.len() * NORM_BLOCKS)?;
    for (i, g) in grads.iter().enumerate() {
        let g = g.contiguous()?;
        let (gs, gl) = g.storage_and_layout();
        let view = f32_view(&gs, gl, "gradient norm")?;
        let n = gl.shape().elem_count();
        let blocks = n.div_ceil(256).clamp(1, NORM_BLOCKS);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let part = partial.slice(i * NORM_BLOCKS..(i + 1) * NORM_BLOCKS);
        launch!(dev, "ty_sum_squares_f32", cfg, &view, &part, &(n as u64));
    }
    let out = output(dev, 2)?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    let total = (grads.len() * NORM_BLOCKS) as u64;
    launch!(
        dev,
        "ty_norm_and_clip_f32",
        cfg,
        &partial,
        &total,
        &(max_norm as f32),
        &out
    );
    Ok(Tensor::from_storage(
        Storage::Cuda(CudaStorage::wrap_cuda_slice(out, dev.clone())),
        2,
        BackpropOp::none(),
        false,
    ))
}

/// Declared after `launch!` so the modules can use it.
pub mod attention;
mod gemm;
pub mod linear;
