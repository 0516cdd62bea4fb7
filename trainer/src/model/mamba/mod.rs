//! The Mamba-2 mixer (state-space duality, Dao and Gu 2024), written from its math:
//!
//! ```text
//! z | xBC | dt_raw = in_proj(u)                      widths d_inner | d_inner + 2N | H
//! x | B | C        = silu(causal_depthwise_conv(xBC)) over the last d_conv tokens
//! dt = softplus(dt_raw + dt_bias),  A = −exp(A_log)   one decay and one step size per head
//! y  = SSD(x, dt, A, B, C) + D·x                     see `ssd`
//! out = out_proj(rms_norm(y · silu(z)) · w)            the gated RMSNorm
//! ```
//!
//! Training runs the chunked scan over whole sequences; generation carries the last
//! d_conv − 1 inputs of the convolution and the SSM state, and steps one token at a time.

pub mod ssd;

use candle_core::{Module, Result, Tensor, D};
use candle_nn::{Init, VarBuilder};
use rand::Rng;

use super::Linear;
use crate::config::ModelConfig;
use crate::kernels;
use ssd::ChunkMasks;

/// What generation carries from one token to the next.
#[derive(Debug, Clone)]
pub struct MambaState {
    /// (B, d_conv − 1, d_inner + 2N): the convolution's last inputs, oldest first.
    pub conv: Tensor,
    /// (B, H, head_dim, N)
    pub ssm: Tensor,
}

/// How the scan is evaluated; both give the same numbers (tests/mamba.rs holds them to 1e-9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Matmuls over chunks of model.mamba.chunk_size tokens (training, prompts).
    Chunked,
    /// One token after the other (generation; the reference for tests).
    Recurrent,
}

#[derive(Debug, Clone)]
pub struct Mamba2 {
    /// d → z (d_inner) | x (d_inner) | B (N) | C (N) | dt (H).
    in_proj: Linear,
    /// (d_inner + 2N, d_conv): one causal filter per channel of x, B and C.
    conv_weight: Tensor,
    /// (d_inner + 2N,)
    conv_bias: Tensor,
    /// (H,): added before the softplus, so dt starts in [0.001, 0.1].
    dt_bias: Tensor,
    /// (H,): A = −exp(A_log) keeps every decay in (0, 1).
    a_log: Tensor,
    /// (H,): the skip y += D·x.
    d_skip: Tensor,
    /// (d_inner,): gain of the gated RMSNorm.
    norm_weight: Tensor,
    /// d_inner → d
    out_proj: Linear,
    masks: ChunkMasks,
    d_inner: usize,
    d_state: usize,
    n_heads: usize,
    head_dim: usize,
    d_conv: usize,
    eps: f64,
}

/// softplus(x) = ln(1 + eˣ), as max(x, 0) + ln(1 + e^−|x|) so large |x| neither overflows nor
/// loses the gradient.
fn softplus(x: &Tensor) -> Result<Tensor> {
    x.relu()? + x.abs()?.neg()?.exp()?.affine(1.0, 1.0)?.log()?
}

impl Mamba2 {
    pub fn new(cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        let m = cfg.mamba_or_default();
        let d = cfg.d_model;
        let d_inner = m.expand * d;
        let n_heads = d_inner / m.head_dim;
        let conv_dim = d_inner + 2 * m.d_state;
        // Placeholder values; `init_weights` sets the real ones (`init_value`).
        let zero = Init::Const(0.0);
        let conv = vb.pp("conv1d");
        Ok(Mamba2 {
            in_proj: Linear::new(
                d,
                2 * d_inner + 2 * m.d_state + n_heads,
                false,
                vb.pp("in_proj"),
            )?,
            conv_weight: conv.get_with_hints((conv_dim, m.d_conv), "weight", zero)?,
            conv_bias: conv.get_with_hints(conv_dim, "bias", zero)?,
            dt_bias: vb.get_with_hints(n_heads, "dt_bias", zero)?,
            a_log: vb.get_with_hints(n_heads, "A_log", zero)?,
            d_skip: vb.get_with_hints(n_heads, "D", Init::Const(1.0))?,
            norm_weight: vb
                .pp("ln_out")
                .get_with_hints(d_inner, "weight", Init::Const(1.0))?,
            out_proj: Linear::new(d_inner, d, false, vb.pp("out_proj"))?,
            masks: ChunkMasks::new(m.chunk_size, vb.device(), vb.dtype())?,
            d_inner,
            d_state: m.d_state,
            n_heads,
            head_dim: m.head_dim,
            d_conv: m.d_conv,
            eps: cfg.norm_eps,
        })
    }

