//! How an op that reads more tensors than candle's three inputs still gives each of them its
//! gradient: a chain of link nodes.
//!
//! candle's custom ops take at most three tensors. An op on x, its first tensor and more
//! (`gelu_mlp` on every expert's four tensors, `residual` on every step's) takes x, the first
//! tensor and the last link of a chain over the others: the first link on up to three of
//! them, each next one on the link before and up to two more. A link computes nothing and
//! returns one value. The op reads the tensors itself, and its backward leaves their
//! gradients in a shared [`Held`] list, which each link's backward takes its own from. Joining
//! the tensors into one instead would cost a copy forward, and backward a zero-filled buffer
//! and an add for the joined tensor before each tensor's own.

use std::sync::{Arc, Mutex};

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};

/// The gradients of an op's tensors (in the op's order; index 0, the op's own input, is not
/// taken here) that its backward leaves for the links' backward, each taken once.
pub(crate) type Held = Arc<Mutex<Vec<Option<Tensor>>>>;

/// The last link of a chain over `tensors[1..]` (a (1,) tensor), whose links' backward hand
/// out the gradients left in `grads` at the same indices. `tensors` must hold at least two.
pub(crate) fn chain(tensors: &[Tensor], grads: &Held, name: &'static str) -> Result<Tensor> {
    let link = |first: usize, len: usize, after_link: bool| Link {
        name,
        grads: grads.clone(),
        first,
        len,
        after_link,
    };
    if tensors.len() < 2 {
        bail!("{name}: a chain needs at least two tensors");
    }
    let mut i = tensors.len().min(4);
    let mut last = match &tensors[1..i] {
        [a] => a.apply_op1(link(1, 1, false))?,
        [a, b] => a.apply_op2(b, link(1, 2, false))?,
        [a, b, c] => a.apply_op3(b, c, link(1, 3, false))?,
        _ => unreachable!("between one and three tensors"),
    };
    while i < tensors.len() {
        last = match &tensors[i..tensors.len().min(i + 2)] {
            [a] => last.apply_op2(a, link(i, 1, true))?,
            [a, b] => last.apply_op3(a, b, link(i, 2, true))?,
            _ => unreachable!("between one and two tensors remain"),
        };
        i += 2;
    }
    Ok(last)
}

/// One node of a chain: `len` tensors from index `first` of the op's order, after the link
/// before when `after_link`.
struct Link {
    name: &'static str,
    grads: Held,
    first: usize,
    len: usize,
    after_link: bool,
}

impl Link {
    /// The one value a link returns, in its inputs' dtype.
    fn value(&self, s: &CpuStorage) -> Result<(CpuStorage, Shape)> {
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(vec![0.0]),
            CpuStorage::F64(_) => CpuStorage::F64(vec![0.0]),
            _ => bail!("{}: f32 or f64 only", self.name),
        };
        Ok((out, Shape::from(1)))
    }

    /// The gradients of this link's inputs: zero for the link before (it has no effect),
    /// then those the op's backward left for its tensors.
    fn gradients(&self, before: Option<&Tensor>) -> Result<Vec<Option<Tensor>>> {
        let mut held = self.grads.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(3);
        if self.after_link {
            match before {
                Some(t) => out.push(Some(t.zeros_like()?)),
                None => bail!("{}: a link without the link before", self.name),
            }
        }
        for i in self.first..self.first + self.len {
            match held.get_mut(i).and_then(Option::take) {
                Some(g) => out.push(Some(g)),
                None => bail!("{}: the tensors' backward ran before the op's", self.name),
            }
        }
        Ok(out)
    }
}

impl CustomOp1 for Link {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(&self, s: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        self.value(s)
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(self.gradients(None)?.pop().flatten())
    }
}

impl CustomOp2 for Link {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.value(s1)
    }

    fn bwd(
        &self,
        a: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let mut g = self.gradients(Some(a))?.into_iter();
        Ok((g.next().flatten(), g.next().flatten()))
    }
}

impl CustomOp3 for Link {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.value(s1)
    }

    fn bwd(
        &self,
        a: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let mut g = self.gradients(Some(a))?.into_iter();
        Ok((g.next().flatten(), g.next().flatten(), g.next().flatten()))
    }
}
