//! System metrics of a running run, recorded as `sys/...` series through the ordinary metric
//! path: RSS and CPU of the run's process group from `/proc`, utilization and memory of its GPUs
//! from `nvidia-smi`.
//!
//! The step of a sample is the number of seconds since the attempt started, offset by the
//! run's start so that a restarted or re-adopted run continues its series instead of colliding
//! with earlier steps (writes are first-value-wins on (run, key, step)).

use super::gpus;
use super::process::group_members;
use crate::store::MetricPoint;
use std::time::Instant;

pub struct Sampler {
    pgid: i32,
    gpus: Vec<u32>,
    /// Unix ms the series' step 0 stands for (the run's first start).
    epoch_ms: i64,
    last: Option<(Instant, u64)>,
    ticks_per_sec: f64,
    page_bytes: f64,
}

impl Sampler {
    pub fn new(pgid: i32, gpus: Vec<u32>, epoch_ms: i64) -> Sampler {
        // SAFETY: sysconf only reads a system constant.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        Sampler {
            pgid,
            gpus,
            epoch_ms,
            last: None,
            ticks_per_sec: if ticks > 0 { ticks as f64 } else { 100.0 },
            page_bytes: if page > 0 { page as f64 } else { 4096.0 },
        }
    }

    /// One sample (blocking: reads /proc and may run nvidia-smi). CPU% needs two samples, so
    /// the first call records RSS only.
    pub fn sample(&mut self) -> Vec<MetricPoint> {
        let now_ms = crate::store::now_ms();
        let step = ((now_ms - self.epoch_ms).max(0)) / 1000;
        let members = group_members(self.pgid);
        if members.is_empty() {
            return Vec::new();
        }
        let point = |key: String, value: f64| MetricPoint {
            key,
            step,
            value,
            time: Some(now_ms),
        };
        let rss: u64 = members.iter().map(|m| m.rss_pages).sum();
        let ticks: u64 = members.iter().map(|m| m.cpu_ticks).sum();
        if rss == 0 {
            // Only exited, not yet reaped processes (zombies hold no memory): nothing to measure,
            // and a 0 would read as the run's last memory use.
            return Vec::new();
        }
        let mut points = vec![point(
            "sys/rss_mb".into(),
            rss as f64 * self.page_bytes / (1024.0 * 1024.0),
        )];
        let now = Instant::now();
        if let Some((then, then_ticks)) = self.last {
            let secs = now.duration_since(then).as_secs_f64();
            // A process that left the group can make the sum shrink; report 0 then.
            if secs > 0.0 {
                let used = ticks.saturating_sub(then_ticks) as f64 / self.ticks_per_sec;
                points.push(point("sys/cpu_percent".into(), 100.0 * used / secs));
            }
        }
        self.last = Some((now, ticks));
        for s in gpus::sample(&self.gpus) {
            points.push(point(
                format!("sys/gpu{}/utilization", s.index),
                s.utilization_pct,
            ));
            points.push(point(
                format!("sys/gpu{}/memory_mb", s.index),
                s.memory_used_mb,
            ));
        }
        points.retain(|p| p.value.is_finite());
        points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_our_own_group_reports_rss_then_cpu() {
        // SAFETY: getpgrp has no preconditions.
        let pgid = unsafe { libc::getpgrp() };
        let mut s = Sampler::new(pgid, vec![], crate::store::now_ms());
        let first = s.sample();
        let rss = first.iter().find(|p| p.key == "sys/rss_mb").unwrap();
        assert!(rss.value > 0.0);
        assert!(first.iter().all(|p| p.key != "sys/cpu_percent"));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = s.sample();
        assert!(second.iter().any(|p| p.key == "sys/cpu_percent"));
    }
}