    /// The state before any token: zeros for a batch of `batch`.
    pub fn empty_state(&self, batch: usize) -> Result<MambaState> {
        let (dev, dtype) = (self.a_log.device(), self.a_log.dtype());
        let conv_dim = self.d_inner + 2 * self.d_state;
        Ok(MambaState {
            conv: Tensor::zeros((batch, self.d_conv - 1, conv_dim), dtype, dev)?,
            ssm: Tensor::zeros(
                (batch, self.n_heads, self.head_dim, self.d_state),
                dtype,
                dev,
            )?,
        })
    }

    /// Causal depthwise convolution of xbc (B, T, C) continuing from `prev` (B, K−1, C), the
    /// inputs before it: out[t] = bias + Σₖ w[:, k] · in[t − (K−1) + k]. Returns the output
    /// (B, T, C) and the last K−1 inputs, the next call's `prev`.
    fn conv(&self, xbc: &Tensor, prev: &Tensor) -> Result<(Tensor, Tensor)> {
        let (_, t, _) = xbc.dims3()?;
        let k = self.d_conv;
        let padded = Tensor::cat(&[prev, xbc], 1)?; // (B, K−1+T, C)
        let mut out = self.conv_bias.clone();
        for tap in 0..k {
            let w = self.conv_weight.narrow(1, tap, 1)?.squeeze(1)?; // (C,)
            out = padded
                .narrow(1, tap, t)?
                .broadcast_mul(&w)?
                .broadcast_add(&out)?;
        }
        Ok((out, padded.narrow(1, t, k - 1)?))
    }

    /// u (B, T, D) → (B, T, D), continuing from `state` (the empty state when None); returns
    /// the state after the last token too.
    pub fn forward_with_state(
        &self,
        u: &Tensor,
        state: Option<&MambaState>,
        scan: Scan,
    ) -> Result<(Tensor, MambaState)> {
        let (b, t, _) = u.dims3()?;
        let (di, n, h, p) = (self.d_inner, self.d_state, self.n_heads, self.head_dim);
        let state = match state {
            Some(s) => s.clone(),
            None => self.empty_state(b)?,
        };
        let zxbcdt = self.in_proj.forward(u)?; // (B, T, 2·di + 2N + H)
        let z = zxbcdt.narrow(D::Minus1, 0, di)?;
        let xbc = zxbcdt.narrow(D::Minus1, di, di + 2 * n)?;
        let dt_raw = zxbcdt.narrow(D::Minus1, 2 * di + 2 * n, h)?; // (B, T, H)
        let (xbc, conv_state) = self.conv(&xbc, &state.conv)?;
        let xbc = xbc.silu()?;
        let x = xbc.narrow(D::Minus1, 0, di)?.reshape((b, t, h, p))?; // (B, T, H, P)
        let bm = xbc.narrow(D::Minus1, di, n)?.contiguous()?; // (B, T, N)
        let cm = xbc.narrow(D::Minus1, di + n, n)?.contiguous()?;
        let dt = softplus(&dt_raw.broadcast_add(&self.dt_bias)?)?; // (B, T, H)
        let a = self.a_log.exp()?.neg()?; // (H,)
        let (y, ssm) = match scan {
            Scan::Chunked => ssd::chunked(&x, &dt, &a, &bm, &cm, &self.masks, Some(&state.ssm))?,
            Scan::Recurrent => {
                let mut ssm = state.ssm.clone();
                let mut ys = Vec::with_capacity(t);
                for i in 0..t {
                    let at = |v: &Tensor| v.narrow(1, i, 1)?.squeeze(1);
                    let (y, next) = ssd::step(&at(&x)?, &at(&dt)?, &a, &at(&bm)?, &at(&cm)?, &ssm)?;
                    ys.push(y);
                    ssm = next;
                }
                (Tensor::stack(&ys, 1)?, ssm)
            }
        };
        let y = (y + x.broadcast_mul(&self.d_skip.reshape((1, 1, h, 1))?)?)?; // + D·x
        let y = y.reshape((b, t, di))?;
        let gated = (y * z.silu()?)?;
        let y = kernels::rms_norm(&gated, &self.norm_weight, self.eps)?;
        let out = self.out_proj.forward(&y)?; // (B, T, D)
        Ok((
            out,
            MambaState {
                conv: conv_state,
                ssm,
            },
        ))
    }
}

