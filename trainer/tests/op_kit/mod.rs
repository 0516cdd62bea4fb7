//! Shared helpers of the op tests: deterministic inputs, finite-difference gradient checks,
//! autograd gradients and exact (bit) comparisons.

#![allow(dead_code)] // each test crate uses part of the kit

use candle_core::{DType, Device, Result, Tensor, Var};

/// Deterministic, non-trivial values in roughly [-2, 2].
pub fn values(shape: &[usize], dtype: DType, phase: f64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let j = Tensor::arange(0u32, n as u32, &Device::Cpu)?.to_dtype(DType::F64)?;
    ((j * 0.61)? + phase)?
        .sin()?
        .affine(2.0, 0.0)?
        .reshape(shape)?
        .to_dtype(dtype)
}

/// max |a − b|, taken in f64 (so tensors of different dtypes compare).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    (a.to_dtype(DType::F64)? - b.to_dtype(DType::F64)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar()
}

/// Central finite differences of sum(w ⊙ f(x)) for every entry of x, against autograd.
pub fn check_gradient(f: impl Fn(&Tensor) -> Result<Tensor>, shape: &[usize]) -> Result<f64> {
    let x = Var::from_tensor(&values(shape, DType::F64, 0.3)?)?;
    // Weights on the output, which may be bigger than x (a bias or norm gain).
    let w = values(f(x.as_tensor())?.dims(), DType::F64, 1.7)?;
    let objective = |x: &Tensor| -> Result<f64> { (f(x)? * &w)?.sum_all()?.to_scalar() };
    let grads = objective_tensor(&f, x.as_tensor(), &w)?.backward()?;
    let analytic: Vec<f64> = grads
        .get(x.as_tensor())
        .expect("x has a gradient")
        .flatten_all()?
        .to_vec1()?;
    let base: Vec<f64> = x.as_tensor().flatten_all()?.to_vec1()?;
    let h = 1e-6;
    let mut worst: f64 = 0.0;
    for i in 0..base.len() {
        let mut bumped = base.clone();
        bumped[i] = base[i] + h;
        let plus = objective(&Tensor::from_vec(bumped.clone(), shape, &Device::Cpu)?)?;
        bumped[i] = base[i] - h;
        let minus = objective(&Tensor::from_vec(bumped, shape, &Device::Cpu)?)?;
        let numeric = (plus - minus) / (2.0 * h);
        worst = worst.max((numeric - analytic[i]).abs() / (1.0 + numeric.abs()));
    }
    Ok(worst)
}

pub fn objective_tensor(
    f: &impl Fn(&Tensor) -> Result<Tensor>,
    x: &Tensor,
    w: &Tensor,
) -> Result<Tensor> {
    (f(x)? * w)?.sum_all()
}

/// Autograd gradient of sum(w ⊙ f(x)) with respect to x.
pub fn autograd(f: impl Fn(&Tensor) -> Result<Tensor>, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let x = Var::from_tensor(x)?;
    let grads = (f(x.as_tensor())? * w)?.sum_all()?.backward()?;
    Ok(grads.get(x.as_tensor()).expect("x has a gradient").clone())
}

/// The bits of an f32 tensor, for comparisons that must be exact.
pub fn bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.flatten_all()?
        .to_vec1::<f32>()?
        .into_iter()
        .map(f32::to_bits)
        .collect())
}

/// An op of (x, W, b).
pub type Op3<'a> = &'a dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;

/// The dims and bits of `op(x, w, b)`, and the bits of the gradients of Σ op(..)·g with respect
/// to x, w and b.
pub fn output_and_grads(
    op: Op3,
    [x, w, b]: [&Tensor; 3],
    g: &Tensor,
) -> Result<(Vec<usize>, Vec<Vec<u32>>)> {
    outputs_and_grads(&|t| op(&t[0], &t[1], &t[2]), &[x, w, b], g)
}

/// The dims and bits of `op(inputs)`, and the bits of the gradients of Σ op(..)·g with respect
/// to each input, in order.
pub fn outputs_and_grads(
    op: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[&Tensor],
    g: &Tensor,
) -> Result<(Vec<usize>, Vec<Vec<u32>>)> {
    let vars = inputs
        .iter()
        .map(|t| Var::from_tensor(t))
        .collect::<Result<Vec<_>>>()?;
    let tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let y = op(&tensors)?;
    let grads = (&y * g)?.sum_all()?.backward()?;
    let mut out = vec![bits(&y)?];
    for v in &vars {
        out.push(bits(grads.get(v.as_tensor()).expect("gradient"))?);
    }
    Ok((y.dims().to_vec(), out))
}
