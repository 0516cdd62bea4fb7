//! Small numeric helpers: seeded generators, the normal distribution, log-sum-exp.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Streams keep independent uses of one (seed, number) pair from sharing random numbers, so
/// e.g. a trial's Hyperband bracket is not correlated with its parameters.
pub(crate) const STREAM_PARAMS: u64 = 1;
pub(crate) const STREAM_BRACKET: u64 = 2;
pub(crate) const STREAM_FOREST: u64 = 3;

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A generator that depends only on (seed, number, stream): a restarted server re-asking the
/// same question gets the same random numbers.
pub(crate) fn rng_for(seed: u64, number: u64, stream: u64) -> ChaCha8Rng {
    let mixed =
        splitmix(splitmix(seed) ^ splitmix(number.wrapping_mul(0x2545_F491_4F6C_DD1D)) ^ stream);
    ChaCha8Rng::seed_from_u64(mixed)
}

/// A uniform number in the open interval (0, 1), safe to take the log of.
pub(crate) fn open01<R: Rng>(rng: &mut R) -> f64 {
    loop {
        let u: f64 = rng.random();
        if u > 0.0 {
            return u;
        }
    }
}

/// A standard normal draw (Box–Muller; one of the pair is thrown away to keep the generator's
/// position a simple function of the number of draws).
pub(crate) fn std_normal<R: Rng>(rng: &mut R) -> f64 {
    let u1 = open01(rng);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// The complementary error function, with a relative error below 1.2e-7 everywhere (the
/// Chebyshev-fitted form from Numerical Recipes): the relative accuracy in the tails is what
/// keeps far-away mixture components from rounding to zero mass.
pub(crate) fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// P(a < Z < b) for a standard normal Z, computed on the side of the tail both ends are in so
/// that far-tail intervals keep their relative precision.
pub(crate) fn normal_mass(a: f64, b: f64) -> f64 {
    if b <= a {
        return 0.0;
    }
    let s = std::f64::consts::SQRT_2;
    let m = if a >= 0.0 {
        0.5 * (erfc(a / s) - erfc(b / s))
    } else if b <= 0.0 {
        0.5 * (erfc(-b / s) - erfc(-a / s))
    } else {
        1.0 - 0.5 * erfc(-a / s) - 0.5 * erfc(b / s)
    };
    m.max(0.0)
}

pub(crate) const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

pub(crate) fn log_sum_exp(xs: &[f64]) -> f64 {
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + xs.iter().map(|x| (x - max).exp()).sum::<f64>().ln()
}

pub(crate) fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        0.5 * (values[n / 2 - 1] + values[n / 2])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erfc_matches_known_values() {
        assert!((erfc(0.0) - 1.0).abs() < 1e-7);
        assert!((erfc(1.0) - 0.157_299_207_050_285_13).abs() < 1e-7);
        assert!((erfc(-1.0) - 1.842_700_792_949_715).abs() < 1e-7);
        // Far tail: relative accuracy holds.
        let far = erfc(5.0);
        assert!((far / 1.537_459_794_428_034_8e-12 - 1.0).abs() < 1e-6);
    }

    #[test]
    fn normal_mass_of_the_whole_line_is_one_and_of_one_sigma_is_68_percent() {
        assert!((normal_mass(-40.0, 40.0) - 1.0).abs() < 1e-9);
        assert!((normal_mass(-1.0, 1.0) - 0.682_689_492).abs() < 1e-6);
        assert!(normal_mass(6.0, 7.0) > 0.0);
    }

    #[test]
    fn the_same_seed_and_number_give_the_same_stream_and_different_numbers_do_not() {
        let a: u64 = rng_for(7, 3, STREAM_PARAMS).random();
        let b: u64 = rng_for(7, 3, STREAM_PARAMS).random();
        let c: u64 = rng_for(7, 4, STREAM_PARAMS).random();
        let d: u64 = rng_for(7, 3, STREAM_BRACKET).random();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }
}
