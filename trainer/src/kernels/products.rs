//! Several GEMMs into disjoint regions of one output buffer, in one parallel section: a
//! linear layer's product split into blocks of rows (one per thread), or all the experts'
//! products of an MoE layer at once.

use candle_core::{bail, Result};

use super::gemm::{gemm_bias_into, View};
use super::parallel::{for_each_block, SharedMut};
use super::real::Real;

/// A new vector of `len` values, written by `products`.
///
/// # Safety
/// The products' regions must cover 0..len (each value is written once and never read, and an
/// uncovered value would be uninitialised memory).
pub(crate) unsafe fn written_by<T: Real>(
    len: usize,
    products: &[Product<'_, T>],
) -> Result<Vec<T>> {
    let mut out = Vec::<T>::with_capacity(len);
    products_into(products, (SharedMut(out.as_mut_ptr()), len))?;
    // SAFETY: the products wrote every value of 0..len (the caller's promise).
    unsafe { out.set_len(len) };
    Ok(out)
}

/// One product of `products_into`: rows × cols values at `off` of the output (row stride
/// cols) = lhs (rows, k) · rhs (k, cols) [+ bias on every row].
pub(crate) struct Product<'a, T> {
    pub(crate) dims: (usize, usize, usize),
    pub(crate) off: usize,
    pub(crate) lhs: &'a [T],
    pub(crate) lv: View,
    pub(crate) rhs: &'a [T],
    pub(crate) rv: View,
    pub(crate) bias: Option<&'a [T]>,
}

