//! The linear layer, y = x·Wᵀ + b, with W (out, in) in PyTorch's layout.
//!
//! From candle primitives a linear layer is a transposed view of W, a matmul, a bias add and,
//! in the backward, a transposed weight gradient that candle accumulates into W's gradient with
//! a strided add; each edge also costs a zeroed buffer and an add. The fused CPU op's forward
//! is one GEMM that starts from the bias, and its backward two GEMMs on strided views
//! (dx = g·W, dW = gᵀ·x) plus a row sum for the bias. Rows are split into about one block per
//! thread, with a single-threaded GEMM inside each (see `gemm`).

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};

use super::bias::{add_bias, sum_rows};
use super::gemm::View;
use super::products::{summed_by, written_by, Product};
use super::real::{float_kernel, Real, Stash};
use super::residual::{Op3Step, Step};
use super::CudaKernel;

/// x (.., in) · weight (out, in)ᵀ [+ bias (out,)] → (.., out), as one (N, in) product over the
/// flattened leading dims. Fused on CPU in f32 and f64; under bf16 autocast on a GPU, one cuBLAS
/// product from bf16 casts into an f32 output holding the bias (`cuda::linear`); elsewhere a
/// matmul in the scope's precision plus `add_bias`.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if super::autocast::is_active() && super::use_cuda_kernel(x, CudaKernel::Linear) {
        // bf16 is the only reduced precision autocast has. The op takes the leading dims as
        // they are: every reshape here would be one more graph node, and candle's backward
        // zero-fills and adds a whole gradient buffer for each.
        return bf16_linear_on_gpu(x, weight, bias); // (.., out)
    }
    if super::use_fused(x) && !super::autocast::is_active() {
        // The fused op takes the leading dims as they are, for the same reason.
        return fused_linear(x, weight, bias); // (.., out)
    }
    let mut shape = x.dims().to_vec();
    let in_dim = shape.pop().unwrap_or(1);
    shape.push(weight.dim(0)?);
    let x2 = x.reshape(((), in_dim))?; // (N, in)
    let y = {
        let y = super::autocast::matmul(&x2, &weight.t()?)?; // (N, out)
        match bias {
            Some(b) => add_bias(&y, b)?,
            None => y,
        }
    };
    y.reshape(shape) // (.., out)
}

#[cfg(feature = "cuda")]
fn bf16_linear_on_gpu(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    super::cuda::linear::bf16_linear(x, weight, bias)
}

#[cfg(not(feature = "cuda"))]
fn bf16_linear_on_gpu(_: &Tensor, _: &Tensor, _: Option<&Tensor>) -> Result<Tensor> {
    bail!("linear: this build has no CUDA kernels") // `use_cuda_kernel` is false without them
}

/// tanh-GELU(x·Wᵀ + b): the first layer of a GELU MLP. On the fused CPU path this is one graph
/// node instead of a linear layer and a GELU, so candle's backward zero-fills and adds one
/// gradient buffer less, the widest of the block (.., d_ff); elsewhere it is the two ops.
/// Same values and gradients either way (the same kernels run in the same order).
pub fn linear_gelu(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    match bias {
        Some(b) if super::use_fused(x) && !super::autocast::is_active() => {
            x.contiguous()?.apply_op3(
                &weight.contiguous()?,
                &b.contiguous()?,
                LinearGelu::default(),
            )
        } // (.., out)
        _ => super::gelu_tanh(&linear(x, weight, bias)?),
    }
}

/// The fused CPU path of `linear` for x (.., in): fused forward and backward, on any leading
/// dims (no reshape nodes, whose backward would each zero-fill and add a gradient buffer).
pub fn fused_linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let x = x.contiguous()?;
    let weight = weight.contiguous()?;
    match bias {
        Some(b) => x.apply_op3(&weight, &b.contiguous()?, LinearBias),
        None => x.apply_op2(&weight, LinearNoBias),
    }
}

/// x·Wᵀ + b as a step of a residual branch (`residual`): the fused CPU op, outside the graph.
pub fn linear_step(weight: &Tensor, bias: &Tensor) -> Result<Box<dyn Step>> {
    Op3Step::boxed(LinearBias, weight, bias)
}

/// out (rows, cols) = lhs (rows, k) · rhs (k, cols) [+ bias on every row], in a few blocks of
/// rows per thread (`row_blocks`, at least 16 rows each), each block one single-threaded GEMM
/// (starting from the bias when there is one).
fn product_by_row_blocks<T: Real>(
    dims: (usize, usize, usize),
    lhs: &[T],
    lv: View,
    rhs: &[T],
    rv: View,
    bias: Option<&[T]>,
) -> Result<Vec<T>> {
    // Not zeroed: every block writes all of its rows (the GEMM overwrites when there is no
    // bias), and only through raw pointers, before `set_len` in `written_by`.
    let (rows, cols, _) = dims;
    let product = Product {
        dims,
        off: 0,
        lhs,
        lv,
        rhs,
        rv,
        bias,
    };
    // SAFETY: the one product covers rows 0..rows of cols values, all of the buffer.
    unsafe { written_by(rows * cols, &[product]) }
}

