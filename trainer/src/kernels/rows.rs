//! Row gathers and scatter-adds along dim 0: the embedding lookup and MoE token routing.
//!
//! On the CPU these are candle's `index_select` and `index_add`. On a GPU candle's versions give
//! each of the D columns one thread that walks all M indices in order (its `index_select`
//! backward is such an `index_add`), which leaves most of the GPU idle; the CUDA kernels give
//! every element its own thread and add into the destination with atomics. The two ops are each
//! other's backward.

use candle_core::{bail, CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::real::slice;

/// `table` (R, D) rows picked by `ids` (M,) u32 → (M, D): `table.index_select(ids, 0)`.
pub fn gather_rows(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    if super::use_cuda_kernel(table, super::CudaKernel::Rows) && ids.dtype() == DType::U32 {
        return table
            .contiguous()?
            .apply_op2(&ids.contiguous()?, GatherRows);
    }
    table.index_select(ids, 0)
}

/// `base` (N, D) plus `src` (M, D) added into rows `ids` (M,) u32: `base.index_add(ids, src, 0)`.
pub fn add_rows(base: &Tensor, ids: &Tensor, src: &Tensor) -> Result<Tensor> {
    if super::use_cuda_kernel(src, super::CudaKernel::Rows) && ids.dtype() == DType::U32 {
        let rows = base.dim(0)?;
        let scattered = src
            .contiguous()?
            .apply_op2(&ids.contiguous()?, ScatterRows { rows })?; // (N, D)
        return base + scattered;
    }
    base.index_add(ids, src, 0)
}

/// (R, D) table, (M,) ids → (M, D) rows; ids past the table give zero rows.
#[derive(Debug, Clone, Copy)]
struct GatherRows;

/// (M, D) rows, (M,) ids → (rows, D): row m added into row ids[m]; ids past `rows` skipped.
#[derive(Debug, Clone, Copy)]
struct ScatterRows {
    rows: usize,
}

fn f32_and_ids<'a>(
    s1: &'a CpuStorage,
    l1: &Layout,
    s2: &'a CpuStorage,
    l2: &Layout,
    op: &str,
) -> Result<(&'a [f32], &'a [u32])> {
    let (CpuStorage::F32(x), CpuStorage::U32(ids)) = (s1, s2) else {
        bail!("{op}: expected f32 values and u32 ids");
    };
    Ok((slice(x, l1, op)?, slice(ids, l2, op)?))
}

impl CustomOp2 for GatherRows {
    fn name(&self) -> &'static str {
        "gather-rows"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (r, d) = l1.shape().dims2()?;
        let (table, ids) = f32_and_ids(s1, l1, s2, l2, self.name())?;
        let mut out = vec![0f32; ids.len() * d];
        for (row, &id) in out.chunks_mut(d.max(1)).zip(ids) {
            if (id as usize) < r {
                row.copy_from_slice(&table[id as usize * d..(id as usize + 1) * d]);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((ids.len(), d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        super::cuda::gather_rows(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        table: &Tensor,
        ids: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let rows = table.dim(0)?;
        let dtable = grad
            .contiguous()?
            .apply_op2_no_bwd(ids, &ScatterRows { rows })?;
        Ok((Some(dtable), None))
    }
}

impl CustomOp2 for ScatterRows {
    fn name(&self) -> &'static str {
        "scatter-add-rows"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, d) = l1.shape().dims2()?;
        let (src, ids) = f32_and_ids(s1, l1, s2, l2, self.name())?;
        let mut out = vec![0f32; self.rows * d];
        for (row, &id) in src.chunks(d.max(1)).zip(ids) {
            if (id as usize) < self.rows {
                let dst = &mut out[id as usize * d..(id as usize + 1) * d];
                for (o, &v) in dst.iter_mut().zip(row) {
                    *o += v;
                }
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((self.rows, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        super::cuda::scatter_add_rows(s1, l1, s2, l2, self.rows)
    }

    fn bwd(
        &self,
        _src: &Tensor,
        ids: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dsrc = grad.contiguous()?.apply_op2_no_bwd(ids, &GatherRows)?;
        Ok((Some(dsrc), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn the_row_ops_compute_index_select_and_index_add_and_are_each_others_gradient() {
        let dev = Device::Cpu;
        let table = Var::new(&[[1f32, 2.], [3., 4.], [5., 6.]], &dev).unwrap();
        let ids = Tensor::new(&[2u32, 0, 2], &dev).unwrap();
        let picked = table.as_tensor().apply_op2(&ids, GatherRows).unwrap();
        assert_eq!(
            picked.to_vec2::<f32>().unwrap(),
            vec![vec![5., 6.], vec![1., 2.], vec![5., 6.]]
        );
        let w = Tensor::new(&[[1f32, 10.], [100., 1000.], [2., 20.]], &dev).unwrap();
        let grads = (picked * &w)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g = grads.get(table.as_tensor()).unwrap();
        // Row 2 was picked twice: its gradient is the sum of both weight rows.
        assert_eq!(
            g.to_vec2::<f32>().unwrap(),
            vec![vec![100., 1000.], vec![0., 0.], vec![3., 30.]]
        );

        let src = Var::new(&[[1f32, 1.], [2., 2.], [3., 3.]], &dev).unwrap();
        let scattered = src
            .as_tensor()
            .apply_op2(&ids, ScatterRows { rows: 3 })
            .unwrap();
        let base = Tensor::zeros((3, 2), DType::F32, &dev).unwrap();
        let reference = base.index_add(&ids, src.as_tensor(), 0).unwrap();
        assert_eq!(
            scattered.to_vec2::<f32>().unwrap(),
            reference.to_vec2::<f32>().unwrap()
        );
        let grads = (scattered * &w)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert_eq!(
            grads
                .get(src.as_tensor())
                .unwrap()
                .to_vec2::<f32>()
                .unwrap(),
            vec![vec![2., 20.], vec![1., 10.], vec![2., 20.]]
        );
    }
}
