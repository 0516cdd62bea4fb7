//! Several GEMMs into disjoint regions of one output buffer, in one parallel section: a
//! linear layer's product split into blocks of rows (a few per thread), all the experts'
//! products of an MoE layer at once, and weight gradients summed over the tokens in chunks.

use candle_core::{bail, Result};

use super::gemm::{gemm_bias_into, View};
use super::parallel::{for_each_block, SharedMut};
use super::real::Real;

/// A new vector of `len` values, written by `products` (`products_into`).
///
/// # Safety
/// The products' regions must cover 0..len (each value is written once and never read, and an
/// uncovered value would be uninitialised memory).
pub(crate) unsafe fn written_by<T: Real>(
    len: usize,
    products: &[Product<'_, T>],
) -> Result<Vec<T>> {
    // SAFETY: the caller's promise.
    unsafe { filled(len, products, products_into) }
}

/// A new vector of `len` values, written by `products` summed over k in chunks
/// (`summed_products_into`).
///
/// # Safety
/// As `written_by`.
pub(crate) unsafe fn summed_by<T: Real>(len: usize, products: &[Product<'_, T>]) -> Result<Vec<T>> {
    // SAFETY: the caller's promise.
    unsafe { filled(len, products, summed_products_into) }
}

/// # Safety
/// As `written_by`.
unsafe fn filled<T: Real>(
    len: usize,
    products: &[Product<'_, T>],
    into: fn(&[Product<'_, T>], Dst<T>) -> Result<()>,
) -> Result<Vec<T>> {
    let mut out = Vec::<T>::with_capacity(len);
    into(products, (SharedMut(out.as_mut_ptr()), len))?;
    // SAFETY: the products wrote every value of 0..len (the caller's promise).
    unsafe { out.set_len(len) };
    Ok(out)
}

/// A destination buffer: (pointer, length).
type Dst<T> = (SharedMut<T>, usize);

/// One product of `products_into`: rows × cols values at `off` of the output (row stride
/// cols) = lhs (rows, k) · rhs (k, cols) [+ bias on every row].
#[derive(Clone, Copy)]
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
pub(crate) fn products_into<T: Real>(products: &[Product<'_, T>], dst: Dst<T>) -> Result<()> {
    run(&[(products, dst)])
}

/// Products whose k is long (a weight gradient sums over every token of the batch) into
/// `dst`, like `products_into`, each summed over k in `k_chunks(k)` chunks: chunk 0 written
/// in place, the others into scratch buffers, all in one parallel section, then added in
/// chunk order. Split by rows instead, every block packed the whole k × cols operand (the
/// layer's input x) for itself, so each thread read and packed all of it; split along k, each
/// chunk packs its own tokens once. The chunks depend on k alone, never on the thread count,
/// so neither do the values.
pub(crate) fn summed_products_into<T: Real>(
    products: &[Product<'_, T>],
    (ptr, len): Dst<T>,
) -> Result<()> {
    let mut direct = Vec::with_capacity(products.len());
    let mut partial = Vec::new();
    let mut adds = Vec::new(); // (offset in dst, size, first partial's offset in scratch, partials)
    for p in products {
        let (rows, cols, k) = p.dims;
        let chunks = k_chunks(k);
        let chunk = |c: usize, off: usize| Product {
            dims: (rows, cols, (c + 1) * k / chunks - c * k / chunks),
            off,
            lv: p.lv.skip_cols(c * k / chunks),
            rv: p.rv.skip_rows(c * k / chunks),
            bias: if c == 0 { p.bias } else { None }, // the bias once, in chunk 0
            ..*p
        };
        direct.push(chunk(0, p.off));
        if chunks > 1 {
            let first = partial.len() * rows * cols;
            adds.push((p.off, rows * cols, first, chunks - 1));
            partial.extend((1..chunks).map(|c| chunk(c, first + (c - 1) * rows * cols)));
        }
    }
    if partial.is_empty() {
        return products_into(&direct, (ptr, len));
    }
    let scratch_len = adds.iter().map(|&(_, size, _, n)| size * n).sum();
    let mut scratch = Vec::<T>::with_capacity(scratch_len);
    let scratch_ptr = SharedMut(scratch.as_mut_ptr());
    run(&[
        (&direct, (ptr, len)),
        (&partial, (scratch_ptr, scratch_len)),
    ])?;
    // SAFETY: the partial products cover the scratch buffer (each chunk all of its region).
    unsafe { scratch.set_len(scratch_len) };
    // dst region += its partials, in chunk order, in pieces of 16 Ki values.
    const PIECE: usize = 16 * 1024;
    let pieces: Vec<(usize, usize)> = adds
        .iter()
        .enumerate()
        .flat_map(|(a, &(_, size, _, _))| (0..size).step_by(PIECE).map(move |s| (a, s)))
        .collect();
    for_each_block(pieces.len(), scratch_len, |i| {
        let (a, start) = pieces[i];
        let (off, size, first, n) = adds[a];
        let end = size.min(start + PIECE);
        // SAFETY: the region lies inside dst (checked by `run`) and this piece of it belongs
        // to this block alone; the products wrote it before this section.
        let out =
            unsafe { std::slice::from_raw_parts_mut(ptr.ptr().add(off + start), end - start) };
        for c in 0..n {
            let part = &scratch[first + c * size + start..first + c * size + end];
            for (o, &v) in out.iter_mut().zip(part) {
                *o += v;
            }
        }
        Ok(())
    })
}

/// How many chunks `summed_products_into` sums a product's k in: one per 1,024 (so a
/// weight gradient over 2,048 tokens has two, one per thread on a 2-core machine), at most 8
/// (each chunk after the first holds a whole partial product).
fn k_chunks(k: usize) -> usize {
    (k / 1024).clamp(1, 8)
}

/// The one parallel section of `products_into` and `summed_products_into`: every product of
/// every (products, destination) pair, in the blocks of `row_blocks`.
fn run<T: Real>(targets: &[(&[Product<'_, T>], Dst<T>)]) -> Result<()> {
    let mut all = Vec::new(); // (target, product)
    for (t, (products, (_, len))) in targets.iter().enumerate() {
        for (p, product) in products.iter().enumerate() {
            let (rows, cols, _) = product.dims;
            if product.off + rows * cols > *len {
                bail!("linear: output rows past the buffer");
            }
            all.push((t, p));
        }
    }
    let threads = candle_core::utils::get_num_threads().max(1);
    let dims: Vec<_> = all.iter().map(|&(t, p)| targets[t].0[p].dims).collect();
    let (blocks, work) = row_blocks(&dims, threads);
    for_each_block(blocks.len(), work, |b| {
        let (i, r0, r1) = blocks[b];
        let (t, p) = all[i];
        let (ptr, len) = targets[t].1;
        let Product {
            dims: (_, cols, k),
            off,
            lhs,
            lv,
            rhs,
            rv,
            bias,
        } = targets[t].0[p];
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

/// How many blocks of rows per thread a product split for balance gets. With one per thread,
/// a thread that ran slower than the other (preempted by another process, or sharing its core)
/// left the other waiting at the end of every section: in-process timings of the dense step
/// on a 2-core AMD EPYC (Zen 3) with a process busy 30 % of the time on one core were 3-7 %
/// faster with four, and the same within noise on a quiet host: the extra packing of B is
/// k × cols values per block against its rows × k × cols multiply-adds (a 256th for the
/// 256-row blocks of a 2,048-token batch).
const BLOCKS_PER_THREAD: usize = 4;

/// The blocks (product, first row, end row) that `products_into` runs for products of
/// `dims` (rows, cols, k) on `threads` threads, largest first, and the products' total
/// multiply-adds.
///
/// Each block packs the whole B operand (k × cols) of its product for itself, so splitting a
/// product repeats that work once per block. A product is split only as far as balance needs:
/// into blocks of at most a thread's share of all the work (and at least 16 rows). With many
/// small products (the experts of an MoE layer, the k chunks of a weight gradient) that leaves
/// them whole, and the pool hands them out largest first, so the last one to start is a short
/// one. When even that would leave a thread working more than a quarter longer than an even
/// share (three equal products on two threads), every product is split into
/// `BLOCKS_PER_THREAD` blocks per thread, as a single product (a dense layer's) always is.
pub(crate) fn row_blocks(
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
    if dims.len() == 1 || 4 * longest_thread(dims, &counts, threads) > 5 * share {
        counts = (0..dims.len())
            .map(|p| (threads * BLOCKS_PER_THREAD).min(dims[p].0 / 16).max(1))
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

/// The most work one of `threads` threads gets when the products of `dims`, split into
/// `counts` equal blocks, are handed out largest first, each to the least loaded thread.
fn longest_thread(dims: &[(usize, usize, usize)], counts: &[usize], threads: usize) -> usize {
    let mut sizes: Vec<usize> = dims
        .iter()
        .zip(counts)
        .flat_map(|(&(r, c, k), &n)| std::iter::repeat_n(r * c * k / n, n))
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let mut load = vec![0; threads];
    for size in sizes {
        if let Some(least) = load.iter_mut().min() {
            *least += size;
        }
    }
    load.into_iter().max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_over_k_chunks_is_chunk_zero_then_each_partial_in_order() {
        // k = 2,500: two chunks (0..1250, 1250..2500); the lhs is a transposed view, as a
        // weight gradient's gᵀ.
        let (rows, cols, k) = (37, 45, 2500);
        let a: Vec<f32> = (0..k * rows)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.37)
            .collect();
        let b: Vec<f32> = (0..k * cols)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.29)
            .collect();
        let at = |rows| View::rows(0, rows).transposed();
        let whole = Product {
            dims: (rows, cols, k),
            off: 0,
            lhs: &a,
            lv: at(rows),
            rhs: &b,
            rv: View::rows(0, cols),
            bias: None,
        };
        // SAFETY: the product covers all rows × cols values.
        let summed = unsafe { summed_by(rows * cols, &[whole]) }.unwrap();
        let half = |c: usize| Product {
            dims: (rows, cols, k / 2),
            lv: at(rows).skip_cols(c * k / 2),
            rv: View::rows(0, cols).skip_rows(c * k / 2),
            ..whole
        };
        // SAFETY: as above.
        let parts = [0, 1].map(|c| unsafe { written_by(rows * cols, &[half(c)]) }.unwrap());
        let expect: Vec<u32> = parts[0]
            .iter()
            .zip(&parts[1])
            .map(|(x, y)| (x + y).to_bits())
            .collect();
        assert_eq!(
            summed.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            expect
        );
        // And it is the product: against a sum in f64.
        for i in 0..rows {
            for j in 0..cols {
                let want: f64 = (0..k)
                    .map(|p| a[p * rows + i] as f64 * b[p * cols + j] as f64)
                    .sum();
                let got = summed[i * cols + j] as f64;
                assert!(
                    (got - want).abs() < 1e-2 * (1.0 + want.abs()),
                    "{i},{j}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn k_is_chunked_by_its_length_alone() {
        assert_eq!(
            [1, 1023, 2047, 2048, 5000, 1 << 20].map(k_chunks),
            [1, 1, 1, 2, 4, 8]
        );
    }

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
    fn a_single_product_gets_a_few_blocks_of_rows_per_thread() {
        let dims = [(2048, 512, 128)];
        let (blocks, work) = row_blocks(&dims, 2);
        assert_eq!(blocks.len(), 2 * BLOCKS_PER_THREAD);
        assert_eq!(work, 2048 * 512 * 128);
        check_cover(&dims, &blocks);
        // At least 16 rows a block.
        let (blocks, _) = row_blocks(&[(40, 512, 128)], 8);
        assert_eq!(blocks.len(), 2);
        let (blocks, _) = row_blocks(&[(100, 512, 128)], 2);
        assert_eq!(blocks.len(), 6);
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
    fn too_few_products_to_balance_are_each_split_as_a_single_one() {
        // Three equal products on two threads: three whole blocks would leave one thread idle
        // for a third of the time, so each is split as a single product would be.
        let dims = [(600, 128, 128); 3];
        let (blocks, _) = row_blocks(&dims, 2);
        assert_eq!(blocks.len(), 3 * 2 * BLOCKS_PER_THREAD);
        check_cover(&dims, &blocks);
    }
}
