//! An AVX-512 f32 GEMM for the fused CPU ops.
//!
//! candle's CPU matmul (the `gemm` crate) only has AVX2 kernels on stable Rust, so on a CPU
//! with AVX-512 half of each vector unit sits idle, and the GEMMs were 60 % of a training step.
//! This is the classic packed layout: B is packed in panels of `NR` columns and A in panels of
//! `MR` rows, both in blocks of `KC` along k, and a register-blocked microkernel keeps an
//! `MR × NR` tile of C in 24 vector registers while it streams the panels. Single-threaded:
//! the callers split work into independent blocks across candle's thread pool.
//!
//! Every C element is summed over k in order (blocks of `KC`, each with fused multiply-adds in
//! k order), so results do not depend on how callers split rows or columns.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Rows of the C tile (one broadcast of A each).
const MR: usize = 12;
/// Columns of the C tile: two 16-lane vectors.
const NR: usize = 32;
/// Depth of one packed block along k.
const KC: usize = 256;
/// Rows of A packed at a time (ten panels; 120 × 256 floats = 120 KiB, inside L2).
const MC: usize = 120;
/// Columns of B packed at a time.
const NC: usize = 1024;

/// A strided f32 matrix operand: element (i, j) at `ptr + i·rs + j·cs`.
#[derive(Clone, Copy)]
pub struct Operand {
    pub ptr: *const f32,
    pub rs: usize,
    pub cs: usize,
}

/// Whether this CPU runs the AVX-512 kernel.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

thread_local! {
    /// Packing buffers of this thread (A block, B block), reused across calls.
    static PACK: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// C (m×n, row stride `ldc`, unit column stride) ← [C +] beta · A (m×k) · B (k×n), or, when not
/// accumulating and `bias` (n values) is not null, C ← bias + beta · A·B. The bias is added
/// where the first block along k is stored, so a linear layer's output is written once instead
/// of filled with the bias row by row and then read back by an accumulating GEMM.
///
/// # Safety
/// The CPU must support AVX-512F (`available()`); `a`, `b` must be valid for every (i, p) and
/// (p, j) element their strides address, `c` for rows `0..m` × columns `0..n` at `ldc`, and no
/// other thread may write those C elements during the call; a non-null `bias` must be valid for
/// `n` reads. C's elements are only written (never read) when `accumulate` is false.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
    c: *mut f32,
    ldc: usize,
    beta: f32,
    accumulate: bool,
    bias: *const f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                if bias.is_null() {
                    std::ptr::write_bytes(c.add(i * ldc), 0, n);
                } else {
                    std::ptr::copy_nonoverlapping(bias, c.add(i * ldc), n);
                }
            }
        }
        return;
    }
    PACK.with(|pack| {
        let mut pack = pack.borrow_mut();
        let (pa, pb) = &mut *pack;
        let nc_max = n.min(NC).div_ceil(NR) * NR;
        if pb.len() < KC * nc_max {
            pb.resize(KC * nc_max, 0.0);
        }
        if pa.len() < KC * MC {
            pa.resize(KC * MC, 0.0);
        }
        // Full panels of a row-major A are read in place; everything else is packed. A
        // transposed A (the weight gradient's gᵀ) is packed too: read in place, each k step of
        // a tile touched a new row of g, hundreds of bytes apart, where the packed panel is
        // contiguous (an Intel Xeon step: +4 %, +3 %, −1 % in three pairs).
        let row_major = a.cs == 1;
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(KC) {
                let kc = KC.min(k - pc);
                let acc = accumulate || pc > 0;
                pack_b(b, pc, kc, jc, nc, pb);
                for ic in (0..m).step_by(MC) {
                    let mc = MC.min(m - ic);
                    let full = if row_major { mc / MR * MR } else { 0 };
                    if full < mc {
                        pack_a(a, ic + full, mc - full, pc, kc, &mut pa[full * kc..]);
                    }
                    for jr in (0..nc).step_by(NR) {
                        let cols = NR.min(nc - jr);
                        let bp = pb.as_ptr().add(jr * kc);
                        for ir in (0..mc).step_by(MR) {
                            let rows = MR.min(mc - ir);
                            let cp = c.add((ic + ir) * ldc + jc + jr);
                            let tile = Tile {
                                c: cp,
                                ldc,
                                rows,
                                cols,
                                beta,
                                accumulate: acc,
                                bias: if acc || bias.is_null() {
                                    std::ptr::null()
                                } else {
                                    bias.add(jc + jr)
                                },
                            };
                            if ir < full {
                                let ap = a.ptr.add((ic + ir) * a.rs + pc);
                                kernel_row_major(kc, ap, a.rs, bp, tile);
                            } else {
                                kernel_packed(kc, pa.as_ptr().add(ir * kc), bp, tile);
                            }
                        }
                    }
                }
            }
        }
    });
}

