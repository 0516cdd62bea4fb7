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

use super::real::Real;

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

/// A new vector of `len` elements, filled chunk by chunk (`chunk` elements each, the last may be
/// shorter) by `f(index, chunk)` on the `for_each_block` loop. Each block zeroes its own chunk
/// just before `f` fills it: a zeroed `vec!` was a single-threaded pass over the whole buffer
/// on the calling thread while the pool waited (with the other fresh outputs, 8 % of a 2-thread
/// step on an Intel Xeon), where this runs in parallel on memory the same core writes next.
pub(crate) fn filled_by_chunks<T: Real>(
    len: usize,
    chunk: usize,
    total_work: usize,
    f: impl Fn(usize, &mut [T]) -> Result<()> + Sync,
) -> Result<Vec<T>> {
    if chunk == 0 || len == 0 {
        return Ok(vec![T::zero(); len]);
    }
    let mut out = Vec::<T>::with_capacity(len);
    let base = SharedMut(out.as_mut_ptr());
    for_each_block(len.div_ceil(chunk), total_work, |i| {
        let start = i * chunk;
        let n = chunk.min(len - start);
        // SAFETY: chunk i is elements start..start+n of `out`'s capacity, which no other block
        // touches; it is zeroed before the slice is made, and all-zero bytes are 0.0 for every
        // `Real` type (f32, f64).
        let slice = unsafe {
            let p = base.ptr().add(start);
            std::ptr::write_bytes(p, 0, n);
            std::slice::from_raw_parts_mut(p, n)
        };
        f(i, slice)
    })?;
    // SAFETY: the blocks cover 0..len and each zeroed its chunk before anything else.
    unsafe { out.set_len(len) };
    Ok(out)
}

/// A new vector of `len` elements filled row by row (`cols` values each) with
/// `f(row_index, row)`, in blocks of about 16 Ki elements of whole rows.
pub(crate) fn filled_by_rows<T: Real>(
    len: usize,
    cols: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) -> Result<Vec<T>> {
    if cols == 0 {
        return Ok(vec![T::zero(); len]);
    }
    let rows_per_block = (16 * 1024 / cols).max(1);
    filled_by_chunks(len, rows_per_block * cols, len, |b, block| {
        for (i, row) in block.chunks_mut(cols).enumerate() {
            f(b * rows_per_block + i, row);
        }
        Ok(())
    })
}
