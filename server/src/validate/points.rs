//! A batch of metric points: the rules every point meets before the store writes it (the
//! store's `append_points` checks them, once, and refuses the whole batch on the first break).

use super::limits::MAX_STEP;
use super::Invalid;
use trainer::wire::{MetricPoint, MAX_POINTS_PER_BATCH};

/// Longest metric key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 250;

/// Checks a batch against the rules the store relies on.
pub fn check_points(points: &[MetricPoint]) -> Result<(), Invalid> {
    if points.len() > MAX_POINTS_PER_BATCH {
        return Err(Invalid::new(
            "points",
            format!(
                "a request may carry at most {MAX_POINTS_PER_BATCH} points, this one has {}",
                points.len()
            ),
        ));
    }
    for (i, point) in points.iter().enumerate() {
        let invalid =
            |name: &str, message: String| Invalid::new(format!("points[{i}].{name}"), message);
        if let Err(message) = check_key(&point.key) {
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
        // NaN is a value a run may report (a diverged loss) and is stored; an infinity is not.
        if point.value.is_infinite() {
            return Err(invalid(
                "value",
                format!("value must be a finite number or NaN, got {}", point.value),
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
pub fn check_key(key: &str) -> Result<(), String> {
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
            (p("loss", 0, f64::INFINITY), "points[0].value"),
            (p("loss", 0, f64::NEG_INFINITY), "points[0].value"),
        ];
        for (point, expected) in cases {
            match check_points(std::slice::from_ref(&point)) {
                Err(Invalid { field, .. }) => assert_eq!(field, expected, "{point:?}"),
                other => panic!("{point:?} should be invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_nan_value_is_accepted_and_an_infinity_is_not() {
        assert!(check_points(&[p("loss", 0, f64::NAN)]).is_ok());
        match check_points(&[p("loss", 0, f64::NEG_INFINITY)]) {
            Err(Invalid { message, .. }) => assert!(message.contains("or NaN"), "{message}"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn the_step_range_is_named_and_its_ends_are_accepted() {
        assert!(check_points(&[p("loss", 0, 1.0), p("loss", MAX_STEP, 1.0)]).is_ok());
        match check_points(&[p("loss", MAX_STEP + 1, 1.0)]) {
            Err(Invalid { message, .. }) => {
                assert!(message.contains("from 0 to 9007199254740992"), "{message}")
            }
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn the_error_names_the_index_of_the_bad_point() {
        let batch = [p("loss", 0, 1.0), p("loss", 1, f64::INFINITY)];
        match check_points(&batch) {
            Err(Invalid { field, .. }) => assert_eq!(field, "points[1].value"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn a_batch_over_the_limit_is_rejected_and_one_at_the_limit_is_not() {
        let at_limit: Vec<_> = (0..MAX_POINTS_PER_BATCH as i64)
            .map(|s| p("loss", s, 0.5))
            .collect();
        assert!(check_points(&at_limit).is_ok());
        let mut over = at_limit;
        over.push(p("loss", 1_000_000, 0.5));
        assert!(matches!(
            check_points(&over),
            Err(Invalid { field, .. }) if field == "points"
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
            assert!(check_key(key).is_ok(), "{key}");
        }
    }
}