/// Packs B[pc.., jc..] (kc × nc) into panels of NR columns: panel q holds, for each p, the NR
/// values B[pc + p, jc + q·NR ..], zero-padded past nc.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_b(b: Operand, pc: usize, kc: usize, jc: usize, nc: usize, out: &mut [f32]) {
    for (q, jr) in (0..nc).step_by(NR).enumerate() {
        let cols = NR.min(nc - jr);
        let panel = &mut out[q * NR * kc..(q + 1) * NR * kc];
        if b.cs == 1 {
            // Row-major B: two vector copies per k step, lanes past `cols` zero (a
            // `copy_nonoverlapping` of a run-time length was a call to memcpy per 128 bytes).
            let (m0, m1) = lane_masks(cols);
            for p in 0..kc {
                let src = b.ptr.add((pc + p) * b.rs + jc + jr);
                let dst = panel.as_mut_ptr().add(p * NR);
                _mm512_storeu_ps(dst, _mm512_maskz_loadu_ps(m0, src));
                _mm512_storeu_ps(dst.add(16), _mm512_maskz_loadu_ps(m1, src.add(16)));
            }
        } else if b.rs == 1 {
            // Transposed operand (a weight Wᵀ, attention's Kᵀ and Vᵀ): panel column j is a
            // stored row, contiguous along k. Each half of the panel takes 16 such rows, 16 k
            // steps at a time, and transposes them in registers. Gathering the 32 values of
            // each k step instead took most of this pack's time on a Zen 4 (AVX-512 gathers
            // are microcoded there), 4 % of a training step at d_model 512.
            for half in 0..NR / 16 {
                let j0 = 16 * half;
                let live = cols.saturating_sub(j0).min(16);
                let first = b.ptr.add(pc + (jc + jr + j0) * b.cs);
                for p0 in (0..kc).step_by(16) {
                    let steps = (kc - p0).min(16);
                    let (mask, _) = lane_masks(steps);
                    let dst = panel.as_mut_ptr().add(p0 * NR + j0);
                    let mut r = [_mm512_setzero_ps(); 16];
                    if live == 16 && steps == 16 {
                        // The common case, with constant bounds so that the compiler can keep
                        // the block in registers.
                        for (j, row) in r.iter_mut().enumerate() {
                            *row = _mm512_loadu_ps(first.add(j * b.cs + p0));
                        }
                        for (p, v) in transpose16(r).iter().enumerate() {
                            _mm512_storeu_ps(dst.add(p * NR), *v);
                        }
                        continue;
                    }
                    for (j, row) in r.iter_mut().enumerate().take(live) {
                        *row = _mm512_maskz_loadu_ps(mask, first.add(j * b.cs + p0));
                    }
                    for (p, v) in transpose16(r).iter().enumerate().take(steps) {
                        _mm512_storeu_ps(dst.add(p * NR), *v);
                    }
                }
            }
        } else {
            // Any other layout: walk each column along k.
            for j in 0..NR {
                if j < cols {
                    let col = b.ptr.add(pc * b.rs + (jc + jr + j) * b.cs);
                    for p in 0..kc {
                        panel[p * NR + j] = *col.add(p * b.rs);
                    }
                } else {
                    for p in 0..kc {
                        panel[p * NR + j] = 0.0;
                    }
                }
            }
        }
    }
}

