//! The one path a metric point takes into the server: validate, store (one transaction,
//! idempotent), then publish what was newly stored to the live hub.

use tracing::instrument;

use crate::live::LiveHub;
use crate::store::{
    now_ms, Conflict, MetricPoint, Store, StoreError, MAX_POINTS_PER_BATCH, MAX_STEP,
};

/// Longest metric key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 250;

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// A point (or the batch) breaks a rule; `field` names it, e.g. `points[3].value`.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Most conflicting points one ingest call reports by name (all of them are counted).
pub const MAX_REPORTED_CONFLICTS: usize = 10;

/// What one ingest call did.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestOutcome {
    /// Points in the request (all of them are now stored).
    pub accepted: usize,
    /// Points that were new; a re-sent batch stores nothing twice.
    pub stored: usize,
    /// Points whose (key, step) was already stored (or repeated in the request) with another
    /// value; the stored value is kept.
    pub conflicts: usize,
    /// The first `MAX_REPORTED_CONFLICTS` of them, in request order.
    pub first_conflicts: Vec<Conflict>,
}

/// Validates, stores and publishes one batch of points for a run.
#[instrument(skip(store, live, points), fields(points = points.len()))]
pub async fn ingest_points(
    store: &dyn Store,
    live: &LiveHub,
    run_id: &str,
    points: &[MetricPoint],
) -> Result<IngestOutcome, IngestError> {
    validate_points(points)?;
    let _order = live.write_order(run_id).await;
    let appended = store.append_points(run_id, points, now_ms()).await?;
    let mut conflicts = appended.conflicts;
    let outcome = IngestOutcome {
        accepted: points.len(),
        stored: appended.stored.len(),
        conflicts: conflicts.len(),
        first_conflicts: {
            conflicts.truncate(MAX_REPORTED_CONFLICTS);
            conflicts
        },
    };
    live.publish_points(run_id, appended.stored);
    Ok(outcome)
}

/// Checks a batch against the rules the store relies on.
pub fn validate_points(points: &[MetricPoint]) -> Result<(), IngestError> {
    if points.len() > MAX_POINTS_PER_BATCH {
        return Err(IngestError::Invalid {
            field: "points".into(),
            message: format!(
                "a request may carry at most {MAX_POINTS_PER_BATCH} points, this one has {}",
                points.len()
            ),
        });
    }
    for (i, point) in points.iter().enumerate() {
        let invalid = |name: &str, message: String| IngestError::Invalid {
            field: format!("points[{i}].{name}"),
            message,
        };
        if let Err(message) = validate_key(&point.key) {
            return Err(invalid("key", message));
        }
        if !(0..=MAX_STEP).contains(&point.step) {
            return Err(invalid(
                "step",
                format!(
                    "step must be an integer from 0 to {MAX_STEP} (2^53), got {}",
                    point.step
                ),
            ));
        }
        if !point.value.is_finite() {
            return Err(invalid(
                "value",
                format!("value must be a finite number, got {}", point.value),
            ));
        }
        if point.time.is_some_and(|t| t < 0) {
            return Err(invalid(
                "time",
                "time must be unix milliseconds (>= 0)".into(),
            ));
        }
    }
    Ok(())
}

/// Keys are path-like names such as `train/loss` or `moe/layer0/expert3`.
pub fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("key must not be empty".into());
    }
    if key.len() > MAX_KEY_LEN {
        return Err(format!(
            "key is {} bytes long; at most {MAX_KEY_LEN} are allowed",
            key.len()
        ));
    }
    if let Some(c) = key
        .chars()
        .find(|c| !(c.is_alphanumeric() || "_-./:@ ".contains(*c)))
    {
        return Err(format!(
            "key `{key}` contains `{c}`; allowed are letters, digits, space and _ - . / : @"
        ));
    }
    if key.starts_with(' ') || key.ends_with(' ') {
        return Err(format!("key `{key}` must not start or end with a space"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(key: &str, step: i64, value: f64) -> MetricPoint {
        MetricPoint {
            key: key.into(),
            step,
            value,
            time: None,
        }
    }

    #[test]
    fn every_invalid_point_is_rejected_with_the_field_that_is_wrong() {
        let cases = [
            (p("", 0, 1.0), "points[0].key"),
            (p("a\nb", 0, 1.0), "points[0].key"),
            (p(&"k".repeat(MAX_KEY_LEN + 1), 0, 1.0), "points[0].key"),
            (p("loss", -1, 1.0), "points[0].step"),
            (p("loss", MAX_STEP + 1, 1.0), "points[0].step"),
            (p("loss", i64::MAX, 1.0), "points[0].step"),
            (p("loss", 0, f64::NAN), "points[0].value"),
            (p("loss", 0, f64::INFINITY), "points[0].value"),
            (p("loss", 0, f64::NEG_INFINITY), "points[0].value"),
        ];
        for (point, expected) in cases {
            match validate_points(std::slice::from_ref(&point)) {
                Err(IngestError::Invalid { field, .. }) => assert_eq!(field, expected, "{point:?}"),
                other => panic!("{point:?} should be invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn the_step_range_is_named_and_its_ends_are_accepted() {
        assert!(validate_points(&[p("loss", 0, 1.0), p("loss", MAX_STEP, 1.0)]).is_ok());
        match validate_points(&[p("loss", MAX_STEP + 1, 1.0)]) {
            Err(IngestError::Invalid { message, .. }) => {
                assert!(message.contains("from 0 to 9007199254740992"), "{message}")
            }
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn the_error_names_the_index_of_the_bad_point() {
        let batch = [p("loss", 0, 1.0), p("loss", 1, f64::NAN)];
        match validate_points(&batch) {
            Err(IngestError::Invalid { field, .. }) => assert_eq!(field, "points[1].value"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn a_batch_over_the_limit_is_rejected_and_one_at_the_limit_is_not() {
        let at_limit: Vec<_> = (0..MAX_POINTS_PER_BATCH as i64)
            .map(|s| p("loss", s, 0.5))
            .collect();
        assert!(validate_points(&at_limit).is_ok());
        let mut over = at_limit;
        over.push(p("loss", 1_000_000, 0.5));
        assert!(matches!(
            validate_points(&over),
            Err(IngestError::Invalid { field, .. }) if field == "points"
        ));
    }

    #[test]
    fn typical_metric_keys_are_valid() {
        for key in [
            "train/loss",
            "val/ppl",
            "moe/layer0/expert3",
            "lr",
            "grad_norm",
            "eval:acc@1",
        ] {
            assert!(validate_key(key).is_ok(), "{key}");
        }
    }
}