impl Module for Mamba2 {
    /// u (B, T, D) → (B, T, D) from the empty state, by the chunked scan.
    fn forward(&self, u: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_state(u, None, Scan::Chunked)?.0)
    }
}

/// A Mamba-2 mixer's share of the training FLOPs per token, as (matmul weights, scan FLOPs):
/// the weights of in_proj and out_proj (the caller counts 6 per weight, as for every matmul),
/// and forward + backward (3× the forward) of the chunked scan with chunks of
/// L = min(chunk_size, seq_len): C·Bᵀ scores 2·L·N, their mixing of x 2·L·d_inner, the chunk
/// states and their read-out 2·d_inner·N each, and the convolution 2·d_conv·(d_inner + 2N).
/// Like the attention estimate, the masked half of each chunk is counted too.
pub fn flops_per_token(cfg: &ModelConfig, seq_len: usize) -> (f64, f64) {
    let m = cfg.mamba_or_default();
    let d = cfg.d_model as f64;
    let di = (m.expand * cfg.d_model) as f64;
    let n = m.d_state as f64;
    let h = di / m.head_dim as f64;
    let l = m.chunk_size.min(seq_len) as f64;
    let weights = d * (2.0 * di + 2.0 * n + h) + di * d;
    let forward =
        2.0 * l * n + 2.0 * l * di + 4.0 * di * n + 2.0 * m.d_conv as f64 * (di + 2.0 * n);
    (weights, 3.0 * forward)
}

/// Initial values of the Mamba-2 parameters that are not plain matmul weights: A log-uniform in
/// [1, 16] (A_log = ln A uniform in [0, ln 16], so every decay time scale from 1 to 16 steps is
/// equally likely per octave), dt log-uniform in [0.001, 0.1] stored through the inverse
/// softplus in dt_bias, D = 1, and the
/// convolution taps uniform in ±1/√d_conv (PyTorch's default for a depthwise Conv1d). None for
/// every other name. `shape` is the variable's.
pub fn init_value(name: &str, shape: &[usize], rng: &mut impl Rng) -> Option<Vec<f64>> {
    let n: usize = shape.iter().product();
    let (_, leaf) = name.rsplit_once(".mamba.")?;
    let values = match leaf {
        "A_log" => (0..n).map(|_| 16f64.ln() * rng.random::<f64>()).collect(),
        "dt_bias" => (0..n)
            .map(|_| {
                let (lo, hi) = (0.001f64.ln(), 0.1f64.ln());
                let dt = (lo + (hi - lo) * rng.random::<f64>()).exp().max(1e-4);
                dt + (-(-dt).exp_m1()).ln() // softplus⁻¹(dt) = ln(eᵈᵗ − 1)
            })
            .collect(),
        "D" => vec![1.0; n],
        "conv1d.weight" => {
            let bound = 1.0 / (*shape.last()? as f64).sqrt();
            (0..n)
                .map(|_| bound * (2.0 * rng.random::<f64>() - 1.0))
                .collect()
        }
        _ => return None,
    };
    Some(values)
}
