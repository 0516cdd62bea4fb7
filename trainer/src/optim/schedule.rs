//! Learning-rate schedules: a pure function of the step, so a resumed run gets the same rates.
//!
//! Steps count from 0. Warmup ramps linearly to `learning_rate`, reaching it at step
//! `warmup_steps - 1`; the decay then runs from `warmup_steps` to `max_steps`, ending at `min_lr`.

use crate::config::{LrSchedule, TrainingConfig};

/// The learning rate for optimizer step `step`.
pub fn lr_at(cfg: &TrainingConfig, step: usize) -> f64 {
    let peak = cfg.learning_rate;
    if step < cfg.warmup_steps {
        return peak * (step + 1) as f64 / cfg.warmup_steps as f64;
    }
    let floor = cfg.min_lr.min(peak);
    let decay_steps = cfg.max_steps.saturating_sub(cfg.warmup_steps).max(1);
    let since = step - cfg.warmup_steps;
    // Fraction of the decay done, in [0, 1].
    let progress = (since as f64 / decay_steps as f64).min(1.0);
    match cfg.lr_schedule {
        LrSchedule::Constant => peak,
        LrSchedule::Linear => floor + (peak - floor) * (1.0 - progress),
        LrSchedule::Cosine => {
            floor + 0.5 * (peak - floor) * (1.0 + (std::f64::consts::PI * progress).cos())
        }
        LrSchedule::Polynomial => floor + (peak - floor) * (1.0 - progress).powf(cfg.lr_power),
        LrSchedule::Exponential => (peak * cfg.lr_gamma.powf(since as f64)).max(floor),
        LrSchedule::Sgdr => {
            let (into, period) = sgdr_cycle(since, cfg.lr_restart_period, cfg.lr_restart_mult);
            let progress = into / period;
            floor + 0.5 * (peak - floor) * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

/// Where `since` (steps after warmup) falls in SGDR's cycles: (steps into the current cycle,
/// the cycle's length). Cycle i lasts first·mult^i steps; lengths stay real numbers, so a
/// multiplier such as 1.5 does not drift by rounding from cycle to cycle.
fn sgdr_cycle(since: usize, first: usize, mult: f64) -> (f64, f64) {
    let since = since as f64;
    let mut start = 0.0;
    let mut period = first.max(1) as f64;
    if mult <= 1.0 {
        return (since % period, period);
    }
    // Cycles grow geometrically, so this loop runs O(log(since)) times.
    while since >= start + period {
        start += period;
        period *= mult;
    }
    (since - start, period)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(schedule: LrSchedule) -> TrainingConfig {
        TrainingConfig {
            learning_rate: 1.0,
            min_lr: 0.1,
            warmup_steps: 10,
            max_steps: 110,
            lr_schedule: schedule,
            lr_power: 2.0,
            lr_gamma: 0.9,
            ..TrainingConfig::default()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn warmup_ramps_linearly_to_the_peak_for_every_schedule() {
        for s in [
            LrSchedule::Constant,
            LrSchedule::Linear,
            LrSchedule::Cosine,
            LrSchedule::Polynomial,
            LrSchedule::Exponential,
            LrSchedule::Sgdr,
        ] {
            let c = cfg(s);
            assert!(close(lr_at(&c, 0), 0.1), "{s:?}");
            assert!(close(lr_at(&c, 4), 0.5), "{s:?}");
            assert!(close(lr_at(&c, 9), 1.0), "{s:?}");
            assert!(
                close(lr_at(&c, 10), 1.0),
                "{s:?} starts its decay at the peak"
            );
        }
    }

    #[test]
    fn constant_stays_at_the_peak() {
        let c = cfg(LrSchedule::Constant);
        assert!(close(lr_at(&c, 60), 1.0));
        assert!(close(lr_at(&c, 500), 1.0));
    }

    #[test]
    fn linear_decays_to_the_floor() {
        let c = cfg(LrSchedule::Linear);
        assert!(close(lr_at(&c, 60), 0.55));
        assert!(close(lr_at(&c, 110), 0.1));
        assert!(close(lr_at(&c, 1000), 0.1));
    }

    #[test]
    fn cosine_passes_the_midpoint_and_ends_at_the_floor() {
        let c = cfg(LrSchedule::Cosine);
        assert!(close(lr_at(&c, 60), 0.55));
        // A quarter of the way: floor + 0.45·(1 + cos(π/4)).
        let quarter = 0.1 + 0.45 * (1.0 + std::f64::consts::FRAC_1_SQRT_2);
        assert!(close(lr_at(&c, 35), quarter));
        assert!(close(lr_at(&c, 110), 0.1));
        assert!(close(lr_at(&c, 200), 0.1));
    }

    #[test]
    fn polynomial_follows_the_power() {
        let c = cfg(LrSchedule::Polynomial);
        // Halfway with power 2: floor + 0.9·0.25.
        assert!(close(lr_at(&c, 60), 0.325));
        assert!(close(lr_at(&c, 110), 0.1));
    }

    #[test]
    fn exponential_multiplies_by_gamma_each_step_down_to_the_floor() {
        let c = cfg(LrSchedule::Exponential);
        assert!(close(lr_at(&c, 12), 0.81));
        assert!(close(lr_at(&c, 100), 0.1), "0.9^90 is below the floor");
    }

    fn sgdr(period: usize, mult: f64) -> TrainingConfig {
        TrainingConfig {
            lr_restart_period: period,
            lr_restart_mult: mult,
            ..cfg(LrSchedule::Sgdr)
        }
    }

    #[test]
    fn sgdr_restarts_at_the_peak_after_each_equal_period() {
        let c = sgdr(20, 1.0);
        // Warmup ends at step 10; cycles start at 10, 30, 50, ...
        for start in [10, 30, 50, 90] {
            assert!(close(lr_at(&c, start), 1.0), "restart at {start}");
            // Halfway through a cycle: floor + 0.45·(1 + cos(π/2)).
            assert!(close(lr_at(&c, start + 10), 0.55), "middle of {start}");
        }
        // The last step of a cycle is just above the floor, the next one back at the peak.
        assert!(lr_at(&c, 29) < 0.11 && lr_at(&c, 29) > 0.1);
        assert!(lr_at(&c, 30) > lr_at(&c, 29));
    }

    #[test]
    fn sgdr_cycles_grow_by_the_multiplier() {
        let c = sgdr(10, 2.0);
        // Cycles of 10, 20, 40 steps start at 10, 20, 40 and 80 (after 10 warmup steps).
        for start in [10, 20, 40, 80] {
            assert!(close(lr_at(&c, start), 1.0), "restart at {start}");
        }
        assert!(close(lr_at(&c, 15), 0.55), "middle of the 10-step cycle");
        assert!(close(lr_at(&c, 30), 0.55), "middle of the 20-step cycle");
        assert!(close(lr_at(&c, 60), 0.55), "middle of the 40-step cycle");
        // A quarter into the third cycle: floor + 0.45·(1 + cos(π/4)).
        let quarter = 0.1 + 0.45 * (1.0 + std::f64::consts::FRAC_1_SQRT_2);
        assert!(close(lr_at(&c, 50), quarter));
    }

    #[test]
    fn sgdr_with_a_fractional_multiplier_keeps_real_cycle_lengths() {
        assert_eq!(sgdr_cycle(0, 10, 1.5), (0.0, 10.0));
        assert_eq!(sgdr_cycle(10, 10, 1.5), (0.0, 15.0));
        assert_eq!(sgdr_cycle(25, 10, 1.5), (0.0, 22.5));
        // The fourth cycle starts at 10 + 15 + 22.5 = 47.5: step 48 is half a step in.
        assert_eq!(sgdr_cycle(48, 10, 1.5), (0.5, 33.75));
    }

    #[test]
    fn no_warmup_starts_at_the_peak() {
        let c = TrainingConfig {
            warmup_steps: 0,
            ..cfg(LrSchedule::Cosine)
        };
        assert!(close(lr_at(&c, 0), 1.0));
    }
}
