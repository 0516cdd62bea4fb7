//! Min/max-preserving downsampling over pre-aggregated rollups.
//!
//! Every stored point also updates one rollup bucket per level (buckets of 2^level steps holding
//! the count and the min and max points). A read of a long series picks an output bucket width
//! that is a multiple of one rollup granule, reads whole rollup buckets in the middle of the
//! range and finer buckets or raw points only at its edges, then keeps each output bucket's min
//! and max. Every piece read lies inside one output bucket, so no extreme can fall between two.

use super::{Series, SeriesPoint, StoreResult};
use std::collections::BTreeMap;

/// Rollup levels: buckets of 64, 512 and 4096 steps.
pub const LEVELS: [u32; 3] = [6, 9, 12];

/// One extreme point of a bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Extreme {
    pub step: i64,
    pub value: f64,
    pub time: i64,
}

/// Count, min and max of a set of points.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agg {
    pub count: i64,
    pub min: Extreme,
    pub max: Extreme,
}

impl Agg {
    pub fn point(step: i64, value: f64, time: i64) -> Self {
        let e = Extreme { step, value, time };
        Agg {
            count: 1,
            min: e,
            max: e,
        }
    }

    /// Ties keep the earlier step, so the result does not depend on merge order.
    pub fn merge(&mut self, other: &Agg) {
        self.count += other.count;
        if (other.min.value, other.min.step) < (self.min.value, self.min.step) {
            self.min = other.min;
        }
        if other.max.value > self.max.value
            || (other.max.value == self.max.value && other.max.step < self.max.step)
        {
            self.max = other.max;
        }
    }
}

/// A rollup bucket's contribution from one batch of newly stored points.
#[derive(Debug, Clone, PartialEq)]
pub struct RollupDelta {
    pub level: i32,
    pub bucket: i64,
    pub agg: Agg,
}

/// Aggregates the newly stored points of one series (step, value, time) into one delta per
/// touched bucket of every level. Only new points go in, so a retried batch adds nothing.
pub fn rollup_deltas(points: &[(i64, f64, i64)]) -> Vec<RollupDelta> {
    let mut out = Vec::new();
    for level in LEVELS {
        let mut buckets: BTreeMap<i64, Agg> = BTreeMap::new();
        for &(step, value, time) in points {
            let p = Agg::point(step, value, time);
            buckets
                .entry(step >> level)
                .and_modify(|a| a.merge(&p))
                .or_insert(p);
        }
        out.extend(buckets.into_iter().map(|(bucket, agg)| RollupDelta {
            level: level as i32,
            bucket,
            agg,
        }));
    }
    out
}

/// Where one part of a range is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Raw points with `from <= step < to`.
    Raw { from: i64, to: i64 },
    /// Rollup buckets of `level` with `from <= bucket < to`.
    Rollup { level: u32, from: i64, to: i64 },
}

/// How to read and bucket a range `[first, last]` of a series.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Output bucket `k` holds steps `base + k*width .. base + (k+1)*width`.
    pub base: i64,
    pub width: i64,
    pub sources: Vec<Source>,
}

fn round_down(x: i64, g: i64) -> i64 {
    x.div_euclid(g) * g
}

fn round_up(x: i64, g: i64) -> i64 {
    round_down(x + g - 1, g)
}

/// Plans a downsampled read of the points with `first <= step <= last` (the first and last
/// stored steps of the range) into at most `max_points / 2` buckets.
pub fn plan(first: i64, last: i64, max_points: usize) -> Plan {
    let buckets = (max_points / 2).max(1) as i64;
    let span = last - first + 1;
    let ideal = (span + buckets - 1) / buckets;
    // The coarsest granule at most half the ideal width: the rounding costs at most half the
    // resolution while the number of rows read stays near 2 * max_points.
    let level = LEVELS
        .iter()
        .rev()
        .copied()
        .find(|&l| (1i64 << l) * 2 <= ideal);
    let granule = level.map_or(1, |l| 1i64 << l);
    let base = round_down(first, granule);
    let width = round_up((last - base + buckets) / buckets, granule).max(granule);
    let mut sources = Vec::new();
    let finer: Vec<u32> = match level {
        Some(l) => LEVELS.iter().rev().copied().filter(|&x| x <= l).collect(),
        None => Vec::new(),
    };
    cover(first, last + 1, &finer, &mut sources);
    Plan {
        base,
        width,
        sources,
    }
}

/// Covers `[from, to)` with whole buckets of the first level, recursing to finer levels (and
/// finally raw points) at the edges.
fn cover(from: i64, to: i64, levels: &[u32], out: &mut Vec<Source>) {
    if from >= to {
        return;
    }
    let Some((&level, finer)) = levels.split_first() else {
        out.push(Source::Raw { from, to });
        return;
    };
    let g = 1i64 << level;
    let lo = round_up(from, g);
    let hi = round_down(to, g);
    if lo >= hi {
        cover(from, to, finer, out);
        return;
    }
    cover(from, lo, finer, out);
    out.push(Source::Rollup {
        level,
        from: lo >> level,
        to: hi >> level,
    });
    cover(hi, to, finer, out);
}

/// Merges pieces (raw points or rollup buckets, each inside one output bucket) into the output:
/// each bucket's min and max, in step order.
pub fn assemble(plan: &Plan, pieces: impl IntoIterator<Item = Agg>) -> Vec<SeriesPoint> {
    let mut buckets: BTreeMap<i64, Agg> = BTreeMap::new();
    for piece in pieces {
        let k = (piece.min.step - plan.base).div_euclid(plan.width);
        buckets
            .entry(k)
            .and_modify(|a| a.merge(&piece))
            .or_insert(piece);
    }
    let mut out = Vec::with_capacity(buckets.len() * 2);
    for agg in buckets.values() {
        let (a, b) = if agg.min.step <= agg.max.step {
            (agg.min, agg.max)
        } else {
            (agg.max, agg.min)
        };
        out.push(SeriesPoint {
            step: a.step,
            value: a.value,
            time: a.time,
        });
        if b.step != a.step {
            out.push(SeriesPoint {
                step: b.step,
                value: b.value,
                time: b.time,
            });
        }
    }
    out
}

