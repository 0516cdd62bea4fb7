//! Optional per-phase step timing (`TRAINYARD_PROFILE=phases`): the device is synchronised at
//! each phase boundary, so the times are what each phase really costs on a GPU, at the price of
//! those synchronisations. Off by default; then it does nothing.

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

    /// The phase times as metrics `perf/ms/<phase>`.
    pub fn report(self, out: &mut BTreeMap<String, f64>) {
        for (name, ms) in self.totals {
            out.insert(format!("perf/ms/{name}"), ms);
        }
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
}
