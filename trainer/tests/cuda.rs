//! On a GPU: each CUDA kernel against candle's primitive ops on the same device (forward and
//! gradients), the optimizer kernels against the primitive optimizer, and whole training steps on
//! the GPU against the CPU (f32) and bf16 autocast against f32. Built only with the `cuda`
//! feature and run on a machine with an NVIDIA GPU:
//! `cargo test --release --features cuda -p trainyard-trainer --test cuda`.
//!
//! Tolerances: f32 kernels against primitives 1e-5 relative to the values' scale (the same math,
//! different summation order); GPU against CPU training 1e-4 relative on the first step's loss
//! and gradient norm and 2e-3 over ten steps (cuBLAS and the CPU GEMM round differently and
//! AdamW's first steps amplify it); bf16 against f32 within 2% of the loss at every one of 200
//! steps.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Device, Result, Tensor, Var};
use trainer::config::{Config, Precision};
use trainer::kernels::{self, autocast, CausalAttention, CudaKernel, Rope};
use trainer::optim::{self, clip::clip_grad_norm_on_device, Param};
use trainer::train::Trainer;

fn gpu() -> Device {
    Device::new_cuda(0).expect("this test needs an NVIDIA GPU and a `cuda` build")
}

/// Deterministic, non-trivial values in roughly [-2, 2], on `dev`.
fn values(shape: &[usize], phase: f64, dev: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let j = Tensor::arange(0u32, n as u32, &Device::Cpu)?.to_dtype(DType::F64)?;
    ((j * 0.61)? + phase)?
        .sin()?
        .affine(2.0, 0.0)?
        .reshape(shape)?
        .to_dtype(DType::F32)?
        .to_device(dev)
}

/// max |a − b| / max(1, max |b|).
fn rel_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_dtype(DType::F64)?.flatten_all()?;
    let b = b.to_dtype(DType::F64)?.flatten_all()?;
    let diff: f64 = (&a - &b)?.abs()?.max(0)?.to_scalar()?;
    let scale: f64 = b.abs()?.max(0)?.to_scalar()?;
    Ok(diff / scale.max(1.0))
}

