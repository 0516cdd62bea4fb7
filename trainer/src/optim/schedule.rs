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
    }
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

    #[test]
    fn no_warmup_starts_at_the_peak() {
        let c = TrainingConfig {
            warmup_steps: 0,
            ..cfg(LrSchedule::Cosine)
        };
        assert!(close(lr_at(&c, 0), 1.0));
    }
}
