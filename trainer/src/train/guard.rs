//! The instability guard (`training.instability_guard`): judges each step's loss before its
//! update, skips the update of a non-finite or spiking step, and after `rollback_after` skips in
//! a row puts the weights and optimizer state back to the latest step checkpoint with a smaller
//! learning rate.
//!
//! The step counter and the data order go on through skips and rollbacks: a skipped step still
//! counts (like a mixed-precision step skipped for an overflow), and after a rollback the run
//! draws the batches that come next rather than the ones around the spike again. So metrics stay
//! one point per step and the run still ends at `training.max_steps`. Everything the guard
//! decides from is in [`GuardState`], saved with every checkpoint, so a resumed run judges
//! exactly as the straight one would.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::Trainer;
use crate::checkpoint;
use crate::config::InstabilityGuardConfig;
use crate::wire::guard_keys;

/// Weight of the newest accepted loss in the running mean: about the last 20 steps count.
const MEAN_WEIGHT: f64 = 0.1;

/// What the guard remembers between steps (in `state.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GuardState {
    /// Running mean of accepted losses; `None` before the first.
    pub loss_mean: Option<f64>,
    /// Steps accepted so far.
    pub accepted: u64,
    /// Steps skipped since the last accepted one.
    pub skipped_in_a_row: usize,
    /// Steps skipped over the whole run.
    pub skipped_total: u64,
    /// Rollbacks so far.
    pub rollbacks: usize,
    /// Product of `lr_scale` over the rollbacks: multiplies the schedule's learning rate.
    pub lr_scale: f64,
}

impl Default for GuardState {
    fn default() -> Self {
        GuardState {
            loss_mean: None,
            accepted: 0,
            skipped_in_a_row: 0,
            skipped_total: 0,
            rollbacks: 0,
            lr_scale: 1.0,
        }
    }
}

/// Why a step's update was skipped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SkipReason {
    /// The loss or the gradient norm was NaN or infinite.
    NonFinite,
    /// The loss was more than `spike_factor` times the running mean (which it carries).
    Spike { mean: f64 },
}

/// The guard's decision about one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Apply the update.
    Accept,
    /// Skip the update.
    Skip(SkipReason),
    /// Skip the update, and this was the `rollback_after`-th skip in a row: roll back.
    RollBack(SkipReason),
}

impl Verdict {
    /// Whether the optimizer applies this step's update.
    pub fn updates(self) -> bool {
        self == Verdict::Accept
    }
}

impl GuardState {
    /// Judges a step by its loss and gradient norm, and records the outcome.
    pub fn judge(&mut self, cfg: &InstabilityGuardConfig, loss: f32, grad_norm: f32) -> Verdict {
        let loss = f64::from(loss);
        let reason = if !loss.is_finite() || !grad_norm.is_finite() {
            Some(SkipReason::NonFinite)
        } else {
            match self.loss_mean {
                Some(mean)
                    if self.accepted >= cfg.min_history as u64
                        && loss > cfg.spike_factor * mean =>
                {
                    Some(SkipReason::Spike { mean })
                }
                _ => None,
            }
        };
        let Some(reason) = reason else {
            self.accepted += 1;
            self.skipped_in_a_row = 0;
            self.loss_mean = Some(match self.loss_mean {
                Some(mean) => mean + MEAN_WEIGHT * (loss - mean),
                None => loss,
            });
            return Verdict::Accept;
        };
        self.skipped_in_a_row += 1;
        self.skipped_total += 1;
        if self.skipped_in_a_row >= cfg.rollback_after {
            Verdict::RollBack(reason)
        } else {
            Verdict::Skip(reason)
        }
    }
}

/// Multiplies the loss of chosen steps by a factor: a test hook that makes a step's loss and
/// gradients NaN (factor NaN) or spike (a large factor) without special data.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// 1-based step → factor on that step's loss.
    pub loss_factors: BTreeMap<u64, f64>,
}

impl Trainer {
    /// After a step the guard skipped: logs why, and when the verdict says so rolls back to the
    /// latest step checkpoint in `run_dir`. Adds the guard's metrics (`wire::guard_keys`) to
    /// `metrics`.
    pub fn follow_guard(
        &mut self,
        verdict: Verdict,
        step: u64,
        loss: f32,
        run_dir: &Path,
        metrics: &mut BTreeMap<String, f64>,
    ) -> Result<()> {
        let reason = match verdict {
            Verdict::Accept => return Ok(()),
            Verdict::Skip(r) | Verdict::RollBack(r) => r,
        };
        let why = match reason {
            SkipReason::NonFinite => format!("loss {loss} or its gradient is not finite"),
            SkipReason::Spike { mean } => {
                format!("loss {loss:.4} is a spike over the running mean {mean:.4}")
            }
        };
        let guard = self.state.guard.clone();
        tracing::warn!(
            step,
            skipped_in_a_row = guard.skipped_in_a_row,
            "instability guard: update skipped: {why}"
        );
        metrics.insert(guard_keys::SKIPPED_STEPS.into(), guard.skipped_total as f64);
        if let Verdict::RollBack(_) = verdict {
            let to = self.roll_back(run_dir)?;
            metrics.insert(guard_keys::ROLLBACK_TO.into(), to as f64);
            metrics.insert(guard_keys::LR_SCALE.into(), self.state.guard.lr_scale);
        }
        Ok(())
    }