/// The transpose of a 16 × 16 block held as 16 row vectors: lane i of `out[c]` is lane c of
/// `r[i]`.
/// Pairs of rows are interleaved by 32-bit, then 64-bit elements within each 128-bit lane
/// (after which lane L of vector 4·q + i holds column 4L + i of rows 4q..4q+4), then the
/// 128-bit lanes are regrouped in two rounds of `shuffle_f32x4`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in (0..16).step_by(2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    // u[4q + i]: column 4L + i of rows 4q..4q+4 in each lane L.
    let mut u = [_mm512_setzero_ps(); 16];
    for q in 0..4 {
        let (a, b) = (
            [_mm512_castps_pd(t[4 * q]), _mm512_castps_pd(t[4 * q + 1])],
            [
                _mm512_castps_pd(t[4 * q + 2]),
                _mm512_castps_pd(t[4 * q + 3]),
            ],
        );
        u[4 * q] = _mm512_castpd_ps(_mm512_unpacklo_pd(a[0], b[0]));
        u[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a[0], b[0]));
        u[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a[1], b[1]));
        u[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a[1], b[1]));
    }
    // v[i], v[4 + i] (i < 4): lanes 0 and 2, then 1 and 3, of rows 0..4 and 4..8; v[8..] the
    // same for rows 8..16.
    let mut v = [_mm512_setzero_ps(); 16];
    for h in [0, 8] {
        for i in 0..4 {
            v[h + i] = _mm512_shuffle_f32x4::<0x88>(u[h + i], u[h + 4 + i]);
            v[h + 4 + i] = _mm512_shuffle_f32x4::<0xdd>(u[h + i], u[h + 4 + i]);
        }
    }
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..8 {
        out[c] = _mm512_shuffle_f32x4::<0x88>(v[c], v[c + 8]);
        out[c + 8] = _mm512_shuffle_f32x4::<0xdd>(v[c], v[c + 8]);
    }
    out
}

/// Packs A[ic.., pc..] (mc × kc) into panels of MR rows: panel q holds, for each p, the MR
/// values A[ic + q·MR + r, pc + p], zero-padded past mc. `sgemm` reads full row-major panels
/// in place; their partial last panel and every other layout come here.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_a(a: Operand, ic: usize, mc: usize, pc: usize, kc: usize, out: &mut [f32]) {
    for (q, ir) in (0..mc).step_by(MR).enumerate() {
        let rows = MR.min(mc - ir);
        let panel = &mut out[q * MR * kc..(q + 1) * MR * kc];
        if a.rs == 1 {
            // Transposed A: the MR values of each k step are adjacent; one masked vector copy.
            let (mask, _) = lane_masks(rows);
            let (store, _) = lane_masks(MR);
            for p in 0..kc {
                let src = a.ptr.add(ic + ir + (pc + p) * a.cs);
                let v = _mm512_maskz_loadu_ps(mask, src);
                _mm512_mask_storeu_ps(panel.as_mut_ptr().add(p * MR), store, v);
            }
            continue;
        }
        for r in 0..MR {
            if r < rows {
                let row = a.ptr.add((ic + ir + r) * a.rs + pc * a.cs);
                for p in 0..kc {
                    panel[p * MR + r] = *row.add(p * a.cs);
                }
            } else {
                for p in 0..kc {
                    panel[p * MR + r] = 0.0;
                }
            }
        }
    }
}

/// The lanes of a panel row's two 16-lane halves that hold one of its first `cols` (≤ NR)
/// values.
#[cfg(target_arch = "x86_64")]
fn lane_masks(cols: usize) -> (__mmask16, __mmask16) {
    let first = |n: usize| -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            ((1u32 << n) - 1) as u16
        }
    };
    (first(cols), first(cols.saturating_sub(16)))
}

/// Where a microkernel writes its tile: C rows × cols (≤ MR × NR) at `c`, row stride `ldc`,
/// as [C +] beta · product.
#[derive(Clone, Copy)]
struct Tile {
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    beta: f32,
    accumulate: bool,
    /// The tile's `cols` bias values, added when not accumulating; null for none.
    bias: *const f32,
}

