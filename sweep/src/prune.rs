//! Early stopping: ASHA (successive halving without waiting for a full rung), Hyperband (ASHA
//! in several brackets of different aggressiveness) and the median rule.
//!
//! `judge` keeps its bookkeeping in the trial's `rungs` (rung index -> the trial's value there)
//! and decides from its arguments alone, so the server can persist `rungs` and call again after
//! a restart. A rung present in a running trial's `rungs` means the trial was judged there and
//! kept going (a pruned trial stops running), so it is never judged at that rung again; the
//! server should persist `rungs` together with the trial's new state.

use crate::spec::{EarlyTerminate, SweepSpec};
use crate::stats::{median, rng_for, STREAM_BRACKET};
use crate::{Trial, TrialState, Verdict};

/// The ASHA schedule one trial runs under: rungs at `first * rf^k`, below `limit` if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Schedule {
    first: u64,
    rf: u64,
    limit: Option<u64>,
    bracket: Option<u32>,
}

impl Schedule {
    fn rung_step(&self, k: u32) -> Option<u64> {
        let step = self.rf.checked_pow(k)?.checked_mul(self.first)?;
        match self.limit {
            Some(limit) if step >= limit => None,
            _ => Some(step),
        }
    }
}

/// The largest s with `min_steps * rf^s <= max_steps`.
fn s_max(min_steps: u64, max_steps: u64, rf: u64) -> u32 {
    let mut s = 0;
    let mut step = min_steps;
    while let Some(next) = step.checked_mul(rf).filter(|&n| n <= max_steps) {
        step = next;
        s += 1;
    }
    s
}

/// How many configurations Hyperband starts in each bracket b = 0..=s_max. Bracket b's first
/// rung is `min_steps * rf^b`, so it halves `s_max - b` times and starts
/// ceil((s_max + 1) / (s_max - b + 1) * rf^(s_max - b)) configurations.
fn bracket_sizes(min_steps: u64, max_steps: u64, rf: u64) -> Vec<f64> {
    let s = s_max(min_steps, max_steps, rf);
    (0..=s)
        .map(|b| {
            let halvings = s - b;
            ((s + 1) as f64 / (halvings + 1) as f64 * (rf as f64).powi(halvings as i32)).ceil()
        })
        .collect()
}

/// Hyperband: trial `number`'s bracket, drawn with probability proportional to the number of
/// configurations Hyperband starts in each bracket, from (seed, number) alone. None for other
/// rules.
pub fn assign_bracket(spec: &SweepSpec, number: u32) -> Option<u32> {
    let EarlyTerminate::Hyperband {
        min_steps,
        max_steps,
        reduction_factor,
    } = spec.early_terminate
    else {
        return None;
    };
    let sizes = bracket_sizes(min_steps, max_steps, reduction_factor);
    let total: f64 = sizes.iter().sum();
    let u: f64 =
        rand::Rng::random::<f64>(&mut rng_for(spec.seed, number.into(), STREAM_BRACKET)) * total;
    let mut acc = 0.0;
    for (b, size) in sizes.iter().enumerate() {
        acc += size;
        if u < acc {
            return Some(b as u32);
        }
    }
    Some(sizes.len().saturating_sub(1) as u32)
}

fn bracket_of(spec: &SweepSpec, t: &Trial) -> Option<u32> {
    t.bracket.or_else(|| assign_bracket(spec, t.number))
}

fn schedule(spec: &SweepSpec, t: &Trial) -> Option<Schedule> {
    match spec.early_terminate {
        EarlyTerminate::Asha {
            min_steps,
            reduction_factor,
        } => Some(Schedule {
            first: min_steps,
            rf: reduction_factor,
            limit: None,
            bracket: None,
        }),
        EarlyTerminate::Hyperband {
            min_steps,
            max_steps,
            reduction_factor,
        } => {
            let b = bracket_of(spec, t)?;
            let first = reduction_factor.checked_pow(b)?.checked_mul(min_steps)?;
            Some(Schedule {
                first,
                rf: reduction_factor,
                limit: Some(max_steps),
                bracket: Some(b),
            })
        }
        _ => None,
    }
}

/// Records the new rung values of `trials[index]` and says whether it must stop. See the module
/// comment for the bookkeeping; a trial already marked Pruned gets Prune again, a finished one
/// Continue.
pub fn judge(spec: &SweepSpec, trials: &mut [Trial], index: usize) -> Verdict {
    let Some(trial) = trials.get(index) else {
        return Verdict::Continue;
    };
    match trial.state {
        TrialState::Running => {}
        TrialState::Pruned => {
            return Verdict::Prune {
                reason: "the trial was already pruned".into(),
            }
        }
        TrialState::Complete | TrialState::Failed => return Verdict::Continue,
    }
    match spec.early_terminate {
        EarlyTerminate::None => Verdict::Continue,
        EarlyTerminate::Median {
            min_steps,
            startup_trials,
        } => judge_median(spec, trials, index, min_steps, startup_trials),
        EarlyTerminate::Asha { .. } | EarlyTerminate::Hyperband { .. } => {
            judge_asha(spec, trials, index)
        }
    }
}