/// Several products into disjoint regions of one buffer `dst` = (pointer, length), in one
/// parallel section of blocks of rows (`row_blocks`), every block one single-threaded GEMM
/// that writes (never reads) its rows. The MoE experts' grouped op runs all experts' products
/// this way: one section per expert left the threads waiting for each other at the end of
/// every expert (with 8 experts, 48 sections per layer and step), where the pool's dynamic
/// hand-out of blocks balances them across experts. Every value of a product is the same sum
/// in the same order whichever rows its block has, so the blocks do not change the values.
pub(crate) fn products_into<T: Real>(
    products: &[Product<'_, T>],
    (ptr, len): (SharedMut<T>, usize),
) -> Result<()> {
    for product in products {
        let (rows, cols, _) = product.dims;
        if product.off + rows * cols > len {
            bail!("linear: output rows past the buffer");
        }
    }
    let threads = candle_core::utils::get_num_threads().max(1);
    let dims: Vec<_> = products.iter().map(|p| p.dims).collect();
    let (blocks, work) = row_blocks(&dims, threads);
    for_each_block(blocks.len(), work, |b| {
        let (p, r0, r1) = blocks[b];
        let Product {
            dims: (_, cols, k),
            off,
            lhs,
            lv,
            rhs,
            rv,
            bias,
        } = products[p];
        if bias.is_none() && k == 0 {
            // An empty product is zero (and the `gemm` crate writes nothing for it).
            // SAFETY: rows r0..r1 of the output lie inside the buffer (checked above) and
            // belong to this block alone.
            unsafe { std::ptr::write_bytes(ptr.ptr().add(off + r0 * cols), 0, (r1 - r0) * cols) };
        }
        gemm_bias_into(
            (r1 - r0, cols, k),
            ptr.ptr(),
            len,
            View::rows(off + r0 * cols, cols),
            lhs,
            lv.skip_rows(r0),
            rhs,
            rv,
            T::one(),
            false,
            bias,
        )
    })
}

/// The blocks (product, first row, end row) that `products_into` runs for products of
/// `dims` (rows, cols, k) on `threads` threads, largest first, and the products' total
/// multiply-adds.
///
/// Each block packs the whole B operand (k × cols) of its product for itself, so splitting a
/// product repeats that work once per block. A product is split only as far as balance needs:
/// into blocks of at most a thread's share of all the work (and at least 16 rows). With many
/// small products (the experts of an MoE layer) that leaves them whole, and the pool balances
/// them, largest first, so the last one to start is a short one; when that leaves fewer than
/// two blocks per thread, too few to balance, every product is split into one block per
/// thread, as a single product (a dense layer) always is.
fn row_blocks(
    dims: &[(usize, usize, usize)],
    threads: usize,
) -> (Vec<(usize, usize, usize)>, usize) {
    let threads = threads.max(1);
    let total: usize = dims.iter().map(|&(r, c, k)| r * c * k).sum();
    let share = total.div_ceil(threads).max(1);
    let mut counts: Vec<usize> = dims
        .iter()
        .map(|&(rows, cols, k)| {
            (rows * cols * k)
                .div_ceil(share)
                .min(threads)
                .min(rows / 16)
                .max(1)
        })
        .collect();
    if dims.len() == 1 || counts.iter().sum::<usize>() < 2 * threads {
        counts = (0..dims.len())
            .map(|p| threads.min(dims[p].0 / 16).max(1))
            .collect();
    }
    let mut blocks = Vec::new();
    for (p, &n) in counts.iter().enumerate() {
        let rows = dims[p].0;
        blocks.extend((0..n).map(|i| (p, i * rows / n, (i + 1) * rows / n)));
    }
    // Largest first (a stable sort: equal blocks keep their order).
    let size = |&(p, r0, r1): &(usize, usize, usize)| (r1 - r0) * dims[p].1 * dims[p].2;
    blocks.sort_by_key(|b| std::cmp::Reverse(size(b)));
    (blocks, total)
}

#[cfg(test)]
mod tests {
    use super::row_blocks;

    /// Every row of every product in exactly one block, blocks largest first.
    fn check_cover(dims: &[(usize, usize, usize)], blocks: &[(usize, usize, usize)]) {
        for (p, &(rows, _, _)) in dims.iter().enumerate() {
            let mut mine: Vec<_> = blocks.iter().filter(|b| b.0 == p).collect();
            mine.sort_by_key(|b| b.1);
            let mut next = 0;
            for &&(_, r0, r1) in &mine {
                assert_eq!(r0, next, "product {p}: {mine:?}");
                next = r1;
            }
            assert_eq!(next, rows, "product {p}: {mine:?}");
        }
        let size = |&(p, r0, r1): &(usize, usize, usize)| (r1 - r0) * dims[p].1 * dims[p].2;
        assert!(
            blocks.windows(2).all(|w| size(&w[0]) >= size(&w[1])),
            "{blocks:?}"
        );
    }

    #[test]
    fn a_single_product_gets_one_block_of_rows_per_thread() {
        let dims = [(2048, 512, 128)];
        let (blocks, work) = row_blocks(&dims, 2);
        assert_eq!(blocks.len(), 2);
        assert_eq!(work, 2048 * 512 * 128);
        check_cover(&dims, &blocks);
        // At least 16 rows a block.
        let (blocks, _) = row_blocks(&[(40, 512, 128)], 8);
        assert_eq!(blocks.len(), 2);
    }

    #[test]
    fn many_small_products_stay_whole_and_run_largest_first() {
        // Eight experts with uneven rows on two threads: no expert is split (each block would
        // pack the expert's whole weight again), the largest runs first.
        let rows = [500, 530, 470, 512, 600, 420, 512, 500];
        let dims: Vec<_> = rows.iter().map(|&r| (r, 512, 128)).collect();
        let (blocks, _) = row_blocks(&dims, 2);
        assert_eq!(blocks.len(), 8);
        assert_eq!(blocks[0], (4, 0, 600));
        check_cover(&dims, &blocks);
    }

    #[test]
    fn a_product_larger_than_a_threads_share_is_split() {
        // One expert with most of the rows: whole, it alone would outlast the rest together.
        let dims = [
            (3000, 512, 128),
            (200, 512, 128),
            (200, 512, 128),
            (100, 512, 128),
        ];
        let (blocks, _) = row_blocks(&dims, 2);
        assert_eq!(blocks.iter().filter(|b| b.0 == 0).count(), 2);
        assert_eq!(blocks.len(), 5);
        check_cover(&dims, &blocks);
    }

    #[test]
    fn too_few_products_to_balance_are_each_split_per_thread() {
        // Three equal products on two threads: three whole blocks would leave one thread idle
        // for a third of the time, so each is split in two.
        let dims = [(600, 128, 128); 3];
        let (blocks, _) = row_blocks(&dims, 2);
        assert_eq!(blocks.len(), 6);
        check_cover(&dims, &blocks);
    }
}
