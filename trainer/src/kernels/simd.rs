//! Vectorised f32 kernels for the fused ops: `exp`, tanh-GELU and its derivative, softmax, row
//! sums and dots, sums of squared deviations (layer norm), column sums (bias gradients).
//!
//! libm's `expf`/`tanhf` are scalar calls; in a 1-thread profile the GELU forward alone took a
//! fifth of a training step. Here `exp` is a branch-free range reduction plus a polynomial that
//! the compiler vectorises, and each kernel is compiled three times (AVX-512, AVX2+FMA,
//! baseline) with the widest one the CPU supports picked at run time, so the default build stays
//! portable. Every variant performs the same IEEE operations in the same order (no fused
//! multiply-add is requested, reductions use a fixed lane layout), so results do not depend on
//! which variant runs.

use std::mem::MaybeUninit;

/// Inputs above this overflow to +inf; below `EXP_LO` the result is flushed to 0.
const EXP_HI: f32 = 88.3;
const EXP_LO: f32 = -87.3;
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two (Cody–Waite) so `x − n·ln2` stays exact for |n| ≤ 128.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: adding it rounds a float of magnitude < 2^22 to the nearest integer, which
/// then sits in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// e^x for one f32, written without branches or libm calls so loops over it vectorise.
/// Relative error below 2e-7 over the whole range; NaN in gives NaN out.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let (shifted, r) = exp_reduce(x);
    let mut p = EXP_TAYLOR[0];
    for c in &EXP_TAYLOR[1..] {
        p = p * r + c;
    }
    exp_scale(x, shifted, p)
}

/// Taylor series of e^r to degree 7, highest term first (Horner's order): the truncation error
/// is < 6e-9 for |r| ≤ ln2/2.
const EXP_TAYLOR: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// x = n·ln2 + r with |r| ≤ ln2/2, x clamped to [EXP_LO, EXP_HI] first: (n + ROUND_MAGIC, r).
#[inline(always)]
fn exp_reduce(x: f32) -> (f32, f32) {
    // `clamp` passes a NaN through untouched (unlike `max`/`min`).
    let xc = x.clamp(EXP_LO, EXP_HI);
    let shifted = xc * LOG2_E + ROUND_MAGIC;
    let n = shifted - ROUND_MAGIC;
    (shifted, (xc - n * LN2_HI) - n * LN2_LO)
}

