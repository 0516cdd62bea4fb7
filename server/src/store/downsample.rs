//! Min/max-preserving downsampling over pre-aggregated rollups.
//!
//! Every stored point also updates one rollup bucket per level (buckets of 2^level steps holding
//! the count and the min and max points). A read of a long series picks an output bucket width
//! that is a multiple of one rollup granule, reads whole rollup buckets in the middle of the
//! range and finer buckets or raw points only at its edges, then keeps each output bucket's min
//! and max. Every piece read lies inside one output bucket, so no extreme can fall between two.
//!
//! A few far-away points (a stray step of 10^12 in a 300,000-step series) stretch the range so
//! much that nearly every point lands in one bucket. When at most half of the buckets hold
//! points, the buckets that hold more points than they show are read again as ranges of their
//! own with the buckets the empty ones left unused (in proportion to their points), so the dense
//! part keeps its resolution and the output stays within `max_points`.
//!
//! The arithmetic is done in `i128`: a stored step may be as large as `i64::MAX` (steps written
//! before they were bounded by `MAX_STEP`).

use super::{Series, SeriesPoint, StoreResult};
use futures::future::BoxFuture;
use std::collections::BTreeMap;

/// Rollup levels: buckets of 64, 512 and 4096 steps.
pub const LEVELS: [u32; 3] = [6, 9, 12];