/// y (n, out) = x (n, in) · Wᵀ [+ b], W (out, in).
pub(crate) fn forward<T: Real>(
    x: &[T],
    w: &[T],
    b: Option<&[T]>,
    (n, d_in, d_out): (usize, usize, usize),
) -> Result<Vec<T>> {
    let wt = View::rows(0, d_in).transposed();
    product_by_row_blocks((n, d_out, d_in), x, View::rows(0, d_in), w, wt, b)
}

/// dx (n, in) = g (n, out) · W (out, in).
fn grad_input<T: Real>(
    g: &[T],
    w: &[T],
    (n, d_in, d_out): (usize, usize, usize),
) -> Result<Vec<T>> {
    product_by_row_blocks(
        (n, d_in, d_out),
        g,
        View::rows(0, d_out),
        w,
        View::rows(0, d_in),
        None,
    )
}

/// dW (out, in) = gᵀ (out, n) · x (n, in), summed over the n rows in chunks
/// (`summed_products_into`).
fn grad_weight<T: Real>(
    g: &[T],
    x: &[T],
    (n, d_in, d_out): (usize, usize, usize),
) -> Result<Vec<T>> {
    let product = Product {
        dims: (d_out, d_in, n),
        off: 0,
        lhs: g,
        lv: View::rows(0, d_out).transposed(),
        rhs: x,
        rv: View::rows(0, d_in),
        bias: None,
    };
    // SAFETY: the one product covers all d_out × d_in values.
    unsafe { summed_by(d_out * d_in, &[product]) }
}

/// A tensor of shape (.., c) as a matrix (n, c): its leading dims taken as one.
pub(crate) fn as_rows(layout: &Layout) -> Result<(usize, usize)> {
    match layout.dims().split_last() {
        Some((&c, leading)) => Ok((leading.iter().product(), c)),
        None => bail!("a matrix of rows needs at least one dimension, not a scalar"),
    }
}

/// `dims` with its last dimension replaced by `last`.
pub(crate) fn with_last(dims: &[usize], last: usize) -> Shape {
    let mut dims = dims.to_vec();
    if let Some(d) = dims.last_mut() {
        *d = last;
    }
    Shape::from(dims)
}

/// `check`, and a bias of `out` values.
fn check_with_bias(
    name: &str,
    x: &Layout,
    w: &Layout,
    b: &Layout,
) -> Result<(usize, usize, usize)> {
    let (n, d_in, d_out) = check(name, x, w)?;
    if b.dims() != [d_out] {
        bail!("{name}: bias {:?} for {d_out} outputs", b.dims());
    }
    Ok((n, d_in, d_out))
}

/// dx and dW of y = x·Wᵀ [+ b] from g = dL/dy (.., out); db, where there is a bias, is
/// `sum_rows(g)`. Shared by every op that ends in a linear layer.
pub(crate) fn input_and_weight_grads(
    g: &Tensor,
    x: &Tensor,
    w: &Tensor,
) -> Result<(Tensor, Tensor)> {
    Ok((
        g.apply_op2_no_bwd(w, &GradInput)?,
        g.apply_op2_no_bwd(x, &GradWeight)?,
    ))
}

/// (n, in) and (out, in) shapes of a call, checked against each other; x may have any leading
/// dims.
fn check(name: &str, x: &Layout, w: &Layout) -> Result<(usize, usize, usize)> {
    let (n, d_in) = as_rows(x)?;
    let (d_out, w_in) = w.shape().dims2()?;
    if w_in != d_in {
        bail!(
            "{name}: weight {:?} does not match input {:?}",
            w.dims(),
            x.dims()
        );
    }
    Ok((n, d_in, d_out))
}

/// x·Wᵀ + b.
#[derive(Debug, Clone, Copy)]
struct LinearBias;

