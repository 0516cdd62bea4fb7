//! Single-threaded GEMM calls on strided views, and the parallel loop that spreads them over
//! candle's CPU thread pool: the fused attention and linear ops split work into independent
//! blocks (heads, row ranges) and run one single-threaded GEMM per block, so every worker
//! thread comes from one pool instead of candle's element-wise pool plus rayon's GEMM pool
//! competing for the same cores. The LayerNorm, cross-entropy and bias-sum kernels use the
//! same loop for their row and column blocks.

use std::sync::Mutex;

use candle_core::{bail, Result};

use super::fused::{Real, PAR_MIN_ELEMS};
#[cfg(target_arch = "x86_64")]
use super::sgemm;

/// A raw pointer the worker threads write through, each to its own disjoint region.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub(crate) *mut T);
// SAFETY: every user writes only the elements of its own block (a (batch, head) pair, a range
// of rows or columns), so no two threads touch the same element, and the buffer outlives the
// parallel section.
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper, not the field).
    pub(crate) fn ptr(self) -> *mut T {
        self.0
    }
}

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
    if dv.last(m, n) >= dst_len || lv.last(m, k) >= lhs.len() || rv.last(k, n) >= rhs.len() {
        bail!("gemm: view out of bounds");
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
        // region is this caller's alone (see `SharedMut`).
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
            );
        }
        return Ok(());
    }
    // SAFETY: all three views were checked to lie inside their buffers; `dst` is valid for
    // `dst_len` elements and the region written is this caller's alone (see `SharedMut`).
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

/// Runs `f(i)` for every `i < items`, on candle's pool when there is enough work (in
/// multiply-adds or elements), stopping at the first error.
pub(crate) fn try_for_each(
    items: usize,
    work_per_item: usize,
    f: impl Fn(usize) -> Result<()> + Sync,
) -> Result<()> {
    if candle_core::utils::get_num_threads() <= 1 || items * work_per_item < PAR_MIN_ELEMS {
        return (0..items).try_for_each(f);
    }
    let failure: Mutex<Option<candle_core::Error>> = Mutex::new(None);
    candle_core::utils::barrier_pool().execute_chunked(items, |range| {
        for p in range {
            if let Err(e) = f(p) {
                if let Ok(mut slot) = failure.lock() {
                    slot.get_or_insert(e);
                }
                return;
            }
        }
    });
    match failure.into_inner() {
        Ok(Some(e)) => Err(e),
        _ => Ok(()),
    }
}
