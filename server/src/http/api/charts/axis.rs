//! Axes of the server-rendered charts: the range a chart shows, where its ticks fall and how
//! they are labelled. The dashboard's canvas charts follow the same rules in
//! `static/chart/scales.js` (the browser tests check those).
//!
//! Rules:
//! - A flat series gets a band around its value proportional to its magnitude (a fixed
//!   learning rate of 3e-4 shows on 2.7e-4..3.3e-4, not on -0.5..0.5); all zeros show on -1..1.
//! - Linear ticks are 1, 2 or 5 times a power of ten apart; a value within rounding noise of
//!   zero is zero (never `-2.220e-16`).
//! - Step axes tick on whole steps only, and a single step is shown from one step before it to
//!   one after, so its ticks are three different whole numbers.
//! - Log axes tick on powers of ten (thinned when there are many), on 1-2-5 multiples when the
//!   range holds fewer than two of them, and on linear ticks when it holds fewer than two of
//!   those: ticks sit on round values, never on 10^0.2.
//! - Labels carry as many digits as the tick spacing needs, so neighbouring labels differ.

use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use std::ops::Range;

/// About this many ticks on a value axis.
pub const VALUE_TICKS: usize = 6;

/// One axis: its range in data units, and its ticks with their labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub lo: f64,
    pub hi: f64,
    /// Base-10 logarithmic (then `lo > 0`).
    pub log: bool,
    pub ticks: Vec<f64>,
    pub labels: Vec<String>,
}

impl Axis {
    /// A value (y) axis over data from `min` to `max` (for a log axis, the positive values).
    pub fn values(min: f64, max: f64, log: bool) -> Axis {
        let (lo, hi) = value_range(min, max, log);
        let ticks = if log {
            log_ticks(lo, hi, VALUE_TICKS)
        } else {
            nice_ticks(lo, hi, VALUE_TICKS, false)
        };
        Axis::with_ticks(lo, hi, log, ticks)
    }

    /// A step (x) axis over steps `min..=max`, about `count` ticks on whole steps.
    pub fn steps(min: f64, max: f64, count: usize) -> Axis {
        let (lo, hi) = if max > min {
            (min, max)
        } else {
            (min - 1.0, min + 1.0)
        };
        let ticks = nice_ticks(lo, hi, count, true)
            .into_iter()
            .filter(|t| *t >= 0.0)
            .collect();
        Axis::with_ticks(lo, hi, false, ticks)
    }

    fn with_ticks(lo: f64, hi: f64, log: bool, ticks: Vec<f64>) -> Axis {
        let labels = tick_labels(&ticks);
        Axis {
            lo,
            hi,
            log,
            ticks,
            labels,
        }
    }

    fn forward(&self, v: f64) -> f64 {
        if self.log {
            v.log10()
        } else {
            v
        }
    }

    /// The label of a tick of this axis (any other value gets a plain label).
    pub fn label(&self, v: f64) -> String {
        self.ticks
            .iter()
            .position(|t| *t == v)
            .and_then(|i| self.labels.get(i).cloned())
            .unwrap_or_else(|| tick_labels(&[v]).remove(0))
    }
}