impl CustomOp3 for LinearBias {
    fn name(&self) -> &'static str {
        "linear"
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
        let (n, d_in, d_out) = check_with_bias(name, l1, l2, l3)?;
        let out = float_kernel!(name; x = (s1, l1), w = (s2, l2), b = (s3, l3) => forward(x, w, Some(b), (n, d_in, d_out))?);
        Ok((out, with_last(l1.dims(), d_out)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = grad.contiguous()?; // (.., out)
        let (dx, dw) = input_and_weight_grads(&g, x, w)?;
        Ok((Some(dx), Some(dw), Some(sum_rows(&g)?)))
    }
}

/// x·Wᵀ.
#[derive(Debug, Clone, Copy)]
struct LinearNoBias;

impl CustomOp2 for LinearNoBias {
    fn name(&self) -> &'static str {
        "linear-no-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let name = self.name();
        let (n, d_in, d_out) = check(name, l1, l2)?;
        let out = float_kernel!(name; x = (s1, l1), w = (s2, l2) => forward(x, w, None, (n, d_in, d_out))?);
        Ok((out, with_last(l1.dims(), d_out)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = input_and_weight_grads(&grad.contiguous()?, x, w)?;
        Ok((Some(dx), Some(dw)))
    }
}

/// (g (n, out), W (out, in)) → dx (n, in).
struct GradInput;

impl CustomOp2 for GradInput {
    fn name(&self) -> &'static str {
        "linear-grad-input"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let name = self.name();
        let (n, d_out) = as_rows(l1)?;
        let (w_out, d_in) = l2.shape().dims2()?;
        if w_out != d_out {
            bail!(
                "{name}: gradient {:?} for weight {:?}",
                l1.dims(),
                l2.dims()
            );
        }
        let out =
            float_kernel!(name; g = (s1, l1), w = (s2, l2) => grad_input(g, w, (n, d_in, d_out))?);
        Ok((out, with_last(l1.dims(), d_in)))
    }
}

/// (g (n, out), x (n, in)) → dW (out, in).
struct GradWeight;

impl CustomOp2 for GradWeight {
    fn name(&self) -> &'static str {
        "linear-grad-weight"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let name = self.name();
        let (n, d_out) = as_rows(l1)?;
        let (x_n, d_in) = as_rows(l2)?;
        if x_n != n {
            bail!("{name}: gradient {:?} for input {:?}", l1.dims(), l2.dims());
        }
        let out =
            float_kernel!(name; g = (s1, l1), x = (s2, l2) => grad_weight(g, x, (n, d_in, d_out))?);
        Ok((out, Shape::from((d_out, d_in))))
    }
}

/// gelu(x·Wᵀ + b) as one op.
#[derive(Clone, Default)]
struct LinearGelu {
    /// The GELU's derivative at the forward's pre-activation x·Wᵀ + b, for the backward
    /// (`gelu_keeping`).
    gelu_grad: Stash,
}

impl std::fmt::Debug for LinearGelu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinearGelu")
    }
}

impl LinearGelu {
    fn forward<T: Real>(
        &self,
        x: &[T],
        w: &[T],
        b: &[T],
        dims: (usize, usize, usize),
    ) -> Result<Vec<T>> {
        gelu_keeping(forward(x, w, Some(b), dims)?, &self.gelu_grad)
    }
}

impl CustomOp3 for LinearGelu {
    fn name(&self) -> &'static str {
        "linear-gelu"
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
        let (n, d_in, d_out) = check_with_bias(name, l1, l2, l3)?;
        let out = float_kernel!(name; x = (s1, l1), w = (s2, l2), b = (s3, l3) => self.forward(x, w, b, (n, d_in, d_out))?);
        Ok((out, with_last(l1.dims(), d_out)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // d(pre) = g · gelu'(pre), then the linear layer's backward from it.
        let g = grad.contiguous()?; // (.., out)
        let dpre = g.apply_op1_no_bwd(&GeluGradOfStash::new(&self.gelu_grad))?;
        let (dx, dw) = input_and_weight_grads(&dpre, x, w)?;
        Ok((Some(dx), Some(dw), Some(sum_rows(&dpre)?)))
    }
}

/// gelu(pre), keeping gelu'(pre) in `stash` for the backward (`GeluGradOfStash`): computed
/// beside the GELU, which shares its exp and division, into pre's own buffer.
pub(crate) fn gelu_keeping<T: Real>(mut pre: Vec<T>, stash: &Stash) -> Result<Vec<T>> {
    let y = super::gelu::gelu_and_grad_rows(&mut pre)?;
    stash.keep(pre);
    Ok(y)
}

/// g → g · gelu'(pre), with gelu'(pre) from the stash of the `LinearGelu` (or grouped)
/// forward.
pub(crate) struct GeluGradOfStash {
    gelu_grad: Stash,
}

impl GeluGradOfStash {
    pub(crate) fn new(gelu_grad: &Stash) -> Self {
        GeluGradOfStash {
            gelu_grad: gelu_grad.clone(),
        }
    }

    fn grad<T: Real>(&self, g: &[T]) -> Result<Vec<T>> {
        self.gelu_grad.with("linear-gelu", |gelu_grad: &[T]| {
            if gelu_grad.len() != g.len() {
                bail!(
                    "linear-gelu: gradient of {} values for {}",
                    g.len(),
                    gelu_grad.len()
                );
            }
            super::gelu::product_rows(g, gelu_grad)
        })
    }
}

impl CustomOp1 for GeluGradOfStash {
    fn name(&self) -> &'static str {
        "linear-gelu-grad"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = float_kernel!(self.name(); g = (storage, layout) => self.grad(g)?);
        Ok((out, layout.shape().clone()))
    }
}