fn judge_asha(spec: &SweepSpec, trials: &mut [Trial], index: usize) -> Verdict {
    let sign = if spec.maximize() { -1.0 } else { 1.0 };
    let trial = &trials[index];
    let Some(sched) = schedule(spec, trial) else {
        return Verdict::Continue;
    };
    let Some(last) = trial.last_step() else {
        return Verdict::Continue;
    };
    let mut k = 0u32;
    // Rungs the latest report has reached, in order: a trial that jumped past several rungs in
    // one report is judged at each, lowest first.
    while let Some(step) = sched.rung_step(k).filter(|&s| s <= last) {
        if trials[index].rungs.contains_key(&k) {
            k += 1;
            continue;
        }
        let Some(mine) = trials[index].value_at(step) else {
            return Verdict::Continue;
        };
        // The records at this rung from the other trials of the same bracket, whatever their
        // state: a trial that later completed or was pruned still showed how good it was here.
        let others: Vec<f64> = trials
            .iter()
            .enumerate()
            .filter(|&(i, t)| {
                i != index && (sched.bracket.is_none() || bracket_of(spec, t) == sched.bracket)
            })
            .filter_map(|(_, t)| t.rungs.get(&k).copied())
            .filter(|v| v.is_finite())
            .collect();
        trials[index].rungs.insert(k, mine);
        let n = others.len() + 1;
        let keep = (n / sched.rf as usize).max(1);
        // Rank counts only strictly better values, so ties keep going.
        let better = others.iter().filter(|&&o| sign * o < sign * mine).count();
        if better >= keep {
            // The reason starts with the step the trial reached, the step a trials table shows
            // beside it, then the rung it was judged at (earlier when it reported past it).
            return Verdict::Prune {
                reason: format!(
                    "pruned at step {last}: its {} of {mine} at step {step} (rung {k}) ranks {} of {n} trials there; only the best {keep} continue",
                    spec.metric.name,
                    better + 1
                ),
            };
        }
        k += 1;
    }
    Verdict::Continue
}

fn judge_median(
    spec: &SweepSpec,
    trials: &[Trial],
    index: usize,
    min_steps: u64,
    startup: u32,
) -> Verdict {
    let sign = if spec.maximize() { -1.0 } else { 1.0 };
    let complete = trials
        .iter()
        .filter(|t| t.state == TrialState::Complete)
        .count();
    if complete < startup as usize {
        return Verdict::Continue;
    }
    let trial = &trials[index];
    let Some(step) = trial.last_step().filter(|&s| s >= min_steps) else {
        return Verdict::Continue;
    };
    let best = trial
        .reports()
        .map(|(_, v)| sign * v)
        .fold(f64::INFINITY, f64::min);
    // Every other trial that got as far as this step, with its last value at or before it.
    let mut others: Vec<f64> = trials
        .iter()
        .enumerate()
        .filter(|&(i, t)| i != index && t.last_step().is_some_and(|s| s >= step))
        .filter_map(|(_, t)| {
            t.reports()
                .take_while(|&(s, _)| s <= step)
                .last()
                .map(|(_, v)| sign * v)
        })
        .collect();
    let n = others.len();
    match median(&mut others) {
        Some(m) if best > m => Verdict::Prune {
            reason: format!(
                "pruned at step {step}: its best {} so far, {}, is worse than the median {} of {n} other trials there",
                spec.metric.name,
                sign * best,
                sign * m
            ),
        },
        _ => Verdict::Continue,
    }
}

/// The step at which `trial` will next be judged, for display; None when it never will be
/// (no rule, not running, or past Hyperband's last rung).
pub fn next_rung(spec: &SweepSpec, trial: &Trial) -> Option<u64> {
    if trial.state != TrialState::Running {
        return None;
    }
    match spec.early_terminate {
        EarlyTerminate::None => None,
        EarlyTerminate::Median { min_steps, .. } => Some(
            trial
                .last_step()
                .map_or(min_steps, |s| s.saturating_add(1).max(min_steps)),
        ),
        EarlyTerminate::Asha { .. } | EarlyTerminate::Hyperband { .. } => {
            let sched = schedule(spec, trial)?;
            let mut k = 0;
            loop {
                let step = sched.rung_step(k)?;
                if !trial.rungs.contains_key(&k) {
                    return Some(step);
                }
                k += 1;
            }
        }
    }
}