/// How many times a read may split crowded buckets further (each time with the buckets the
/// previous split left empty); three levels handle outliers at three very different scales.
const MAX_REFINEMENTS: u32 = 3;

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
/// touched bucket of every level. Only new points go in, so a retried batch adds nothing; NaN
/// points are no bucket's extreme and are not counted (a read finds them by their own index).
pub fn rollup_deltas(points: &[(i64, f64, i64)]) -> Vec<RollupDelta> {
    let mut out = Vec::new();
    for level in LEVELS {
        let mut buckets: BTreeMap<i64, Agg> = BTreeMap::new();
        for &(step, value, time) in points.iter().filter(|p| !p.1.is_nan()) {
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
    /// Raw points with `from <= step <= last`.
    Raw { from: i64, last: i64 },
    /// Rollup buckets of `level` with `from <= bucket < to`.
    Rollup { level: u32, from: i64, to: i64 },
}

/// How to read and bucket a range `[first, last]` of a series.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Output bucket `k` holds steps `base + k*width .. base + (k+1)*width` (`i128`: the width
    /// of one bucket over the whole `i64` range does not fit an `i64`).
    pub base: i128,
    pub width: i128,
    pub sources: Vec<Source>,
}

fn round_down(x: i128, g: i128) -> i128 {
    x.div_euclid(g) * g
}

fn round_up(x: i128, g: i128) -> i128 {
    round_down(x + g - 1, g)
}

/// Plans a downsampled read of the points with `first <= step <= last` (the first and last
/// stored steps of the range) into at most `max_points / 2` buckets.
pub fn plan(first: i64, last: i64, max_points: usize) -> Plan {
    let buckets = (max_points / 2).max(1) as i128;
    let (first, last) = (i128::from(first), i128::from(last));
    let span = last - first + 1;
    let ideal = (span + buckets - 1) / buckets;
    // The coarsest granule at most half the ideal width: the rounding costs at most half the
    // resolution while the number of rows read stays near 2 * max_points.
    let level = LEVELS
        .iter()
        .rev()
        .copied()
        .find(|&l| (1i128 << l) * 2 <= ideal);
    let granule = level.map_or(1, |l| 1i128 << l);
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
/// finally raw points) at the edges. Both ends lie within `0..=i64::MAX + 1`.
fn cover(from: i128, to: i128, levels: &[u32], out: &mut Vec<Source>) {
    if from >= to {
        return;
    }
    let Some((&level, finer)) = levels.split_first() else {
        out.push(Source::Raw {
            from: from as i64,
            last: (to - 1) as i64,
        });
        return;
    };
    let g = 1i128 << level;
    let lo = round_up(from, g);
    let hi = round_down(to, g);
    if lo >= hi {
        cover(from, to, finer, out);
        return;
    }
    cover(from, lo, finer, out);
    out.push(Source::Rollup {
        level,
        from: (lo >> level) as i64,
        to: (hi >> level) as i64,
    });
    cover(hi, to, finer, out);
}

/// The output bucket of a step.
fn bucket_of(plan: &Plan, step: i64) -> i128 {
    (i128::from(step) - plan.base).div_euclid(plan.width)
}

/// Merges pieces (raw points or rollup buckets, each inside one output bucket) into one
/// aggregate per output bucket, by bucket.
fn group(plan: &Plan, pieces: impl IntoIterator<Item = Agg>) -> BTreeMap<i128, Agg> {
    let mut buckets: BTreeMap<i128, Agg> = BTreeMap::new();
    for piece in pieces {
        buckets
            .entry(bucket_of(plan, piece.min.step))
            .and_modify(|a| a.merge(&piece))
            .or_insert(piece);
    }
    buckets
}

/// A bucket's min and max as output points, in step order (one point when they coincide).
fn extremes(agg: &Agg) -> impl Iterator<Item = SeriesPoint> {
    let (a, b) = if agg.min.step <= agg.max.step {
        (agg.min, agg.max)
    } else {
        (agg.max, agg.min)
    };
    let second = (b.step != a.step).then_some(b);
    std::iter::once(a).chain(second).map(|e| SeriesPoint {
        step: e.step,
        value: e.value,
        time: e.time,
    })
}

/// Merges pieces into the output: each bucket's min and max, in step order.
pub fn assemble(plan: &Plan, pieces: impl IntoIterator<Item = Agg>) -> Vec<SeriesPoint> {
    group(plan, pieces).values().flat_map(extremes).collect()
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
    /// The NaN points with `from <= step <= to`, in step order, at most `limit`.
    async fn nan_points(&self, from: i64, to: i64, limit: usize) -> StoreResult<Vec<SeriesPoint>>;
}

/// Most NaN points a downsampled read adds to its bucket extremes (each is a gap mark).
pub const MAX_NAN_MARKS: usize = 1_000;

/// Adds the range's NaN points to a downsampled read (the extremes are finite points only),
/// in step order, each step once.
async fn with_nan_points(
    src: &dyn SeriesSource,
    (lo, hi): (i64, i64),
    points: Vec<SeriesPoint>,
) -> StoreResult<(Vec<SeriesPoint>, i64)> {
    let nans = src.nan_points(lo, hi, MAX_NAN_MARKS).await?;
    if nans.is_empty() {
        return Ok((points, 0));
    }
    let found = nans.len() as i64;
    let mut merged: BTreeMap<i64, SeriesPoint> = points.into_iter().map(|p| (p.step, p)).collect();
    for p in nans {
        merged.entry(p.step).or_insert(p);
    }
    Ok((merged.into_values().collect(), found))
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
    let read = reduce(src, first, last, max_points, 0).await?;
    let (points, nans) = if read.downsampled {
        with_nan_points(src, (first, last), read.points).await?
    } else {
        (read.points, 0)
    };
    Ok(Series {
        key: key.to_string(),
        total: read.total + nans,
        downsampled: read.downsampled,
        points,
    })
}

/// What `reduce` read of a range.
struct Reduced {
    /// Points in the range.
    total: i64,
    downsampled: bool,
    points: Vec<SeriesPoint>,
}

/// The points of `[first, last]` (the range's first and last stored steps): all of them when
/// they fit in `max_points`, else at most `max_points` bucket extremes. `refined` counts the
/// splits above this call.
fn reduce(
    src: &dyn SeriesSource,
    first: i64,
    last: i64,
    max_points: usize,
    refined: u32,
) -> BoxFuture<'_, StoreResult<Reduced>> {
    Box::pin(async move {
        let plan = plan(first, last, max_points);
        let mut pieces = Vec::new();
        let mut whole = None;
        for source in &plan.sources {
            match *source {
                Source::Raw { from, last } => {
                    let points = src.raw(from, last).await?;
                    pieces.extend(
                        points
                            .iter()
                            .filter(|p| !p.value.is_nan())
                            .map(|p| Agg::point(p.step, p.value, p.time)),
                    );
                    if plan.sources.len() == 1 {
                        // The range is one raw read: kept, in case it fits whole.
                        whole = Some(points);
                    }
                }
                Source::Rollup { level, from, to } => {
                    pieces.extend(src.rollups(level, from, to).await?);
                }
            }
        }
        let total: i64 = pieces.iter().map(|p| p.count).sum();
        if total <= max_points as i64 {
            let points = match whole {
                Some(points) => points,
                None => src.raw(first, last).await?,
            };
            return Ok(Reduced {
                total: points.len() as i64,
                downsampled: false,
                points,
            });
        }
        let buckets = group(&plan, pieces);
        let budget = (max_points / 2).max(1);
        let spare = budget.saturating_sub(buckets.len());
        let points = if refined < MAX_REFINEMENTS && spare >= buckets.len() {
            refine(src, &plan, &buckets, (first, last), spare, refined).await?
        } else {
            buckets.values().flat_map(extremes).collect()
        };
        Ok(Reduced {
            total,
            downsampled: true,
            points,
        })
    })
}

/// Re-reads each bucket that holds more points than the two it shows as a range of its own,
/// with a share of the `spare` (empty) buckets in proportion to its points; the others keep
/// their extremes. Each bucket gets at most its own slot plus its share, so the output stays
/// within the budget.
async fn refine(
    src: &dyn SeriesSource,
    plan: &Plan,
    buckets: &BTreeMap<i128, Agg>,
    (first, last): (i64, i64),
    spare: usize,
    refined: u32,
) -> StoreResult<Vec<SeriesPoint>> {
    let crowded: i128 = buckets
        .values()
        .filter(|a| a.count > 2)
        .map(|a| i128::from(a.count))
        .sum();
    let mut out = Vec::new();
    for (&k, agg) in buckets {
        let share = if agg.count > 2 {
            1 + (spare as i128 * i128::from(agg.count) / crowded) as usize
        } else {
            1
        };
        if share < 2 {
            out.extend(extremes(agg));
            continue;
        }
        let lo = (plan.base + k * plan.width).max(i128::from(first)) as i64;
        let hi = (plan.base + (k + 1) * plan.width - 1).min(i128::from(last)) as i64;
        match src.bounds(lo, hi).await? {
            Some((f, l)) => out.extend(reduce(src, f, l, share * 2, refined + 1).await?.points),
            None => out.extend(extremes(agg)),
        }
    }
    Ok(out)
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
            (0, i64::MAX, 1000),
            (i64::MAX - 5_000, i64::MAX, 10),
        ] {
            let p = plan(first, last, max);
            let mut covered: Vec<(i128, i128)> = Vec::new();
            for s in &p.sources {
                match *s {
                    Source::Raw { from, last } => {
                        covered.push((i128::from(from), i128::from(last) + 1))
                    }
                    Source::Rollup { level, from, to } => {
                        covered.push((i128::from(from) << level, i128::from(to) << level))
                    }
                }
            }
            covered.sort();
            assert_eq!(covered[0].0, i128::from(first));
            assert_eq!(covered[covered.len() - 1].1, i128::from(last) + 1);
            for w in covered.windows(2) {
                assert_eq!(w[0].1, w[1].0, "gap or overlap in {covered:?}");
            }
            let n_buckets = (i128::from(last) - p.base) / p.width + 1;
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

    /// A series held in memory, with its rollups, for `read_series`.
    struct Memory {
        points: Vec<SeriesPoint>,
        rollups: BTreeMap<(u32, i64), Agg>,
    }

    impl Memory {
        fn new(steps: impl IntoIterator<Item = i64>) -> Memory {
            let points: Vec<SeriesPoint> = steps
                .into_iter()
                .map(|step| SeriesPoint {
                    step,
                    value: (step % 97) as f64,
                    time: 0,
                })
                .collect();
            let triples: Vec<_> = points.iter().map(|p| (p.step, p.value, p.time)).collect();
            let rollups = rollup_deltas(&triples)
                .into_iter()
                .map(|d| ((d.level as u32, d.bucket), d.agg))
                .collect();
            Memory { points, rollups }
        }
    }

    #[async_trait::async_trait]
    impl SeriesSource for Memory {
        async fn raw(&self, from: i64, to: i64) -> StoreResult<Vec<SeriesPoint>> {
            let mut out: Vec<_> = self
                .points
                .iter()
                .filter(|p| (from..=to).contains(&p.step))
                .cloned()
                .collect();
            out.sort_by_key(|p| p.step);
            Ok(out)
        }
        async fn rollups(&self, level: u32, from: i64, to: i64) -> StoreResult<Vec<Agg>> {
            Ok(self
                .rollups
                .range((level, from)..(level, to))
                .map(|(_, a)| *a)
                .collect())
        }
        async fn bounds(&self, from: i64, to: i64) -> StoreResult<Option<(i64, i64)>> {
            let inside = self.raw(from, to).await?;
            Ok(inside
                .first()
                .zip(inside.last())
                .map(|(a, b)| (a.step, b.step)))
        }
        async fn nan_points(
            &self,
            from: i64,
            to: i64,
            limit: usize,
        ) -> StoreResult<Vec<SeriesPoint>> {
            let mut out = self.raw(from, to).await?;
            out.retain(|p| p.value.is_nan());
            out.truncate(limit);
            Ok(out)
        }
    }

    #[tokio::test]
    async fn a_downsampled_read_keeps_finite_extremes_and_marks_every_nan() {
        let mut src = Memory::new(0..20_000);
        for p in &mut src.points {
            if p.step % 5_000 == 77 {
                p.value = f64::NAN;
            }
        }
        let triples: Vec<_> = src
            .points
            .iter()
            .map(|p| (p.step, p.value, p.time))
            .collect();
        src.rollups = rollup_deltas(&triples)
            .into_iter()
            .map(|d| ((d.level as u32, d.bucket), d.agg))
            .collect();
        let s = read_series(&src, "loss", 20_000, None, None, 200)
            .await
            .expect("read");
        assert!(s.downsampled);
        assert_eq!(s.total, 20_000);
        let nan_steps: Vec<i64> = s
            .points
            .iter()
            .filter(|p| p.value.is_nan())
            .map(|p| p.step)
            .collect();
        assert_eq!(nan_steps, [77, 5_077, 10_077, 15_077]);
        assert!(s.points.windows(2).all(|w| w[0].step < w[1].step));
        let finite = s.points.iter().filter(|p| !p.value.is_nan());
        let (lo, hi) = finite.fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p.value), hi.max(p.value))
        });
        assert_eq!((lo, hi), (0.0, 96.0));
    }

    #[tokio::test]
    async fn a_point_at_the_largest_step_keeps_the_read_within_the_budget() {
        let src = Memory::new((0..30_000).chain([i64::MAX]));
        let s = read_series(&src, "loss", 30_001, None, None, 1_000)
            .await
            .expect("read");
        assert!(s.downsampled);
        assert_eq!(s.total, 30_001);
        assert!(s.points.len() <= 1_000, "{} points", s.points.len());
        assert!(s.points.windows(2).all(|w| w[0].step < w[1].step));
        assert_eq!(s.points.last().map(|p| p.step), Some(i64::MAX));
        let dense = s.points.iter().filter(|p| p.step < 30_000).count();
        assert!(dense >= 400, "the dense part kept only {dense} points");
    }

    #[tokio::test]
    async fn outliers_at_several_scales_leave_the_dense_part_its_resolution() {
        let outliers = [1 << 30, 1 << 40, 1 << 53];
        let src = Memory::new((0..50_000).chain(outliers));
        for max_points in [2, 3, 100, 1_000] {
            let s = read_series(&src, "loss", 50_003, None, None, max_points)
                .await
                .expect("read");
            assert_eq!(s.total, 50_003);
            assert!(
                s.points.len() <= max_points,
                "{} points for max_points={max_points}",
                s.points.len()
            );
            assert!(s.points.windows(2).all(|w| w[0].step < w[1].step));
            if max_points >= 100 {
                for o in outliers {
                    assert!(s.points.iter().any(|p| p.step == o), "outlier {o} kept");
                }
                let dense = s.points.iter().filter(|p| p.step < 50_000).count();
                assert!(
                    dense >= max_points / 3,
                    "{dense} dense points of {max_points}"
                );
            }
            // Every bucket's extremes survive: the global ones are there.
            assert!(s.points.iter().any(|p| p.value == 0.0));
            assert!(s.points.iter().any(|p| p.value == 96.0));
        }
    }
}