/// `f` on the GPU with its CUDA kernel and with primitives only: outputs and the gradients of
/// sum(w ⊙ f) with respect to every input, each within `tol`.
fn check_against_primitives(
    name: &str,
    kernel: CudaKernel,
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    tol: f64,
) {
    let dev = gpu();
    assert!(
        kernels::use_cuda_kernel(&inputs[0], kernel),
        "{name}: the CUDA kernel is not taken"
    );
    let run = |primitives: bool| -> (Tensor, Vec<Tensor>) {
        let _scope = primitives.then(kernels::primitives_only);
        let vars: Vec<Var> = inputs
            .iter()
            .map(|x| Var::from_tensor(x).unwrap())
            .collect();
        let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let y = f(&ts).unwrap();
        let w = values(y.dims(), 1.7, &dev).unwrap();
        let grads = (&y * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let gs = vars
            .iter()
            .map(|v| {
                grads
                    .get(v.as_tensor())
                    .expect("every input gets a gradient")
                    .clone()
            })
            .collect();
        (y, gs)
    };
    let (y_kernel, g_kernel) = run(false);
    let (y_ref, g_ref) = run(true);
    let d = rel_diff(&y_kernel, &y_ref).unwrap();
    assert!(
        d < tol,
        "{name}: forward differs by {d:e} (tolerance {tol:e})"
    );
    for (i, (a, b)) in g_kernel.iter().zip(&g_ref).enumerate() {
        let d = rel_diff(a, b).unwrap();
        assert!(
            d < tol,
            "{name}: gradient of input {i} differs by {d:e} (tolerance {tol:e})"
        );
    }
}

#[test]
fn the_gelu_kernel_matches_candles_primitives() {
    let x = values(&[64, 3072], 0.1, &gpu()).unwrap();
    check_against_primitives(
        "gelu",
        CudaKernel::Gelu,
        &[x],
        |t| kernels::gelu_tanh(&t[0]),
        1e-5,
    );
}

#[test]
fn the_causal_softmax_kernel_matches_candles_primitives() {
    for t in [7usize, 128, 1024] {
        let dev = gpu();
        let x = values(&[3, t, t], 0.2, &dev).unwrap();
        let mask = {
            let m: Vec<f32> = (0..t * t)
                .map(|i| {
                    if i % t > i / t {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            Tensor::from_vec(m, (t, t), &dev).unwrap()
        };
        check_against_primitives(
            &format!("causal softmax, T={t}"),
            CudaKernel::Softmax,
            &[x],
            |a| kernels::causal_softmax(&a[0], 0.125, &mask),
            1e-5,
        );
    }
}

#[test]
fn bf16_attention_with_the_softmax_kernel_matches_the_autocast_primitives() {
    // Under bf16 autocast the kernel path keeps scores and probabilities in bf16; the primitive
    // path casts them to f32 for the softmax. Both round the products to bf16, so they agree to
    // bf16's precision.
    // With rotary positions, which the one-node attention kernel leaves to this path.
    let dev = gpu();
    let (b, t, d, heads) = (2usize, 256usize, 128usize, 4usize);
    let rope = Rope::new(10_000.0, d / heads, t, &dev, DType::F32).unwrap();
    let attn = CausalAttention::new(heads, t, Some(rope), &dev, DType::F32).unwrap();
    let qkv = values(&[b, t, 3 * d], 0.7, &dev)
        .unwrap()
        .affine(0.5, 0.0)
        .unwrap();
    check_against_primitives(
        "bf16 attention",
        CudaKernel::Softmax,
        &[qkv],
        |a| {
            let _bf16 = autocast::autocast(Precision::Bf16);
            attn.forward(&a[0], None::<fn(&Tensor) -> Result<Tensor>>)
        },
        3e-2,
    );
}

#[test]
fn the_bf16_attention_kernel_matches_the_autocast_primitives() {
    // The one-node attention against the primitive path under the same autocast scope: both
    // multiply bf16 q, k, v with f32 accumulation and take the softmax in f32; the primitive
    // path rounds scores, probabilities and outputs differently, so they agree to bf16's
    // precision. A wrong head offset, stride or transpose puts values in the wrong place.
    let dev = gpu();
    for (b, t, heads, hd) in [(2usize, 256usize, 4usize, 32usize), (3, 100, 3, 16)] {
        let d = heads * hd;
        let attn = CausalAttention::new(heads, t, None, &dev, DType::F32).unwrap();
        let qkv = values(&[b, t, 3 * d], 0.4, &dev)
            .unwrap()
            .affine(0.5, 0.0)
            .unwrap();
        check_against_primitives(
            "bf16 attention kernel",
            CudaKernel::Attention,
            &[qkv],
            |a| {
                let _bf16 = autocast::autocast(Precision::Bf16);
                attn.forward(&a[0], None::<fn(&Tensor) -> Result<Tensor>>)
            },
            3e-2,
        );
    }
}

#[test]
fn the_bf16_linear_kernel_matches_the_autocast_primitives() {
    // Both multiply bf16 casts of x and W with f32 accumulation; the primitive path rounds the
    // product (and dx, dW) to bf16 before casting back, the kernel writes f32, so they agree to
    // bf16's precision. Odd sizes catch a transposed operand or a wrong leading dimension.
    let dev = gpu();
    let (n, d_in, d_out) = (300usize, 200usize, 96usize);
    let x = values(&[n, d_in], 0.3, &dev).unwrap();
    let w = values(&[d_out, d_in], 0.9, &dev)
        .unwrap()
        .affine(0.05, 0.0)
        .unwrap();
    let b = values(&[d_out], 1.3, &dev).unwrap();
    check_against_primitives(
        "bf16 linear with bias",
        CudaKernel::Linear,
        &[x.clone(), w.clone(), b],
        |t| {
            let _bf16 = autocast::autocast(Precision::Bf16);
            kernels::linear(&t[0], &t[1], Some(&t[2]))
        },
        1e-2,
    );
    check_against_primitives(
        "bf16 linear without bias",
        CudaKernel::Linear,
        &[x.reshape((3, 100, d_in)).unwrap(), w],
        |t| {
            let _bf16 = autocast::autocast(Precision::Bf16);
            kernels::linear(&t[0], &t[1], None)
        },
        1e-2,
    );
}

#[test]
fn the_cross_entropy_kernel_matches_candles_primitives() {
    for (n, v) in [(37usize, 256usize), (64, 50304)] {
        let dev = gpu();
        let logits = values(&[n, v], 0.3, &dev)
            .unwrap()
            .affine(3.0, 0.0)
            .unwrap();
        let targets: Vec<u32> = (0..n).map(|i| ((i * 7919) % v) as u32).collect();
        let targets = Tensor::from_vec(targets, n, &dev).unwrap();
        check_against_primitives(
            &format!("cross-entropy, V={v}"),
            CudaKernel::CrossEntropy,
            &[logits],
            |a| kernels::cross_entropy(&a[0], &targets),
            1e-5,
        );
    }
}

#[test]
fn the_layer_norm_kernel_matches_candles_primitives() {
    for (n, c) in [(300usize, 768usize), (5, 100), (70, 4096)] {
        let dev = gpu();
        let x = values(&[n, c], 0.4, &dev)
            .unwrap()
            .affine(1.5, 0.3)
            .unwrap();
        let w = values(&[c], 0.5, &dev).unwrap();
        let b = values(&[c], 0.6, &dev).unwrap();
        check_against_primitives(
            &format!("layer norm, C={c}"),
            CudaKernel::LayerNorm,
            &[x, w, b],
            |a| kernels::layer_norm(&a[0], &a[1], Some(&a[2]), 1e-5),
            1e-4,
        );
    }
}

#[test]
fn the_row_gather_and_scatter_kernels_match_index_select_and_index_add() {
    let dev = gpu();
    // Repeated ids: rows gathered several times sum several gradients (atomic adds).
    let ids: Vec<u32> = (0..8192u32).map(|i| (i * 7919) % 1000).collect();
    let ids = Tensor::from_vec(ids, 8192, &dev).unwrap();
    let table = values(&[1000, 768], 0.8, &dev).unwrap();
    check_against_primitives(
        "gather rows",
        CudaKernel::Rows,
        &[table],
        |a| kernels::gather_rows(&a[0], &ids),
        1e-5,
    );
    let base = values(&[1000, 64], 0.9, &dev).unwrap();
    let src = values(&[8192, 64], 1.1, &dev).unwrap();
    check_against_primitives(
        "add rows",
        CudaKernel::Rows,
        &[src, base],
        |a| kernels::add_rows(&a[1], &ids, &a[0]),
        1e-5,
    );
}

fn params(dev: &Device) -> Vec<Param> {
    [
        (vec![768, 3072], true),
        (vec![3072], false),
        (vec![50304, 64], true),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (shape, decay))| Param {
        name: format!("p{i}"),
        var: Var::from_tensor(&values(&shape, i as f64, dev).unwrap()).unwrap(),
        decay,
    })
    .collect()
}

#[test]
fn the_adamw_and_clipping_kernels_match_the_primitive_optimizer() {
    let dev = gpu();
    let mut cfg = Config::from_profile("tiny").unwrap();
    cfg.apply_overrides(&["training.weight_decay=0.1".to_string()])
        .unwrap();
    let run = |primitives: bool| -> (Vec<Tensor>, Vec<f32>) {
        let _scope = primitives.then(kernels::primitives_only);
        let ps = params(&dev);
        let mut opt = optim::build(&cfg.training, ps.clone()).unwrap();
        let mut norms = Vec::new();
        for step in 0..3 {
            let mut grads: Vec<Option<Tensor>> = ps
                .iter()
                .map(|p| Some(values(p.var.dims(), 3.0 + step as f64, &dev).unwrap()))
                .collect();
            // A max norm below the gradients' norm, so clipping scales them.
            let norm = clip_grad_norm_on_device(&mut grads, 50.0).unwrap();
            norms.push(norm.to_scalar::<f32>().unwrap());
            opt.step(&grads, 1e-2).unwrap();
        }
        (
            ps.iter()
                .map(|p| p.var.as_tensor().copy().unwrap())
                .collect(),
            norms,
        )
    };
    let (p_kernel, n_kernel) = run(false);
    let (p_ref, n_ref) = run(true);
    for (a, b) in n_kernel.iter().zip(&n_ref) {
        assert!(*b > 50.0, "the test gradients must be clipped (norm {b})");
        assert!(((a - b) / b).abs() < 1e-5, "gradient norm {a} against {b}");
    }
    for (i, (a, b)) in p_kernel.iter().zip(&p_ref).enumerate() {
        let d = rel_diff(a, b).unwrap();
        assert!(
            d < 1e-5,
            "parameter {i} after three AdamW steps differs by {d:e}"
        );
    }
}

/// The `tiny` profile on dummy data, on `device`, with `precision`.
fn tiny(device: &str, precision: &str, extra: &[&str]) -> Config {
    let mut cfg = Config::from_profile("tiny").unwrap();
    let mut all: Vec<String> = [
        format!("training.device={device}"),
        format!("training.precision={precision}"),
        "training.learning_rate=1e-2".into(),
        "training.threads=2".into(),
        "logging.progress=never".into(),
    ]
    .into();
    all.extend(extra.iter().map(|s| s.to_string()));
    cfg.apply_overrides(&all).unwrap();
    cfg.validate().unwrap();
    cfg
}

fn losses(cfg: Config, device: Device, steps: usize) -> Vec<(f32, f32)> {
    let mut trainer = Trainer::new(cfg, device).unwrap();
    (0..steps)
        .map(|_| {
            let s = trainer.step().unwrap();
            (s.loss, s.grad_norm)
        })
        .collect()
}

#[test]
fn training_steps_on_the_gpu_match_the_cpu_in_f32() {
    let gpu_run = losses(tiny("cuda", "f32", &[]), gpu(), 10);
    let cpu_run = losses(tiny("cpu", "f32", &[]), Device::Cpu, 10);
    let (g, c) = (gpu_run[0], cpu_run[0]);
    assert!(
        ((g.0 - c.0) / c.0).abs() < 1e-4,
        "first loss: GPU {} CPU {}",
        g.0,
        c.0
    );
    assert!(
        ((g.1 - c.1) / c.1).abs() < 1e-4,
        "first gradient norm: GPU {} CPU {}",
        g.1,
        c.1
    );
    for (i, (g, c)) in gpu_run.iter().zip(&cpu_run).enumerate() {
        assert!(
            ((g.0 - c.0) / c.0).abs() < 2e-3,
            "step {}: loss GPU {} CPU {}",
            i + 1,
            g.0,
            c.0
        );
    }
}

#[test]
fn bf16_autocast_tracks_f32_on_the_gpu() {
    let steps = 200;
    let f32_run = losses(tiny("cuda", "f32", &[]), gpu(), steps);
    let bf16_run = losses(tiny("cuda", "bf16", &[]), gpu(), steps);
    let first = f32_run[0].0;
    let last = f32_run[steps - 10..].iter().map(|l| l.0).sum::<f32>() / 10.0;
    assert!(
        last < first - 1.0,
        "the f32 run must learn: {first} → {last}"
    );
    for (i, (a, b)) in bf16_run.iter().zip(&f32_run).enumerate() {
        assert!(
            ((a.0 - b.0) / b.0).abs() < 0.02,
            "step {}: bf16 {} f32 {}",
            i + 1,
            a.0,
            b.0
        );
    }
    println!(
        "f32 loss {first:.4} → {last:.4}; bf16 final {:.4}",
        bf16_run[steps - 1].0
    );
}
