//! Single-threaded GEMMs on strided views of contiguous buffers: the AVX-512 kernel of `sgemm`
//! for f32 where the CPU has it, the `gemm` crate otherwise. The attention and linear kernels
//! run one of these per independent block (a head, a range of rows) on the `parallel` loop.

use candle_core::{bail, Result};

use super::real::Real;
#[cfg(target_arch = "x86_64")]
use super::sgemm;

/// A strided matrix view: element (i, j) is at `off + i·rs + j·cs`.
#[derive(Clone, Copy)]
pub(crate) struct View {
    off: usize,
    rs: usize,
    cs: usize,
}

impl View {
    pub(crate) fn rows(off: usize, rs: usize) -> Self {
        View { off, rs, cs: 1 }
    }
    pub(crate) fn transposed(self) -> Self {
        View {
            off: self.off,
            rs: self.cs,
            cs: self.rs,
        }
    }
    /// The same matrix without its first `r` rows.
    pub(crate) fn skip_rows(self, r: usize) -> Self {
        View {
            off: self.off + r * self.rs,
            ..self
        }
    }
    /// The same matrix without its first `c` columns.
    pub(crate) fn skip_cols(self, c: usize) -> Self {
        View {
            off: self.off + c * self.cs,
            ..self
        }
    }
    /// The highest index an (m, n) matrix at this view touches.
    fn last(&self, m: usize, n: usize) -> usize {
        self.off + (m.max(1) - 1) * self.rs + (n.max(1) - 1) * self.cs
    }
}

/// dst (m×n) ← [dst +] beta · lhs (m×k) · rhs (k×n), single-threaded (callers parallelise over
/// heads). Bounds are checked up front so the unchecked GEMM stays inside every buffer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_into<T: Real>(
    (m, n, k): (usize, usize, usize),
    dst: *mut T,
    dst_len: usize,
    dv: View,
    lhs: &[T],
    lv: View,
    rhs: &[T],
    rv: View,
    beta: T,
    accumulate: bool,
) -> Result<()> {
    gemm_bias_into(
        (m, n, k),
        dst,
        dst_len,
        dv,
        lhs,
        lv,
        rhs,
        rv,
        beta,
        accumulate,
        None,
    )
}

/// `gemm_into` that, when not accumulating, starts every row of dst from `bias` (n values):
/// dst ← bias + beta · lhs · rhs. Without `accumulate`, dst is only written, never read, so it
/// may be fresh memory.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_bias_into<T: Real>(
    (m, n, k): (usize, usize, usize),
    dst: *mut T,
    dst_len: usize,
    dv: View,
    lhs: &[T],
    lv: View,
    rhs: &[T],
    rv: View,
    beta: T,
    accumulate: bool,
    bias: Option<&[T]>,
) -> Result<()> {
    if dv.last(m, n) >= dst_len || lv.last(m, k) >= lhs.len() || rv.last(k, n) >= rhs.len() {
        bail!("gemm: view out of bounds");
    }
    let bias = if accumulate { None } else { bias };
    if bias.is_some_and(|b| b.len() != n) {
        bail!("gemm: bias of the wrong length");
    }
    #[cfg(target_arch = "x86_64")]
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
        && dv.cs == 1
        && sgemm::available()
    {
        let op = |data: &[T], v: View| sgemm::Operand {
            // T is f32 here, so the cast only renames the element type.
            ptr: data[v.off..].as_ptr() as *const f32,
            rs: v.rs,
            cs: v.cs,
        };
        // SAFETY: AVX-512F is present; the views were checked above, T is f32, and the C
        // region is this caller's alone (see `parallel::SharedMut`).
        unsafe {
            sgemm::sgemm(
                m,
                n,
                k,
                op(lhs, lv),
                op(rhs, rv),
                dst.add(dv.off) as *mut f32,
                dv.rs,
                beta.to_f64() as f32,
                accumulate,
                bias.map_or(std::ptr::null(), |b| b.as_ptr() as *const f32),
            );
        }
        return Ok(());
    }
    let mut accumulate = accumulate;
    if let Some(b) = bias {
        for i in 0..m {
            // SAFETY: row i of the dst view lies inside dst (checked above); `b` has n values.
            unsafe {
                for (j, &v) in b.iter().enumerate() {
                    dst.add(dv.off + i * dv.rs + j * dv.cs).write(v);
                }
            }
        }
        accumulate = true;
    }
    // SAFETY: all three views were checked to lie inside their buffers; `dst` is valid for
    // `dst_len` elements and the region written is this caller's alone
    // (see `parallel::SharedMut`).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.add(dv.off),
            dv.cs as isize,
            dv.rs as isize,
            accumulate,
            lhs.as_ptr().add(lv.off),
            lv.cs as isize,
            lv.rs as isize,
            rhs.as_ptr().add(rv.off),
            rv.cs as isize,
            rv.rs as isize,
            T::one(),
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    Ok(())
}
