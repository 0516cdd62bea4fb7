//! Grid search: the cartesian product of the finite parameters, enumerated like an odometer
//! over the parameters in key order (the last key turns fastest).

use std::collections::HashSet;

use crate::spec::SweepSpec;
use crate::{space, Params, Trial};

/// The point with index `i` of the enumeration.
pub(crate) fn point(spec: &SweepSpec, mut i: u64) -> Params {
    let mut digits = Vec::with_capacity(spec.parameters.len());
    for param in spec.parameters.values().rev() {
        let count = space::grid_count(param).unwrap_or(1).max(1);
        digits.push(i % count);
        i /= count;
    }
    digits.reverse();
    spec.parameters
        .iter()
        .zip(digits)
        .map(|((key, param), d)| (key.clone(), space::grid_value(param, d)))
        .collect()
}

/// The enumeration index of a trial's parameters, or None when the current grid lacks them
/// (the spec changed, or a key is missing).
fn index_of(spec: &SweepSpec, params: &Params) -> Option<u64> {
    let mut index: u64 = 0;
    for (key, param) in &spec.parameters {
        let count = space::grid_count(param)?;
        let digit = space::grid_index(param, params.get(key)?)?;
        index = index.checked_mul(count)?.checked_add(digit)?;
    }
    Some(index)
}

/// The first grid point no earlier trial has, in any state: a failed point is not retried, since
/// retrying would repeat whatever made it fail.
pub(crate) fn suggest(spec: &SweepSpec, earlier: &[&Trial]) -> Option<Params> {
    let size = spec.grid_size()?;
    let used: HashSet<u64> = earlier
        .iter()
        .filter_map(|t| index_of(spec, &t.params))
        .collect();
    (0..size)
        .find(|i| !used.contains(i))
        .map(|i| point(spec, i))
}