/// The range to show for data from `min` to `max`: 5% headroom on each side (in log units
/// on a log axis); a flat series gets ±10% of its value (a factor of 2 on a log axis).
pub fn value_range(min: f64, max: f64, log: bool) -> (f64, f64) {
    if !(min.is_finite() && max.is_finite()) || (log && min <= 0.0) {
        return if log { (0.1, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        let (lo, hi) = if max > min {
            let pad = (max.log10() - min.log10()) * 0.05;
            (10f64.powf(min.log10() - pad), 10f64.powf(max.log10() + pad))
        } else {
            (min / 2.0, min * 2.0)
        };
        // Inside the positive finite numbers, whatever the data.
        (lo.max(f64::MIN_POSITIVE), hi.min(f64::MAX))
    } else if max > min {
        // Each end scaled before subtracting: finite even for values near f64::MAX.
        let pad = max * 0.05 - min * 0.05;
        ((min - pad).max(-f64::MAX), (max + pad).min(f64::MAX))
    } else if min == 0.0 {
        (-1.0, 1.0)
    } else {
        let half = min.abs() * 0.1;
        (min - half, min + half)
    }
}

/// The tick spacing for about `count` ticks over `span`: 1, 2 or 5 times a power of ten.
pub fn nice_step(span: f64, count: usize) -> f64 {
    let raw = span / count.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(raw)
}

/// Multiples of a nice step inside `lo..=hi`; `whole` keeps the step at least 1.
pub fn nice_ticks(lo: f64, hi: f64, count: usize, whole: bool) -> Vec<f64> {
    if hi <= lo || !lo.is_finite() || !hi.is_finite() {
        return vec![lo];
    }
    if !(hi - lo).is_finite() {
        // A span beyond f64 (values near ±f64::MAX): the ends and zero.
        return vec![lo, 0.0, hi];
    }
    let mut step = nice_step(hi - lo, count);
    if whole {
        step = step.max(1.0);
    }
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last)
        .map(|k| {
            // k * step, not a running sum: no drift, and a tick within noise of 0 is 0.
            let t = k as f64 * step;
            if t.abs() < step * 1e-9 {
                0.0
            } else {
                t
            }
        })
        .collect()
}

/// Ticks of a log axis over `lo..=hi` (both > 0).
pub fn log_ticks(lo: f64, hi: f64, count: usize) -> Vec<f64> {
    let (d0, d1) = ((lo.log10() - 1e-9).ceil(), (hi.log10() + 1e-9).floor());
    let decades = if d1 >= d0 { (d1 - d0) as usize + 1 } else { 0 };
    if decades >= 2 {
        let every = decades.div_ceil(count.max(1)).max(1);
        return (0..decades)
            .step_by(every)
            .map(|i| pow10(d0 as i32 + i as i32))
            .collect();
    }
    let mut ticks = Vec::new();
    for d in (lo.log10().floor() as i32)..=(hi.log10().ceil() as i32) {
        for m in [1.0, 2.0, 5.0] {
            let t = m * pow10(d);
            if t >= lo * (1.0 - 1e-9) && t <= hi * (1.0 + 1e-9) {
                ticks.push(t);
            }
        }
    }
    if ticks.len() >= 2 {
        return ticks;
    }
    nice_ticks(lo, hi, count, false)
        .into_iter()
        .filter(|t| *t > 0.0)
        .collect()
}

/// 10^d, exact for the decades charts use (10f64.powi drifts for negative d).
fn pow10(d: i32) -> f64 {
    format!("1e{d}").parse().unwrap_or(f64::NAN)
}

/// Labels for sorted ticks: fixed notation from 0.001 to below a million, exponential outside,
/// with the fewest digits that tell neighbouring ticks apart.
pub fn tick_labels(ticks: &[f64]) -> Vec<String> {
    let gap = ticks
        .windows(2)
        .map(|w| (w[1] - w[0]).abs())
        .filter(|g| *g > 0.0)
        .fold(f64::INFINITY, f64::min);
    for extra in 0..12 {
        let labels: Vec<String> = ticks.iter().map(|t| label(*t, gap, extra)).collect();
        let distinct = labels.windows(2).all(|w| w[0] != w[1]);
        if distinct {
            return labels;
        }
    }
    ticks.iter().map(|t| label(*t, gap, 12)).collect()
}

/// One tick's label; `gap` is the spacing to its neighbours (infinite for a lone tick).
fn label(t: f64, gap: f64, extra: usize) -> String {
    if t == 0.0 || !t.is_finite() {
        return if t.is_finite() {
            "0".into()
        } else {
            t.to_string()
        };
    }
    let a = t.abs();
    // A lone tick has no neighbour to tell apart from: four significant digits.
    let gap_digit = if gap.is_finite() {
        gap.log10().floor() as i32
    } else {
        a.log10().floor() as i32 - 3
    };
    if (1e-3..1e6).contains(&a) {
        let decimals = ((-gap_digit).max(0) as usize + extra).min(15);
        trim_zeros(format!("{t:.decimals$}"))
    } else {
        let exponent = a.log10().floor() as i32;
        let digits = ((exponent - gap_digit).max(0) as usize + extra).min(15);
        let text = format!("{t:.digits$e}");
        match text.split_once('e') {
            Some((mantissa, exp)) => format!("{}e{exp}", trim_zeros(mantissa.to_string())),
            None => text,
        }
    }
}

fn trim_zeros(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Plotters draws the grid and labels at exactly these ticks.
impl Ranged for Axis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let (a, b) = (self.forward(self.lo), self.forward(self.hi));
        let f = (self.forward(*value) - a) / (b - a);
        let px = limit.0 as f64 + f * (limit.1 - limit.0) as f64;
        if px.is_finite() {
            px.round().clamp(-1e6, 1e6) as i32
        } else {
            limit.0
        }
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // Bold points are the ticks; no extra light grid lines between them.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

impl ValueFormatter<f64> for Axis {
    fn format_ext(&self, value: &f64) -> String {
        self.label(*value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(axis: &Axis) -> Vec<&str> {
        axis.labels.iter().map(String::as_str).collect()
    }

    #[test]
    fn a_constant_learning_rate_is_shown_around_its_value_with_distinct_labels() {
        let axis = Axis::values(3e-4, 3e-4, false);
        assert!(axis.lo > 2.6e-4 && axis.lo < 3e-4, "{axis:?}");
        assert!(axis.hi > 3e-4 && axis.hi < 3.4e-4, "{axis:?}");
        assert!(axis.ticks.len() >= 3, "{axis:?}");
        assert!(axis.ticks.contains(&3e-4) || axis.labels.contains(&"3e-4".to_string()));
        let l = labels(&axis);
        assert!(l.windows(2).all(|w| w[0] != w[1]), "{l:?}");
        assert!(l.iter().all(|s| s.contains("e-4")), "{l:?}");
    }

    #[test]
    fn an_all_zero_series_is_labelled_with_round_numbers_around_zero() {
        let axis = Axis::values(0.0, 0.0, false);
        assert_eq!((axis.lo, axis.hi), (-1.0, 1.0));
        assert_eq!(labels(&axis), ["-1", "-0.5", "0", "0.5", "1"]);
    }

    #[test]
    fn ticks_near_zero_are_exactly_zero() {
        let ticks = nice_ticks(-0.3, 0.3, 6, false);
        assert!(ticks.contains(&0.0), "{ticks:?}");
        assert_eq!(
            tick_labels(&ticks),
            ["-0.3", "-0.2", "-0.1", "0", "0.1", "0.2", "0.3"]
        );
    }

    #[test]
    fn a_single_step_gets_three_whole_step_ticks() {
        let axis = Axis::steps(40.0, 40.0, 8);
        assert_eq!(axis.ticks, [39.0, 40.0, 41.0]);
        assert_eq!(labels(&axis), ["39", "40", "41"]);
        let big = Axis::steps(1_000_000.0, 1_000_000.0, 8);
        let l = labels(&big);
        assert_eq!(l.len(), 3);
        assert!(l.windows(2).all(|w| w[0] != w[1]), "{l:?}");
        let first = Axis::steps(0.0, 0.0, 8);
        assert_eq!(first.ticks, [0.0, 1.0], "no negative steps");
    }

    #[test]
    fn step_ticks_are_whole_numbers_even_over_a_short_range() {
        let axis = Axis::steps(0.0, 3.0, 10);
        assert_eq!(axis.ticks, [0.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn log_ticks_fall_on_powers_of_ten_or_round_multiples() {
        assert_eq!(log_ticks(0.05, 200.0, 6), [0.1, 1.0, 10.0, 100.0]);
        assert_eq!(log_ticks(1.2, 9.0, 6), [2.0, 5.0]);
        let axis = Axis::values(1.0, 10.0, true);
        assert!(
            axis.ticks.contains(&1.0) && axis.ticks.contains(&10.0),
            "{axis:?}"
        );
        assert_eq!(labels(&axis), ["1", "10"]);
        // Many decades are thinned to about six ticks.
        let wide = log_ticks(1e-12, 1e12, 6);
        assert!(wide.len() <= 7 && wide.len() >= 4, "{wide:?}");
        // A range inside one 1-2-5 step still gets round ticks.
        let narrow = log_ticks(2.1, 2.9, 6);
        assert!(narrow.len() >= 2, "{narrow:?}");
        assert!(
            narrow
                .iter()
                .all(|t| (t * 10.0 - (t * 10.0).round()).abs() < 1e-9),
            "{narrow:?}"
        );
    }

    #[test]
    fn log_labels_of_small_values_are_exponential_and_distinct() {
        let axis = Axis::values(1e-5, 1e-2, true);
        assert_eq!(labels(&axis), ["1e-5", "1e-4", "0.001", "0.01"]);
    }

    #[test]
    fn labels_have_the_digits_the_spacing_needs() {
        assert_eq!(
            tick_labels(&[2.7e-4, 2.8e-4, 2.9e-4]),
            ["2.7e-4", "2.8e-4", "2.9e-4"]
        );
        assert_eq!(tick_labels(&[1.5, 2.0, 2.5]), ["1.5", "2", "2.5"]);
        assert_eq!(tick_labels(&[999_999.0, 1_000_000.0]), ["999999", "1e6"]);
        assert_eq!(tick_labels(&[0.25]), ["0.25"]);
    }

    #[test]
    fn extreme_values_still_get_finite_ticks() {
        for (lo, hi) in [
            (-f64::MAX, f64::MAX),
            (f64::MIN_POSITIVE, f64::MAX),
            (-1e-300, 1e-300),
        ] {
            for log in [false, true] {
                let axis = Axis::values(lo, hi, log);
                assert!(axis.lo.is_finite() && axis.hi.is_finite(), "{axis:?}");
                assert!(axis.ticks.iter().all(|t| t.is_finite()), "{axis:?}");
                assert_eq!(axis.ticks.len(), axis.labels.len());
            }
        }
    }

    #[test]
    fn the_plotters_coordinate_maps_ends_to_the_pixel_range() {
        let axis = Axis::values(1.0, 100.0, true);
        let lo = axis.map(&axis.lo, (0, 100));
        let hi = axis.map(&axis.hi, (0, 100));
        assert_eq!((lo, hi), (0, 100));
        assert_eq!(axis.map(&10.0, (0, 100)), 50);
        assert_eq!(axis.format_ext(&10.0), "10");
    }
}
