//! Random search: each parameter drawn independently from its own distribution.

use rand::Rng;

use crate::spec::SweepSpec;
use crate::stats::{rng_for, STREAM_PARAMS};
use crate::{space, Params};

pub(crate) fn suggest(spec: &SweepSpec, number: u32) -> Params {
    let mut rng = rng_for(spec.seed, number.into(), STREAM_PARAMS);
    sample_all(spec, &mut rng)
}

/// One draw per parameter, in key order, from one generator.
pub(crate) fn sample_all<R: Rng>(spec: &SweepSpec, rng: &mut R) -> Params {
    spec.parameters
        .iter()
        .map(|(key, param)| (key.clone(), space::sample(param, rng)))
        .collect()
}
