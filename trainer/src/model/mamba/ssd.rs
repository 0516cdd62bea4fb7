//! The selective state-space scan of Mamba-2, in its two equal forms.
//!
//! Per head (scalar decay A < 0, step size dtₜ > 0), with a state hₜ of head_dim × d_state:
//!
//! ```text
//! hₜ = exp(dtₜ·A)·hₜ₋₁ + dtₜ · xₜ ⊗ Bₜ        yₜ = hₜ · Cₜ
//! ```
//!
//! Unrolled, yₗ = Σ_{s ≤ l} (Cₗ·Bₛ) · exp(Σ_{r=s+1..l} dtᵣA) · dtₛ · xₛ: a causal, decaying
//! "attention" whose scores are C·Bᵀ. The chunked form (training) evaluates that sum densely
//! inside chunks of L tokens, turns each chunk's inputs into the state they leave at its end,
//! passes states from chunk to chunk, and reads the carried state back out with C: matmuls,
//! no loop over tokens. The recurrent form (generation) is the first line, one token at a time.

use candle_core::{DType, Device, Result, Tensor, D};

/// Constants of the chunked scan for one chunk length, built once per layer.
#[derive(Debug, Clone)]
pub struct ChunkMasks {
    /// (L, L): 0 where s ≤ l, −∞ above; added to the log-decays before exp, so the masked
    /// entries are exactly 0 and get no gradient (a product with a 0/1 mask would compute
    /// exp of large positive sums there, which can overflow to inf and give inf·0 = NaN).
    causal: Tensor,
    /// (L, L): 1 where s ≤ l: a·tri is the running sum of a along its last dim.
    tri: Tensor,
}

impl ChunkMasks {
    pub fn new(chunk: usize, device: &Device, dtype: DType) -> Result<Self> {
        let (mut causal, mut tri) = (Vec::new(), Vec::new());
        for row in 0..chunk {
            for col in 0..chunk {
                // causal: row l (output), column s (source); tri: row s, column l.
                causal.push(if col > row { f64::NEG_INFINITY } else { 0.0 });
                tri.push(if row <= col { 1.0 } else { 0.0 });
            }
        }
        let t = |v: Vec<f64>| Tensor::from_vec(v, (chunk, chunk), device)?.to_dtype(dtype);
        Ok(ChunkMasks {
            causal: t(causal)?,
            tri: t(tri)?,
        })
    }

    fn len(&self) -> Result<usize> {
        self.causal.dim(0)
    }
}

/// Zero rows appended along dim 1 (time) so it reaches `to`. Zero dt means no decay and no
/// input, so padded steps leave the state as it was and their outputs are dropped.
fn pad_time(x: &Tensor, to: usize) -> Result<Tensor> {
    let t = x.dim(1)?;
    if t == to {
        return Ok(x.clone());
    }
    let mut shape = x.dims().to_vec();
    shape[1] = to - t;
    let zeros = Tensor::zeros(shape, x.dtype(), x.device())?;
    Tensor::cat(&[x, &zeros], 1)
}

