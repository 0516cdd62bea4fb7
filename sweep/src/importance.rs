//! fANOVA parameter importance (work in progress).

use std::collections::BTreeMap;

use crate::{SweepSpec, Trial};

pub fn importance(_spec: &SweepSpec, _trials: &[Trial]) -> BTreeMap<String, f64> {
    BTreeMap::new()
}
