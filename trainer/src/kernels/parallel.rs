//! The one parallel loop of the kernels: independent blocks of work on candle's CPU thread pool.
//!
//! Every kernel splits its output into blocks that no two threads share (rows, row ranges,
//! column ranges, (batch, head) pairs) and runs them here, so all worker threads come from one
//! pool instead of candle's element-wise pool plus rayon's GEMM pool competing for the same
//! cores. A block computes the same values whichever thread runs it; kernels that also reduce
//! over blocks keep one partial result per block and add them in block order afterwards, so
//! no result depends on the number of threads.

use std::sync::Mutex;

use candle_core::Result;

/// Below this much work (elements, or multiply-adds for GEMMs) a loop runs on the calling
/// thread: waking the pool costs more.
pub(crate) const PAR_MIN_WORK: usize = 64 * 1024;

/// A raw pointer the blocks write through, each to its own disjoint region.
pub(crate) struct SharedMut<T>(pub(crate) *mut T);
// Copy for any T (a derive would ask T: Copy): it is only a pointer.
impl<T> Clone for SharedMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<T> {}
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

/// Runs `f(block)` for every `block < blocks`, on candle's pool when `total_work` is worth it,
/// stopping at the first error.
pub(crate) fn for_each_block(
    blocks: usize,
    total_work: usize,
    f: impl Fn(usize) -> Result<()> + Sync,
) -> Result<()> {
    if candle_core::utils::get_num_threads() <= 1 || total_work < PAR_MIN_WORK {
        return (0..blocks).try_for_each(f);
    }
    let failure: Mutex<Option<candle_core::Error>> = Mutex::new(None);
    candle_core::utils::barrier_pool().execute_chunked(blocks, |range| {
        for block in range {
            if let Err(e) = f(block) {
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

/// `for_each_block` over consecutive chunks of `out`, `chunk` elements each (the last may be
/// shorter): `f(index, chunk)` gets its chunk as a plain mutable slice.
pub(crate) fn for_each_chunk<T: Send>(
    out: &mut [T],
    chunk: usize,
    total_work: usize,
    f: impl Fn(usize, &mut [T]) -> Result<()> + Sync,
) -> Result<()> {
    if chunk == 0 {
        return Ok(());
    }
    let len = out.len();
    let base = SharedMut(out.as_mut_ptr());
    for_each_block(len.div_ceil(chunk), total_work, |i| {
        let start = i * chunk;
        // SAFETY: chunk i is elements start..start+n of `out`, which `out`'s borrow keeps alive
        // and no other block touches.
        let slice = unsafe {
            std::slice::from_raw_parts_mut(base.ptr().add(start), chunk.min(len - start))
        };
        f(i, slice)
    })
}

/// Fills `out` row by row (`cols` values each) with `f(row_index, row)`, in blocks of about
/// 16 Ki elements of whole rows.
pub(crate) fn for_each_row<T: Send>(
    out: &mut [T],
    cols: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) -> Result<()> {
    if cols == 0 {
        return Ok(());
    }
    let rows_per_block = (16 * 1024 / cols).max(1);
    let len = out.len();
    for_each_chunk(out, rows_per_block * cols, len, |b, block| {
        for (i, row) in block.chunks_mut(cols).enumerate() {
            f(b * rows_per_block + i, row);
        }
        Ok(())
    })
}