/// The chunked scan. x (B, T, H, P), dt (B, T, H) after softplus, a (H,) the decays A (< 0),
/// b and c (B, T, N), h0 (B, H, P, N) the state before the first token (zeros when None).
/// Returns y (B, T, H, P) (without the D skip) and the state after the last token.
pub fn chunked(
    x: &Tensor,
    dt: &Tensor,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    masks: &ChunkMasks,
    h0: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let (bs, t, h, p) = x.dims4()?;
    let n = b.dim(D::Minus1)?;
    let l = masks.len()?.min(t);
    let nc = t.div_ceil(l);
    let tp = nc * l;
    // Chunked views: x (B, c, H, L, P); dt and the log-decays (B, c, H, L); b, c (B, c, L, N).
    let xc = pad_time(x, tp)?
        .reshape((bs, nc, l, h, p))?
        .permute((0, 1, 3, 2, 4))?
        .contiguous()?;
    let dtc = pad_time(dt, tp)?
        .reshape((bs, nc, l, h))?
        .permute((0, 1, 3, 2))?
        .contiguous()?;
    let bc = pad_time(b, tp)?.reshape((bs, nc, l, n))?;
    let cc = pad_time(c, tp)?.reshape((bs, nc, l, n))?;
    let log_decay = dtc.broadcast_mul(&a.reshape((1, 1, h, 1))?)?; // dt·A, (B, c, H, L)
    let tri = masks.tri.narrow(0, 0, l)?.narrow(1, 0, l)?;
    let causal = masks.causal.narrow(0, 0, l)?.narrow(1, 0, l)?;
    // Running sums within each chunk: cum[l] = Σ_{r ≤ l} dtᵣ·A.
    let cum = log_decay
        .reshape((bs * nc * h, l))?
        .matmul(&tri)?
        .reshape((bs, nc, h, l))?;

    // 1. Within chunks: y_diag[l] = Σ_{s ≤ l} (Cₗ·Bₛ) exp(cum[l] − cum[s]) dtₛ xₛ.
    let decay = cum
        .unsqueeze(D::Minus1)?
        .broadcast_sub(&cum.unsqueeze(D::Minus2)?)? // (B, c, H, L, L): cum[l] − cum[s]
        .broadcast_add(&causal)?
        .exp()?;
    let scores = cc.matmul(&bc.t()?)?; // (B, c, L, L): Cₗ·Bₛ
    let mixing = decay
        .broadcast_mul(&scores.unsqueeze(2)?)?
        .broadcast_mul(&dtc.unsqueeze(3)?)?; // (B, c, H, L, L), dt of the source token s
    let y_diag = mixing
        .reshape((bs * nc * h, l, l))?
        .matmul(&xc.reshape((bs * nc * h, l, p))?)?
        .reshape((bs, nc, h, l, p))?;

    // 2. The state each chunk leaves from its own inputs: Σₛ exp(cum[L−1] − cum[s]) dtₛ xₛ ⊗ Bₛ.
    let last = cum.narrow(D::Minus1, l - 1, 1)?; // (B, c, H, 1)
    let to_end = last.broadcast_sub(&cum)?.exp()?.mul(&dtc)?; // (B, c, H, L)
    let xw = xc.broadcast_mul(&to_end.unsqueeze(D::Minus1)?)?; // (B, c, H, L, P)
    let local = xw
        .transpose(3, 4)? // (B, c, H, P, L)
        .reshape((bs, nc, h * p, l))?
        .matmul(&bc)? // (B, c, H·P, N)
        .reshape((bs, nc, h, p, n))?;

    // 3. Across chunks: the state entering chunk k, decayed by whole chunks. A loop over
    //    chunks (T / L of them), not over tokens.
    let chunk_decay = last.squeeze(D::Minus1)?.exp()?; // (B, c, H)
    let mut state = match h0 {
        Some(h0) => h0.clone(),
        None => Tensor::zeros((bs, h, p, n), x.dtype(), x.device())?,
    };
    let mut entering = Vec::with_capacity(nc);
    for k in 0..nc {
        entering.push(state.clone());
        let keep = chunk_decay.narrow(1, k, 1)?.reshape((bs, h, 1, 1))?;
        state = state
            .broadcast_mul(&keep)?
            .add(&local.narrow(1, k, 1)?.squeeze(1)?)?;
    }
    let entering = Tensor::stack(&entering, 1)?; // (B, c, H, P, N)

    // 4. The carried state read out within each chunk: exp(cum[l]) · h_in · Cₗ.
    let y_off = entering
        .reshape((bs, nc, h * p, n))?
        .matmul(&cc.t()?)? // (B, c, H·P, L)
        .reshape((bs, nc, h, p, l))?
        .broadcast_mul(&cum.exp()?.unsqueeze(3)?)?
        .transpose(3, 4)?; // (B, c, H, L, P)

    let y = (y_diag + y_off)?
        .permute((0, 1, 3, 2, 4))? // (B, c, L, H, P)
        .reshape((bs, tp, h, p))?
        .narrow(1, 0, t)?;
    Ok((y, state))
}

/// One token of the recurrence. x (B, H, P), dt (B, H), a (H,), b and c (B, N), state
/// (B, H, P, N). Returns y (B, H, P) (without the D skip) and the new state.
pub fn step(
    x: &Tensor,
    dt: &Tensor,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    state: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (bs, h, _) = x.dims3()?;
    let n = b.dim(D::Minus1)?;
    let keep = dt.broadcast_mul(&a.unsqueeze(0)?)?.exp()?; // (B, H)
    let input = x
        .broadcast_mul(&dt.unsqueeze(D::Minus1)?)? // dt·x, (B, H, P)
        .unsqueeze(D::Minus1)?
        .broadcast_mul(&b.reshape((bs, 1, 1, n))?)?; // (B, H, P, N)
    let state = state
        .broadcast_mul(&keep.reshape((bs, h, 1, 1))?)?
        .add(&input)?;
    let y = state
        .broadcast_mul(&c.reshape((bs, 1, 1, n))?)?
        .sum(D::Minus1)?; // (B, H, P)
    Ok((y, state))
}