    /// Puts the weights and optimizer state back to the latest step checkpoint in `run_dir`
    /// and scales the learning rate down; the step counter, the data position and the guard's
    /// running mean go on. Returns the checkpoint's step. Fails once
    /// `training.instability_guard.max_rollbacks` rollbacks have not helped, or when there is no
    /// checkpoint yet.
    pub fn roll_back(&mut self, run_dir: &Path) -> Result<u64> {
        let Some(cfg) = self.cfg.training.instability_guard.clone() else {
            bail!("a rollback needs training.instability_guard");
        };
        let skipped = self.state.guard.skipped_in_a_row;
        if self.state.guard.rollbacks >= cfg.max_rollbacks {
            bail!(
                "training diverged at step {}: {skipped} updates skipped in a row after {} \
                 rollbacks (training.instability_guard.max_rollbacks)",
                self.state.step,
                self.state.guard.rollbacks
            );
        }
        let Some((to, dir)) = checkpoint::list_steps(&checkpoint::checkpoints_dir(run_dir))?.pop()
        else {
            bail!(
                "training diverged at step {}: {skipped} updates skipped in a row and no step \
                 checkpoint to roll back to yet (training.save_steps sets how often they are \
                 written)",
                self.state.step
            );
        };
        checkpoint::load_model(&dir, &self.cfg, &self.varmap, &self.device)?;
        if checkpoint::has_optimizer(&dir) {
            checkpoint::load_optimizer(&dir, self.optimizer.as_mut(), &self.device)?;
        }
        let g = &mut self.state.guard;
        g.rollbacks += 1;
        g.skipped_in_a_row = 0;
        g.lr_scale *= cfg.lr_scale;
        tracing::warn!(
            step = self.state.step,
            to,
            lr_scale = g.lr_scale,
            "instability guard: rolled back to the checkpoint of step {to}; learning rate x{}",
            g.lr_scale
        );
        Ok(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> InstabilityGuardConfig {
        InstabilityGuardConfig {
            spike_factor: 2.0,
            min_history: 3,
            rollback_after: 2,
            lr_scale: 0.5,
            max_rollbacks: 1,
        }
    }

    #[test]
    fn a_non_finite_loss_or_gradient_is_skipped_from_the_first_step() {
        let mut g = GuardState::default();
        assert_eq!(
            g.judge(&cfg(), f32::NAN, 1.0),
            Verdict::Skip(SkipReason::NonFinite)
        );
        let mut g = GuardState::default();
        assert_eq!(
            g.judge(&cfg(), 1.0, f32::INFINITY),
            Verdict::Skip(SkipReason::NonFinite)
        );
        assert_eq!(g.loss_mean, None, "a skipped loss does not enter the mean");
    }

    #[test]
    fn a_spike_counts_only_after_the_history_and_above_the_factor() {
        let mut g = GuardState::default();
        // Before min_history accepted steps a high loss is accepted (losses fall fast early).
        for loss in [4.0, 4.0, 4.0] {
            assert_eq!(g.judge(&cfg(), loss, 1.0), Verdict::Accept);
        }
        assert_eq!(g.judge(&cfg(), 7.9, 1.0), Verdict::Accept, "below 2 x 4");
        let mean = g.loss_mean.unwrap();
        assert!((mean - 4.39).abs() < 1e-6, "mean {mean}");
        assert_eq!(
            g.judge(&cfg(), 9.0, 1.0),
            Verdict::Skip(SkipReason::Spike { mean })
        );
    }

    #[test]
    fn the_rollback_comes_after_rollback_after_skips_in_a_row() {
        let mut g = GuardState::default();
        assert!(matches!(g.judge(&cfg(), f32::NAN, 1.0), Verdict::Skip(_)));
        assert_eq!(g.judge(&cfg(), 1.0, 1.0), Verdict::Accept, "resets the run");
        assert!(matches!(g.judge(&cfg(), f32::NAN, 1.0), Verdict::Skip(_)));
        assert!(matches!(
            g.judge(&cfg(), f32::NAN, 1.0),
            Verdict::RollBack(SkipReason::NonFinite)
        ));
        assert_eq!(g.skipped_total, 3);
    }

    #[test]
    fn an_old_state_file_without_guard_fields_reads_as_a_fresh_guard() {
        let g: GuardState = serde_json::from_str("{}").unwrap();
        assert_eq!(g, GuardState::default());
        assert_eq!(g.lr_scale, 1.0);
    }
}