/// How a backend reads one series for `read_series`.
#[async_trait::async_trait]
pub trait SeriesSource: Send + Sync {
    /// Points with `from <= step <= to`, in step order.
    async fn raw(&self, from: i64, to: i64) -> StoreResult<Vec<SeriesPoint>>;
    /// Rollup buckets of `level` with `from <= bucket < to`.
    async fn rollups(&self, level: u32, from: i64, to: i64) -> StoreResult<Vec<Agg>>;
    /// The first and last stored steps within `[from, to]`, if any.
    async fn bounds(&self, from: i64, to: i64) -> StoreResult<Option<(i64, i64)>>;
}

/// Reads `key` (with `count` points in all) over the inclusive step range: every point when
/// they fit in `max_points`, else each bucket's min and max from rollups plus raw edges.
pub async fn read_series(
    src: &dyn SeriesSource,
    key: &str,
    count: i64,
    start_step: Option<i64>,
    end_step: Option<i64>,
    max_points: usize,
) -> StoreResult<Series> {
    let max_points = max_points.max(2);
    let lo = start_step.unwrap_or(0).max(0);
    let hi = end_step.unwrap_or(i64::MAX);
    let all = |points: Vec<SeriesPoint>| Series {
        key: key.to_string(),
        total: points.len() as i64,
        downsampled: false,
        points,
    };
    if lo > hi {
        return Ok(all(Vec::new()));
    }
    // Steps are unique within a series, so a range of at most `max_points` steps cannot hold
    // more points than that: it is read whole, without looking for bounds or rollups first.
    let short_range = hi - lo < max_points as i64;
    if short_range || (start_step.is_none() && end_step.is_none() && count <= max_points as i64) {
        return Ok(all(src.raw(lo, hi).await?));
    }
    let Some((first, last)) = src.bounds(lo, hi).await? else {
        return Ok(all(Vec::new()));
    };
    let plan = plan(first, last, max_points);
    if let [Source::Raw { from, to }] = plan.sources[..] {
        // No rollup level fits: the range is one raw read, kept whole when it fits.
        let points = src.raw(from, to - 1).await?;
        if points.len() <= max_points {
            return Ok(all(points));
        }
        let total = points.len() as i64;
        let pieces = points.iter().map(|p| Agg::point(p.step, p.value, p.time));
        return Ok(Series {
            key: key.to_string(),
            total,
            downsampled: true,
            points: assemble(&plan, pieces),
        });
    }
    let mut pieces = Vec::new();
    for source in &plan.sources {
        match *source {
            Source::Raw { from, to } => {
                let points = src.raw(from, to - 1).await?;
                pieces.extend(points.iter().map(|p| Agg::point(p.step, p.value, p.time)));
            }
            Source::Rollup { level, from, to } => {
                pieces.extend(src.rollups(level, from, to).await?);
            }
        }
    }
    let total: i64 = pieces.iter().map(|p| p.count).sum();
    if total <= max_points as i64 {
        return Ok(all(src.raw(first, last).await?));
    }
    Ok(Series {
        key: key.to_string(),
        total,
        downsampled: true,
        points: assemble(&plan, pieces),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(points: &[(i64, f64)], max_points: usize) -> Vec<SeriesPoint> {
        let first = points[0].0;
        let last = points[points.len() - 1].0;
        let p = plan(first, last, max_points);
        assemble(&p, points.iter().map(|&(s, v)| Agg::point(s, v, 0)))
    }

    #[test]
    fn the_plan_covers_the_range_exactly_once() {
        for (first, last, max) in [
            (0, 999_999, 1000),
            (17, 70_001, 100),
            (5, 9, 2),
            (3, 200_000, 3),
        ] {
            let p = plan(first, last, max);
            let mut covered = Vec::new();
            for s in &p.sources {
                match *s {
                    Source::Raw { from, to } => covered.push((from, to)),
                    Source::Rollup { level, from, to } => {
                        covered.push((from << level, to << level))
                    }
                }
            }
            covered.sort();
            assert_eq!(covered[0].0, first);
            assert_eq!(covered[covered.len() - 1].1, last + 1);
            for w in covered.windows(2) {
                assert_eq!(w[0].1, w[1].0, "gap or overlap in {covered:?}");
            }
            let n_buckets = (last - p.base) / p.width + 1;
            assert!(
                n_buckets as usize <= (max / 2).max(1),
                "{n_buckets} buckets for {max}"
            );
            assert!(
                p.width % 64 == 0 || p.sources.iter().all(|s| matches!(s, Source::Raw { .. })),
                "a rollup plan needs whole granules per bucket"
            );
        }
    }

    #[test]
    fn downsampling_keeps_every_bucket_min_and_max_within_the_budget() {
        let points: Vec<(i64, f64)> = (0..10_000)
            .map(|s| (s, ((s * 7919) % 1000) as f64))
            .collect();
        let out = brute(&points, 100);
        assert!(out.len() <= 100);
        assert!(out.windows(2).all(|w| w[0].step < w[1].step));
        assert!(out.iter().any(|p| p.value == 0.0));
        assert!(out.iter().any(|p| p.value == 999.0));
    }
}
