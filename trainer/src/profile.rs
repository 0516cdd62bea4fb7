//! Optional per-phase step timing (`TRAINYARD_PROFILE=phases`): the device is synchronised at
//! each phase boundary, so the times are what each phase really costs on a GPU, at the price of
//! those synchronisations. Off by default; then it does nothing.
//!
//! With it on, each block's forward is timed too, by the kind of its mixer (`LayerTimer`), so a
//! hybrid model reports how the forward divides between attention, Mamba-2 and MLP-only blocks.
//! It sits below both `model/` (whose blocks start a `LayerTimer`) and `train/` (whose step
//! runs a `PhaseClock` and reports both), so neither imports the other for it.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Instant;

use candle_core::{Device, Result};

/// Whether `TRAINYARD_PROFILE` asks for phase times (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("TRAINYARD_PROFILE")
            .map(|v| v.split(',').any(|p| p.trim() == "phases"))
            .unwrap_or(false)
    })
}

/// Wall time per phase of one step, summed over micro-batches.
pub struct PhaseClock<'a> {
    device: &'a Device,
    last: Option<Instant>,
    totals: BTreeMap<&'static str, f64>,
}

impl<'a> PhaseClock<'a> {
    /// A clock that measures when `on`, else does nothing.
    pub fn new(device: &'a Device, on: bool) -> Result<Self> {
        if on {
            device.synchronize()?;
            // Forwards outside the step (evaluation) are not the step's.
            LAYER_MS.with(|m| m.borrow_mut().clear());
        }
        Ok(PhaseClock {
            device,
            last: on.then(Instant::now),
            totals: BTreeMap::new(),
        })
    }

    /// Ends phase `name`: waits for the device, adds the time since the last mark.
    pub fn mark(&mut self, name: &'static str) -> Result<()> {
        if let Some(last) = self.last {
            self.device.synchronize()?;
            let now = Instant::now();
            *self.totals.entry(name).or_default() += (now - last).as_secs_f64() * 1e3;
            self.last = Some(now);
        }
        Ok(())
    }

    /// The phase times as metrics `perf/ms/<phase>`, and the blocks' forward times by kind as
    /// `perf/ms/forward/<kind>` with their shares of the blocks' total, `perf/share/<kind>`.
    pub fn report(self, out: &mut BTreeMap<String, f64>) {
        if self.last.is_none() {
            return;
        }
        for (name, ms) in self.totals {
            out.insert(format!("perf/ms/{name}"), ms);
        }
        let layers = LAYER_MS.with(|m| std::mem::take(&mut *m.borrow_mut()));
        let total: f64 = layers.values().sum();
        for (kind, ms) in layers {
            out.insert(format!("perf/ms/forward/{kind}"), ms);
            if total > 0.0 {
                out.insert(format!("perf/share/{kind}"), ms / total);
            }
        }
    }
}

thread_local! {
    /// Forward milliseconds per kind of block since the step began (the step's thread).
    static LAYER_MS: RefCell<BTreeMap<&'static str, f64>> = const { RefCell::new(BTreeMap::new()) };
}

/// Times one block's forward (recomputations under activation checkpointing included) when
/// phase profiling is on; does nothing otherwise.
pub struct LayerTimer {
    kind: &'static str,
    start: Option<(Instant, Device)>,
}

impl LayerTimer {
    /// Starts timing a block of `kind` whose input lives on `device`.
    pub fn start(device: &Device, kind: &'static str) -> Result<Self> {
        let start = if enabled() {
            device.synchronize()?;
            Some((Instant::now(), device.clone()))
        } else {
            None
        };
        Ok(LayerTimer { kind, start })
    }

    /// Waits for the device and adds the time since `start` to the block's kind.
    pub fn stop(self) -> Result<()> {
        if let Some((start, device)) = self.start {
            device.synchronize()?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            LAYER_MS.with(|m| *m.borrow_mut().entry(self.kind).or_default() += ms);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_that_is_on_reports_each_phase_and_one_that_is_off_reports_nothing() {
        let dev = Device::Cpu;
        let mut on = PhaseClock::new(&dev, true).unwrap();
        on.mark("forward").unwrap();
        on.mark("backward").unwrap();
        on.mark("forward").unwrap();
        let mut out = BTreeMap::new();
        on.report(&mut out);
        assert_eq!(
            out.keys().collect::<Vec<_>>(),
            vec!["perf/ms/backward", "perf/ms/forward"]
        );
        assert!(out.values().all(|ms| *ms >= 0.0));

        let mut off = PhaseClock::new(&dev, false).unwrap();
        off.mark("forward").unwrap();
        let mut none = BTreeMap::new();
        off.report(&mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn layer_times_are_reported_by_kind_with_their_shares() {
        let dev = Device::Cpu;
        let clock = PhaseClock::new(&dev, true).unwrap();
        LAYER_MS.with(|m| {
            let mut m = m.borrow_mut();
            m.insert("mamba", 3.0);
            m.insert("attention", 1.0);
        });
        let mut out = BTreeMap::new();
        clock.report(&mut out);
        assert_eq!(out["perf/ms/forward/mamba"], 3.0);
        assert_eq!(out["perf/share/mamba"], 0.75);
        assert_eq!(out["perf/share/attention"], 0.25);
        assert!(LAYER_MS.with(|m| m.borrow().is_empty()), "drained");
    }
}