/// e^x = e^r · 2^n from `exp_reduce`'s n (in `shifted`) and p = e^r, with the range's ends.
#[inline(always)]
fn exp_scale(x: f32, shifted: f32, p: f32) -> f32 {
    let n_bits = shifted.to_bits().wrapping_sub(ROUND_MAGIC.to_bits()) as i32;
    // 2^n built in the exponent field; n ∈ [-126, 127] after the clamp.
    let y = p * f32::from_bits(((n_bits + 127) as u32) << 23);
    if x > EXP_HI {
        f32::INFINITY
    } else if x < EXP_LO {
        0.0
    } else {
        y
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;

/// 2u of GELU's tanh form, u = √(2/π)·(x + 0.044715·x³).
#[inline(always)]
fn two_u(x: f32) -> f32 {
    2.0 * SQRT_2_OVER_PI * (x + GELU_C * x * x * x)
}

/// gelu(x) = 0.5·x·(1 + tanh(u)) = x·sigmoid(2u).
#[inline(always)]
fn gelu_one(x: f32) -> f32 {
    x / (1.0 + exp(-two_u(x)))
}

/// d gelu / dx = s + x·2s(1 − s)·du/dx with s = sigmoid(2u).
#[inline(always)]
fn gelu_grad_one(x: f32) -> f32 {
    gelu_grad_from(x, 1.0 / (1.0 + exp(-two_u(x))))
}

/// `gelu_grad_one` from x and its s = sigmoid(2u).
#[inline(always)]
fn gelu_grad_from(x: f32, s: f32) -> f32 {
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x);
    s + x * 2.0 * s * (1.0 - s) * du
}

/// `exp` of `LANES` values at once, one step of the formula across all of them before the
/// next: the same operations per value as `exp`, so the same bits. For GELU and its
/// derivative, whose chains add a division after the exp: written per value, the compiler
/// emits one vector's whole chain of about forty dependent operations, then the next vector's;
/// step by step, each step is two to four independent vector operations side by side. On a Zen
/// 4 with AVX2 (one core, 64 Ki values in cache) the GELU ran 15 % faster this way and its
/// derivative 23 %; with AVX-512 their share of a training step did not change. `exp` alone
/// and the attention's softmax (rows of up to 128 values) gained nothing or lost, so they keep
/// the per-value loop.
#[inline(always)]
fn exp_lanes(x: &[f32; LANES]) -> [f32; LANES] {
    let mut shifted = [0.0f32; LANES];
    let mut r = [0.0f32; LANES];
    for i in 0..LANES {
        (shifted[i], r[i]) = exp_reduce(x[i]);
    }
    let mut p = [EXP_TAYLOR[0]; LANES];
    for c in &EXP_TAYLOR[1..] {
        for i in 0..LANES {
            p[i] = p[i] * r[i] + c;
        }
    }
    let mut y = [0.0f32; LANES];
    for i in 0..LANES {
        y[i] = exp_scale(x[i], shifted[i], p[i]);
    }
    y
}

/// −2u of `gelu_one` for `LANES` values: gelu(x) = x / (1 + e^(−2u)).
#[inline(always)]
fn minus_two_u(x: &[f32; LANES]) -> [f32; LANES] {
    let mut m = [0.0f32; LANES];
    for (m, &v) in m.iter_mut().zip(x) {
        *m = -two_u(v);
    }
    m
}

#[inline(always)]
fn exp_inplace_impl(xs: &mut [f32]) {
    for v in xs {
        *v = exp(*v);
    }
}

#[inline(always)]
fn gelu_impl(x: &[f32], y: &mut [f32]) {
    let (xb, x_rest) = x.as_chunks::<LANES>();
    let (yb, y_rest) = y.as_chunks_mut::<LANES>();
    for (xa, yc) in xb.iter().zip(yb) {
        let e = exp_lanes(&minus_two_u(xa));
        for ((o, &v), &e) in yc.iter_mut().zip(xa).zip(&e) {
            *o = v / (1.0 + e);
        }
    }
    for (o, &v) in y_rest.iter_mut().zip(x_rest) {
        *o = gelu_one(v);
    }
}

#[inline(always)]
fn gelu_backward_impl(x: &[f32], g: &[f32], dx: &mut [f32]) {
    let (xb, x_rest) = x.as_chunks::<LANES>();
    let (gb, g_rest) = g.as_chunks::<LANES>();
    let (db, d_rest) = dx.as_chunks_mut::<LANES>();
    for ((xa, ga), dc) in xb.iter().zip(gb).zip(db) {
        let e = exp_lanes(&minus_two_u(xa));
        for (((d, &v), &gv), &e) in dc.iter_mut().zip(xa).zip(ga).zip(&e) {
            *d = gv * gelu_grad_from(v, 1.0 / (1.0 + e));
        }
    }
    for ((d, &v), &gv) in d_rest.iter_mut().zip(x_rest).zip(g_rest) {
        *d = gv * gelu_grad_one(v);
    }
}

/// y ← gelu(x) and x ← gelu'(x) in one pass, for a forward that keeps the derivative for its
/// backward instead of the pre-activation: the backward is then a product (`mul_impl`) where
/// `gelu_backward_impl` recomputes the exp and a division per value. Both outputs share the
/// value's 1 + e^(−2u), so they are the bits of `gelu_one` and `gelu_grad_one`. y may be fresh
/// memory: it is only written.
#[inline(always)]
fn gelu_and_grad_impl(x: &mut [f32], y: &mut [MaybeUninit<f32>]) {
    let (xb, x_rest) = x.as_chunks_mut::<LANES>();
    let (yb, y_rest) = y.as_chunks_mut::<LANES>();
    // Both from x and its e^(−2u): gelu = x / (1 + e), gelu' from s = 1 / (1 + e).
    let both = |o: &mut MaybeUninit<f32>, v: &mut f32, e: f32| {
        let denom = 1.0 + e;
        o.write(*v / denom);
        *v = gelu_grad_from(*v, 1.0 / denom);
    };
    for (xa, yc) in xb.iter_mut().zip(yb) {
        let e = exp_lanes(&minus_two_u(xa));
        for ((o, v), &e) in yc.iter_mut().zip(xa.iter_mut()).zip(&e) {
            both(o, v, e);
        }
    }
    for (o, v) in y_rest.iter_mut().zip(x_rest) {
        let e = exp(-two_u(*v));
        both(o, v, e);
    }
}

#[inline(always)]
fn mul_impl(d: &mut [f32], s: &[f32]) {
    for (d, &s) in d.iter_mut().zip(s) {
        *d *= s;
    }
}

/// Lanes of the partial sums: enough independent additions to fill AVX-512 twice over.
const LANES: usize = 32;

/// Σ term(x) over xs, x at index i added into lane i mod LANES, then the lanes folded.
#[inline(always)]
fn lane_sum(xs: &[f32], term: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += term(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += term(v);
    }
    fold(acc)
}

/// The lanes' sum in a fixed pairwise order, the same on every CPU.
#[inline(always)]
fn fold(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

#[inline(always)]
fn sum_impl(xs: &[f32]) -> f32 {
    lane_sum(xs, |v| v)
}

#[inline(always)]
fn sq_dev_sum_impl(xs: &[f32], c: f32) -> f32 {
    lane_sum(xs, |v| (v - c) * (v - c))
}

#[inline(always)]
fn dot_impl(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for ((s, &u), &v) in acc.iter_mut().zip(x).zip(y) {
            *s += u * v;
        }
    }
    for ((s, &u), &v) in acc.iter_mut().zip(ca.remainder()).zip(cb.remainder()) {
        *s += u * v;
    }
    fold(acc)
}

#[inline(always)]
fn softmax_inplace_impl(xs: &mut [f32]) {
    // Three passes where max, subtract, exp, sum and scale were five. The attention's rows are
    // short (one per key seen so far), so the tail past the last full 32 values, scalar code in
    // `lane_sum`, was most of the time: here it runs as a full chunk padded with −∞, whose
    // e^(−∞ − max) = 0 leaves the max and the lane sums as they were. The exp and the sum
    // are those of `exp_inplace` and `sum`, so the values are the same bits.
    let full = xs.len() / LANES * LANES;
    let mut tail = [f32::NEG_INFINITY; LANES];
    tail[..xs.len() - full].copy_from_slice(&xs[full..]);
    // `f32::max` (a NaN loses) vectorises; an `if v > m` became a branch per value.
    let mut lanes = tail;
    for c in xs[..full].chunks_exact(LANES) {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let max = lanes.into_iter().fold(f32::NEG_INFINITY, f32::max);
    let mut acc = [0.0f32; LANES];
    let mut exp_into_lanes = |c: &mut [f32]| {
        for (a, v) in acc.iter_mut().zip(c) {
            *v = exp(*v - max);
            *a += *v;
        }
    };
    for c in xs[..full].chunks_exact_mut(LANES) {
        exp_into_lanes(c);
    }
    exp_into_lanes(&mut tail);
    let inv = 1.0 / fold(acc);
    let n = xs.len() - full;
    xs[full..].copy_from_slice(&tail[..n]);
    for v in xs {
        *v *= inv;
    }
}

#[inline(always)]
fn layer_norm_row_impl(x: &[f32], w: &[f32], b: &[f32], y: &mut [f32], eps: f64) {
    super::norm::layer_norm_row(x, w, b, y, eps)
}

/// Inputs (x, g, w), outputs (dw, db), scratch (x̂, ĝ) of a layer norm backward row.
type Rows3<'a> = (&'a [f32], &'a [f32], &'a [f32]);
type RowsMut2<'a> = (&'a mut [f32], &'a mut [f32]);

#[inline(always)]
fn layer_norm_backward_row_impl(
    xgw: Rows3,
    dx: &mut [f32],
    dwb: RowsMut2,
    scratch: RowsMut2,
    eps: f64,
) {
    super::norm::layer_norm_backward_row(xgw, dx, dwb, scratch, eps)
}

/// Columns of a register block of `add_column_sums` (four 16-lane vectors).
const SUM_COLS: usize = 64;

#[inline(always)]
fn add_column_sums_impl(g: &[f32], c: usize, c0: usize, out: &mut [f32]) {
    // A block of columns at a time, its running sums in a fixed-size array the compiler keeps
    // in registers over all rows (through `out`, each row's adds were a load and a store per
    // vector); every column is still summed in row order.
    for (b, o) in out.chunks_mut(SUM_COLS).enumerate() {
        let j0 = c0 + b * SUM_COLS;
        if o.len() == SUM_COLS {
            let mut acc = [0.0f32; SUM_COLS];
            acc.copy_from_slice(o);
            for row in g.chunks_exact(c) {
                let src: &[f32; SUM_COLS] = match row[j0..j0 + SUM_COLS].try_into() {
                    Ok(src) => src,
                    Err(_) => unreachable!("a slice of SUM_COLS values"),
                };
                for (a, &v) in acc.iter_mut().zip(src) {
                    *a += v;
                }
            }
            o.copy_from_slice(&acc);
        } else {
            let j1 = j0 + o.len();
            for row in g.chunks_exact(c) {
                for (a, &v) in o.iter_mut().zip(&row[j0..j1]) {
                    *a += v;
                }
            }
        }
    }
}

/// Defines `pub fn $name` that runs `$body_fn` compiled for the widest instruction set the CPU
/// has. The bodies are plain Rust; only the code generation differs between variants.
macro_rules! multiversion {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $body_fn:ident) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $body_fn($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body_fn($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                {
                    // SAFETY: the CPU supports every feature the variant was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body_fn($($arg),*)
        }
    };
}
pub(crate) use multiversion;

multiversion! {
    /// xs ← e^xs, element-wise.
    pub fn exp_inplace(xs: &mut [f32]) => exp_inplace_impl
}

multiversion! {
    /// y ← tanh-GELU(x), element-wise (`x` and `y` of the same length).
    pub fn gelu(x: &[f32], y: &mut [f32]) => gelu_impl
}

multiversion! {
    /// dx ← g · gelu'(x), element-wise.
    pub fn gelu_backward(x: &[f32], g: &[f32], dx: &mut [f32]) => gelu_backward_impl
}

multiversion! {
    /// y ← tanh-GELU(x), x ← gelu'(x), element-wise (`x` and `y` of the same length; y is
    /// only written).
    pub fn gelu_and_grad(x: &mut [f32], y: &mut [MaybeUninit<f32>]) => gelu_and_grad_impl
}

multiversion! {
    /// d ← d ⊙ s, element-wise over the common length.
    pub fn mul(d: &mut [f32], s: &[f32]) => mul_impl
}

multiversion! {
    /// Σ xs, accumulated in 32 fixed lanes (deterministic, not the sequential order).
    pub fn sum(xs: &[f32]) -> f32 => sum_impl
}

multiversion! {
    /// One row of the layer norm's forward, y = (x − mean)·rstd·w + b (`norm`'s code,
    /// compiled here for wide vectors).
    pub fn layer_norm_row(x: &[f32], w: &[f32], b: &[f32], y: &mut [f32], eps: f64) => layer_norm_row_impl
}

multiversion! {
    /// One row of the layer norm's backward (`norm`'s code, compiled here for wide vectors).
    pub fn layer_norm_backward_row(xgw: Rows3, dx: &mut [f32], dwb: RowsMut2, scratch: RowsMut2, eps: f64) => layer_norm_backward_row_impl
}

multiversion! {
    /// xs ← softmax(xs) in place: e^(x − max) over their sum taken as `sum` takes it.
    pub fn softmax_inplace(xs: &mut [f32]) => softmax_inplace_impl
}

multiversion! {
    /// Σ a⊙b over the common length, in 32 fixed lanes.
    pub fn dot(a: &[f32], b: &[f32]) -> f32 => dot_impl
}

multiversion! {
    /// out += the sums over the rows of g (rows of c values) of its columns c0..c0 + out.len(),
    /// each column summed in row order.
    pub fn add_column_sums(g: &[f32], c: usize, c0: usize, out: &mut [f32]) => add_column_sums_impl
}

multiversion! {
    /// Σ (x − c)², in 32 fixed lanes (a row's variance about its mean, without a second buffer).
    pub fn sq_dev_sum(xs: &[f32], c: f32) -> f32 => sq_dev_sum_impl
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_libm_to_a_few_ulps_over_its_range() {
        let mut worst: f64 = 0.0;
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.013;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
    }

    #[test]
    fn softmax_gives_the_bits_of_its_five_passes() {
        for n in [1, 5, 31, 32, 33, 100, 128] {
            let xs: Vec<f32> = (0..n).map(|i| (i as f32 * 0.61).sin() * 9.0).collect();
            let mut got = xs.clone();
            softmax_inplace(&mut got);
            // max, subtract, exp, sum, scale, as the attention's softmax ran them before.
            let max = xs.iter().fold(xs[0], |m, &v| if v > m { v } else { m });
            let mut want: Vec<f32> = xs.iter().map(|&v| v - max).collect();
            exp_inplace(&mut want);
            let inv = 1.0 / sum(&want);
            want.iter_mut().for_each(|v| *v *= inv);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "n = {n}");
            let total: f64 = got.iter().map(|&v| v as f64).sum();
            assert!((total - 1.0).abs() < 1e-5, "n = {n}: sums to {total}");
        }
    }

    #[test]
    fn exp_handles_the_edges() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(1000.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn column_sums_add_each_column_in_row_order_in_every_block_width() {
        // 150 columns a row, summing 130 of them from column 7: two full register blocks and
        // a partial one.
        let (c, c0, n, rows) = (150, 7, 130, 37);
        let g: Vec<f32> = (0..rows * c)
            .map(|i| (i as f32 * 0.61).sin() * 3.0)
            .collect();
        let start: Vec<f32> = (0..n).map(|j| j as f32 * 0.5).collect();
        let mut want = start.clone();
        for row in g.chunks(c) {
            for (j, w) in want.iter_mut().enumerate() {
                *w += row[c0 + j];
            }
        }
        let mut got = start.clone();
        add_column_sums(&g, c, c0, &mut got);
        let mut scalar = start;
        add_column_sums_impl(&g, c, c0, &mut scalar);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
        assert_eq!(bits(&scalar), bits(&want));
    }

    #[test]
    fn every_variant_gives_the_same_bits_as_the_scalar_code() {
        // 1,000 values (31 blocks of 32 and a tail) with the edges of `exp` among them.
        let mut x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 6.0).collect();
        let edges = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e4,
            -1e4,
            88.3,
            -87.3,
        ];
        for (i, &v) in edges.iter().enumerate() {
            x[37 * i + 5] = v;
            x[990 + i] = v;
        }
        let g: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.11).cos()).collect();
        // Bits, every NaN as one value: which of two NaN operands an instruction passes on
        // depends on the operand order the compiler picked.
        let bits = |v: &[f32]| {
            v.iter()
                .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                .collect::<Vec<_>>()
        };
        // The block kernels, in the widest variant this CPU has and compiled without any
        // target feature, against the formulas one value at a time.
        let mut y = vec![0.0; x.len()];
        let mut y_base = vec![0.0; x.len()];
        gelu(&x, &mut y);
        gelu_impl(&x, &mut y_base);
        let y_ref: Vec<f32> = x.iter().map(|&v| gelu_one(v)).collect();
        assert_eq!(bits(&y), bits(&y_ref));
        assert_eq!(bits(&y_base), bits(&y_ref));
        let mut dx = vec![0.0; x.len()];
        let mut dx_base = vec![0.0; x.len()];
        gelu_backward(&x, &g, &mut dx);
        gelu_backward_impl(&x, &g, &mut dx_base);
        let dx_ref: Vec<f32> = x
            .iter()
            .zip(&g)
            .map(|(&v, &gv)| gv * gelu_grad_one(v))
            .collect();
        assert_eq!(bits(&dx), bits(&dx_ref));
        assert_eq!(bits(&dx_base), bits(&dx_ref));
        // GELU with its derivative kept, then the backward as a product: the same bits as
        // the two kernels above.
        for kernel in [gelu_and_grad, gelu_and_grad_impl] {
            let mut grad = x.clone();
            let mut y_kept = vec![MaybeUninit::uninit(); x.len()];
            kernel(&mut grad, &mut y_kept);
            // SAFETY: the kernel wrote every value of y_kept.
            let y_kept: Vec<f32> = y_kept.iter().map(|v| unsafe { v.assume_init() }).collect();
            assert_eq!(bits(&y_kept), bits(&y_ref));
            let mut dx_kept = g.clone();
            mul(&mut dx_kept, &grad);
            assert_eq!(bits(&dx_kept), bits(&dx_ref));
            let mut dx_kept_base = g.clone();
            mul_impl(&mut dx_kept_base, &grad);
            assert_eq!(bits(&dx_kept_base), bits(&dx_ref));
        }
        let mut e = x.clone();
        exp_inplace(&mut e);
        let mut e_base = x.clone();
        exp_inplace_impl(&mut e_base);
        let e_ref: Vec<f32> = x.iter().map(|&v| exp(v)).collect();
        assert_eq!(bits(&e), bits(&e_ref));
        assert_eq!(bits(&e_base), bits(&e_ref));
        // The sums without the edges (a NaN's sign bit depends on the order of the adds).
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 6.0).collect();
        assert_eq!(sum(&x).to_bits(), sum_impl(&x).to_bits());
        assert_eq!(dot(&x, &g).to_bits(), dot_impl(&x, &g).to_bits());
        assert_eq!(
            sq_dev_sum(&x, 0.3).to_bits(),
            sq_dev_sum_impl(&x, 0.3).to_bits()
        );
    }

    #[test]
    fn gelu_and_its_derivative_match_the_tanh_formula() {
        for i in -400..400 {
            let x = i as f64 * 0.02;
            let u = 0.797_884_560_802_865_4 * (x + 0.044_715 * x * x * x);
            let want = 0.5 * x * (1.0 + u.tanh());
            let got = gelu_one(x as f32) as f64;
            assert!(
                (got - want).abs() < 1e-6 * (1.0 + want.abs()),
                "gelu({x}) = {got}, want {want}"
            );
            let h = 1e-4;
            let f = |x: f64| {
                let u = 0.797_884_560_802_865_4 * (x + 0.044_715 * x * x * x);
                0.5 * x * (1.0 + u.tanh())
            };
            let num = (f(x + h) - f(x - h)) / (2.0 * h);
            let got = gelu_grad_one(x as f32) as f64;
            assert!((got - num).abs() < 2e-5, "gelu'({x}) = {got}, want {num}");
        }
    }

    #[test]
    fn sums_are_exact_on_integers_and_cover_the_tail() {
        let xs: Vec<f32> = (1..=1001).map(|i| i as f32).collect();
        assert_eq!(sum(&xs), 501_501.0);
        let ones = vec![1.0f32; 77];
        assert_eq!(dot(&ones, &xs[..77]), (1..=77).sum::<i32>() as f32);
    }
}