/// The MR × NR tile of A·B over kc, A element (r, p) at `a + r·a_rs + p·a_cs`, B a packed panel.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn kernel_body(kc: usize, a: *const f32, a_rs: usize, a_cs: usize, bp: *const f32, t: Tile) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    // One k step: two B vectors, MR broadcasts of A, 2·MR fused multiply-adds.
    let step = |acc: &mut [[__m512; 2]; MR], p: usize| {
        let b0 = _mm512_loadu_ps(bp.add(p * NR));
        let b1 = _mm512_loadu_ps(bp.add(p * NR + 16));
        let ap = a.add(p * a_cs);
        for (r, row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*ap.add(r * a_rs));
            row[0] = _mm512_fmadd_ps(av, b0, row[0]);
            row[1] = _mm512_fmadd_ps(av, b1, row[1]);
        }
    };
    // Unrolled by 4 (the same k order, so the same sums). rustc 1.95 makes one copy of this
    // body for both layouts, with the strides known only at run time, and computes each
    // broadcast's address with an add of its own: 48 adds beside the 96 multiply-adds of four
    // steps. Copies with the layout fixed take 3-7 (with an asm barrier in the row-major one,
    // else its broadcasts are loaded early and spilled), but a Zen 4 ran them at the same
    // speed (it issues one 16-lane multiply-add a cycle, and the adds go elsewhere) and
    // llvm-mca's Ice Lake server model predicts 53 and 52-53 cycles per four steps either
    // way, against 48 for the multiply-adds alone; see docs/benchmarks-journal.md.
    let mut p = 0;
    while p + 4 <= kc {
        step(&mut acc, p);
        step(&mut acc, p + 1);
        step(&mut acc, p + 2);
        step(&mut acc, p + 3);
        p += 4;
    }
    while p < kc {
        step(&mut acc, p);
        p += 1;
    }
    let beta_v = _mm512_set1_ps(t.beta);
    let cols = t.cols;
    let (m0, m1) = lane_masks(cols);
    let bias = if t.bias.is_null() {
        [_mm512_setzero_ps(); 2]
    } else {
        [
            _mm512_maskz_loadu_ps(m0, t.bias),
            _mm512_maskz_loadu_ps(m1, t.bias.add(16)),
        ]
    };
    for (r, row) in acc.iter().enumerate().take(t.rows) {
        let dst = t.c.add(r * t.ldc);
        for (half, (&v, mask)) in row.iter().zip([m0, m1]).enumerate() {
            if mask == 0 {
                continue;
            }
            let d = dst.add(16 * half);
            let mut out = _mm512_mul_ps(beta_v, v);
            if t.accumulate {
                out = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, d), out);
            } else if !t.bias.is_null() {
                out = _mm512_add_ps(bias[half], out);
            }
            _mm512_mask_storeu_ps(d, mask, out);
        }
    }
}

/// A packed panel: the MR values of each k step adjacent (a constant stride, so every
/// broadcast is a fixed displacement from one pointer).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel_packed(kc: usize, a: *const f32, bp: *const f32, t: Tile) {
    kernel_body(kc, a, 1, MR, bp, t)
}

