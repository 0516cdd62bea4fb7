//! Token (and learned position) embedding tables.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

#[derive(Debug, Clone)]
pub struct Embedding {
    /// (rows, d)
    table: Tensor,
}

impl Embedding {
    pub fn new(rows: usize, dim: usize, vb: VarBuilder) -> Result<Self> {
        let table = vb.get_with_hints(
            (rows, dim),
            "weight",
            Init::Randn {
                mean: 0.0,
                stdev: 0.02,
            },
        )?;
        Ok(Embedding { table })
    }

    /// The table, shared with the output head when embeddings are tied.
    pub fn table(&self) -> &Tensor {
        &self.table
    }
}

impl Module for Embedding {
    /// ids of any shape (u32) → (..ids, d)
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let mut shape = ids.dims().to_vec();
        shape.push(self.table.dim(1)?);
        let flat = ids.flatten_all()?; // (N,)
        crate::kernels::gather_rows(&self.table, &flat)?.reshape(shape) // (.., d)
    }
}
