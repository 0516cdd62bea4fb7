//! Preparing a metric batch for either backend: the one check, de-duplication, and what the
//! newly inserted points change in their series and rollups.

use super::{StoreError, StoreResult};
use std::collections::HashMap;

/// A point ready to store: its time filled in.
#[derive(Debug, Clone)]
pub struct BatchPoint {
    /// Position in the request.
    pub index: usize,
    pub key: String,
    pub step: i64,
    pub value: f64,
    pub time: i64,
}

/// A validated batch with repeats of a (key, step) set aside (the first value wins).
#[derive(Debug, Default)]
pub struct Batch {
    pub points: Vec<BatchPoint>,
    /// Later points of a (key, step) the batch already has; never written.
    pub repeats: Vec<BatchPoint>,
    /// Distinct keys, in first-seen order.
    pub keys: Vec<String>,
}

/// Checks a batch against `validate::points` (a bad point is a client error, never a database
/// one) and sets repeats aside.
pub fn prepare_batch(points: &[super::MetricPoint], now_ms: i64) -> StoreResult<Batch> {
    crate::validate::points::check_points(points).map_err(StoreError::Rejected)?;
    let mut seen = std::collections::HashSet::with_capacity(points.len());
    let mut keys = Vec::new();
    let mut key_seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(points.len());
    let mut repeats = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let point = BatchPoint {
            index: i,
            key: p.key.clone(),
            step: p.step,
            value: p.value,
            time: p.time.unwrap_or(now_ms),
        };
        if !seen.insert((p.key.as_str(), p.step)) {
            repeats.push(point);
            continue;
        }
        if key_seen.insert(p.key.as_str()) {
            keys.push(p.key.clone());
        }
        out.push(point);
    }
    Ok(Batch {
        points: out,
        repeats,
        keys,
    })
}

/// Series ids of a run's keys.
#[derive(Debug, Default)]
pub struct SeriesMap(HashMap<String, i64>);

impl SeriesMap {
    pub fn insert(&mut self, key: String, id: i64) {
        self.0.insert(key, id);
    }
    pub fn get(&self, key: &str) -> Option<i64> {
        self.0.get(key).copied()
    }
    pub fn iter(&self) -> impl Iterator<Item = (&String, i64)> {
        self.0.iter().map(|(k, &id)| (k, id))
    }
    /// Every key of a batch has a series before its points are written.
    pub fn id(&self, key: &str) -> i64 {
        self.0.get(key).copied().unwrap_or(-1)
    }
}

/// What a batch changed in one series: points added and the latest of them.
#[derive(Debug, Clone)]
pub struct SeriesUpdate {
    pub series_id: i64,
    pub added: i64,
    pub last_step: i64,
    pub last_value: f64,
    pub last_time: i64,
}

pub struct Outcome {
    pub stored: Vec<super::StoredPoint>,
    pub series: Vec<SeriesUpdate>,
    pub rollups: Vec<(i64, super::downsample::RollupDelta)>,
}

/// From the points the database actually inserted ((series, step) → seq), the stored points
/// in input order, the series updates and the rollup deltas. Only new points count, so a
/// retried batch changes nothing.
pub fn summarize(
    batch: &Batch,
    series: &SeriesMap,
    inserted: &HashMap<(i64, i64), i64>,
) -> Outcome {
    let (series_updates, rollups) = changes(batch, series, |sid, step| {
        inserted.contains_key(&(sid, step))
    });
    Outcome {
        stored: stored(batch, series, inserted),
        series: series_updates,
        rollups,
    }
}

/// The (series, step)s of the batch's points that were not inserted: they were stored before.
pub fn not_inserted(
    batch: &Batch,
    series: &SeriesMap,
    inserted: &HashMap<(i64, i64), i64>,
) -> Vec<(i64, i64)> {
    batch
        .points
        .iter()
        .map(|p| (series.id(&p.key), p.step))
        .filter(|k| !inserted.contains_key(k))
        .collect()
}

/// The points of the request whose value differs from the one the store keeps, in input
/// order. `earlier` holds the stored values of the batch's points that were stored before
/// ((series, step) → value); every other point of `batch.points` was just inserted.
pub fn conflicts(
    batch: &Batch,
    series: &SeriesMap,
    earlier: &HashMap<(i64, i64), f64>,
) -> Vec<super::Conflict> {
    let kept = |p: &BatchPoint| {
        earlier
            .get(&(series.id(&p.key), p.step))
            .copied()
            .unwrap_or(p.value)
    };
    let mut out: Vec<(usize, super::Conflict)> = Vec::new();
    let conflict = |p: &BatchPoint, stored_value: f64| super::Conflict {
        key: p.key.clone(),
        step: p.step,
        stored_value,
        sent_value: p.value,
    };
    if !earlier.is_empty() {
        for p in &batch.points {
            let value = kept(p);
            if !same_value(value, p.value) {
                out.push((p.index, conflict(p, value)));
            }
        }
    }
    if !batch.repeats.is_empty() {
        let first: HashMap<(&str, i64), &BatchPoint> = batch
            .points
            .iter()
            .map(|p| ((p.key.as_str(), p.step), p))
            .collect();
        for r in &batch.repeats {
            let value = first
                .get(&(r.key.as_str(), r.step))
                .map_or(r.value, |p| kept(p));
            if !same_value(value, r.value) {
                out.push((r.index, conflict(r, value)));
            }
        }
        out.sort_by_key(|(i, _)| *i);
    }
    out.into_iter().map(|(_, c)| c).collect()
}