/// A row-major, read in place: MR rows `a_rs` apart, each contiguous along k.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel_row_major(kc: usize, a: *const f32, a_rs: usize, bp: *const f32, t: Tile) {
    kernel_body(kc, a, a_rs, 1, bp, t)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn transpose16_swaps_rows_and_columns() {
        if !available() {
            return;
        }
        let m: Vec<f32> = (0..256).map(|i| i as f32).collect();
        // SAFETY: AVX-512F is available (checked above); each load reads 16 of m's values.
        let out = unsafe {
            let rows: [__m512; 16] =
                std::array::from_fn(|i| _mm512_loadu_ps(m.as_ptr().add(16 * i)));
            transpose16(rows)
        };
        for (c, v) in out.iter().enumerate() {
            let mut col = [0f32; 16];
            // SAFETY: col holds 16 values.
            unsafe { _mm512_storeu_ps(col.as_mut_ptr(), *v) };
            let want: Vec<f32> = (0..16).map(|i| m[16 * i + c]).collect();
            assert_eq!(col.to_vec(), want, "column {c}");
        }
    }

    /// Row-major (rs = cols) or transposed (rs = 1) storage of an r × c matrix given row-major.
    fn stored(x: &[f32], rows: usize, cols: usize, transposed: bool) -> (Vec<f32>, usize, usize) {
        if transposed {
            let t = (0..rows * cols)
                .map(|i| x[(i % rows) * cols + i / rows])
                .collect();
            (t, 1, rows)
        } else {
            (x.to_vec(), cols, 1)
        }
    }

    #[test]
    fn matches_a_naive_product_on_odd_shapes_strides_and_accumulation() {
        if !available() {
            return; // The caller falls back to the `gemm` crate on such CPUs.
        }
        let shapes = [
            (1, 1, 1),
            (13, 33, 7),
            (120, 1024, 256),
            (131, 1050, 300),
            (5, 17, 600),
        ];
        for &(m, n, k) in &shapes {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
                .collect();
            let mut want = vec![0.0f64; m * n];
            for i in 0..m {
                for j in 0..n {
                    for p in 0..k {
                        want[i * n + j] += a[i * k + p] as f64 * b[p * n + j] as f64;
                    }
                }
            }
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let (a_data, a_rs, a_cs) = stored(&a, m, k, ta);
                let (b_data, b_rs, b_cs) = stored(&b, k, n, tb);
                let a_op = Operand {
                    ptr: a_data.as_ptr(),
                    rs: a_rs,
                    cs: a_cs,
                };
                let b_op = Operand {
                    ptr: b_data.as_ptr(),
                    rs: b_rs,
                    cs: b_cs,
                };
                let ldc = n + 3;
                let mut c = vec![1.0f32; m * ldc];
                // SAFETY: the CPU has AVX-512F; every buffer covers the addressed elements.
                unsafe {
                    sgemm(
                        m,
                        n,
                        k,
                        a_op,
                        b_op,
                        c.as_mut_ptr(),
                        ldc,
                        0.5,
                        true,
                        std::ptr::null(),
                    )
                };
                for i in 0..m {
                    for j in 0..n {
                        let expect = 1.0 + 0.5 * want[i * n + j];
                        let got = c[i * ldc + j] as f64;
                        let at = (m, n, k, ta, tb, i, j);
                        assert!((got - expect).abs() < 1e-3, "{at:?}: {got} vs {expect}");
                    }
                    // The padding columns of each C row are left alone.
                    assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|&v| v == 1.0));
                }
            }
        }
    }

    #[test]
    fn overwrites_without_accumulate_and_handles_k_zero() {
        if !available() {
            return;
        }
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let b = [1.0f32, 0.0, 0.0, 1.0];
        let mut c = [f32::NAN; 4];
        let op = |p: &[f32]| Operand {
            ptr: p.as_ptr(),
            rs: 2,
            cs: 1,
        };
        // SAFETY: AVX-512F present; 2×2 buffers.
        unsafe {
            sgemm(
                2,
                2,
                2,
                op(&a),
                op(&b),
                c.as_mut_ptr(),
                2,
                1.0,
                false,
                std::ptr::null(),
            )
        };
        assert_eq!(c, a);
        unsafe {
            sgemm(
                2,
                2,
                0,
                op(&a),
                op(&b),
                c.as_mut_ptr(),
                2,
                1.0,
                false,
                std::ptr::null(),
            )
        };
        assert_eq!(c, [0.0; 4]);
    }

    #[test]
    fn a_bias_start_gives_the_bits_of_filling_the_bias_and_accumulating() {
        if !available() {
            return;
        }
        // Partial tiles in both directions, several blocks along k, and k = 0.
        for &(m, n, k) in &[(13, 45, 300), (12, 32, 7), (3, 70, 1), (5, 9, 0)] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.3)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 3 % 7) as f32 - 3.0) * 0.7)
                .collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.25 - 4.0).collect();
            let a_op = Operand {
                ptr: a.as_ptr(),
                rs: k,
                cs: 1,
            };
            let b_op = Operand {
                ptr: b.as_ptr(),
                rs: n,
                cs: 1,
            };
            let mut filled: Vec<f32> = (0..m).flat_map(|_| bias.iter().copied()).collect();
            let mut started = vec![f32::NAN; m * n];
            // SAFETY: AVX-512F present; every buffer covers the addressed elements.
            unsafe {
                sgemm(
                    m,
                    n,
                    k,
                    a_op,
                    b_op,
                    filled.as_mut_ptr(),
                    n,
                    1.0,
                    true,
                    std::ptr::null(),
                );
                sgemm(
                    m,
                    n,
                    k,
                    a_op,
                    b_op,
                    started.as_mut_ptr(),
                    n,
                    1.0,
                    false,
                    bias.as_ptr(),
                );
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&started), bits(&filled), "shape {:?}", (m, n, k));
        }
    }
}