/// Whether a value sent again is the one stored (a NaN sent again is no conflict).
fn same_value(stored: f64, sent: f64) -> bool {
    stored == sent || (stored.is_nan() && sent.is_nan())
}

/// The batch's points that were inserted, in input order, with their seqs.
pub fn stored(
    batch: &Batch,
    series: &SeriesMap,
    inserted: &HashMap<(i64, i64), i64>,
) -> Vec<super::StoredPoint> {
    let mut stored = Vec::with_capacity(inserted.len());
    for p in &batch.points {
        if let Some(&seq) = inserted.get(&(series.id(&p.key), p.step)) {
            stored.push(super::StoredPoint {
                key: p.key.clone(),
                step: p.step,
                value: p.value,
                time: p.time,
                seq,
            });
        }
    }
    stored
}

/// Every point of the batch stored, `seqs[i]` being the seq of `batch.points[i]`.
pub fn stored_in_order(batch: &Batch, seqs: &[i64]) -> Vec<super::StoredPoint> {
    batch
        .points
        .iter()
        .zip(seqs)
        .map(|(p, &seq)| super::StoredPoint {
            key: p.key.clone(),
            step: p.step,
            value: p.value,
            time: p.time,
            seq,
        })
        .collect()
}

/// What the batch's points for which `is_new(series, step)` holds change: one update per
/// series and one rollup delta per touched bucket, both in a fixed order.
pub fn changes(
    batch: &Batch,
    series: &SeriesMap,
    is_new: impl Fn(i64, i64) -> bool,
) -> (
    Vec<SeriesUpdate>,
    Vec<(i64, super::downsample::RollupDelta)>,
) {
    let mut per_series: HashMap<i64, Vec<(i64, f64, i64)>> = HashMap::new();
    for p in &batch.points {
        let sid = series.id(&p.key);
        if is_new(sid, p.step) {
            per_series
                .entry(sid)
                .or_default()
                .push((p.step, p.value, p.time));
        }
    }
    let mut updates = Vec::with_capacity(per_series.len());
    let mut rollups = Vec::new();
    for (sid, points) in per_series {
        // The latest value is the latest finite one: a NaN point counts, but leaves it as it
        // was (step -1 never replaces a stored one).
        let last = points
            .iter()
            .filter(|p| !p.1.is_nan())
            .max_by_key(|p| p.0)
            .copied()
            .unwrap_or((-1, 0.0, 0));
        updates.push(SeriesUpdate {
            series_id: sid,
            added: points.len() as i64,
            last_step: last.0,
            last_value: last.1,
            last_time: last.2,
        });
        rollups.extend(
            super::downsample::rollup_deltas(&points)
                .into_iter()
                .map(|d| (sid, d)),
        );
    }
    // A fixed order keeps concurrent writers from locking rows in opposite orders.
    updates.sort_by_key(|u| u.series_id);
    rollups.sort_by_key(|(sid, d)| (*sid, d.level, d.bucket));
    (updates, rollups)
}

/// The lowest and highest step of each series in the batch, by series id.
pub fn step_ranges(batch: &Batch, series: &SeriesMap) -> Vec<(i64, i64, i64)> {
    let mut ranges: HashMap<i64, (i64, i64)> = HashMap::new();
    for p in &batch.points {
        ranges
            .entry(series.id(&p.key))
            .and_modify(|r| *r = (r.0.min(p.step), r.1.max(p.step)))
            .or_insert((p.step, p.step));
    }
    let mut out: Vec<_> = ranges
        .into_iter()
        .map(|(s, (lo, hi))| (s, lo, hi))
        .collect();
    out.sort_unstable();
    out
}

/// Merges a rollup delta into an existing bucket (both backends' upsert syntax).
pub const ROLLUP_MERGE: &str = " ON CONFLICT (series_id, level, bucket) DO UPDATE SET \
    count = metric_rollups.count + excluded.count, \
    min_step = CASE WHEN excluded.min_value < metric_rollups.min_value THEN excluded.min_step \
        ELSE metric_rollups.min_step END, \
    min_value = CASE WHEN excluded.min_value < metric_rollups.min_value THEN excluded.min_value \
        ELSE metric_rollups.min_value END, \
    min_time = CASE WHEN excluded.min_value < metric_rollups.min_value THEN excluded.min_time \
        ELSE metric_rollups.min_time END, \
    max_step = CASE WHEN excluded.max_value > metric_rollups.max_value THEN excluded.max_step \
        ELSE metric_rollups.max_step END, \
    max_value = CASE WHEN excluded.max_value > metric_rollups.max_value THEN excluded.max_value \
        ELSE metric_rollups.max_value END, \
    max_time = CASE WHEN excluded.max_value > metric_rollups.max_value THEN excluded.max_time \
        ELSE metric_rollups.max_time END";
