//! A client's own timestamps on a run (MLflow's `create_run(start_time=)`,
//! `set_terminated(end_time=)`): unix milliseconds from 0 to a day past the server's clock, so a
//! client clock that is off by hours still lands, and a value in micro- or nanoseconds by
//! mistake is refused naming the field.

use super::Invalid;

/// How far past the server's clock a client's time may be: one day, in milliseconds.
pub const MAX_CLOCK_AHEAD_MS: i64 = 24 * 60 * 60 * 1000;

/// `ms` if it is a time a run may carry, checked against the server's `now` (unix ms).
pub fn client_time(field: &str, ms: i64, now: i64) -> Result<i64, Invalid> {
    if ms < 0 || ms > now.saturating_add(MAX_CLOCK_AHEAD_MS) {
        return Err(Invalid::new(
            field,
            format!(
                "{ms} is not a time this server takes: unix milliseconds from 0 to a day past \
                 the server's clock ({now})"
            ),
        ));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_times_are_milliseconds_up_to_a_day_ahead() {
        let now = 1_700_000_000_000;
        assert_eq!(client_time("start_time", now - 5, now), Ok(now - 5));
        assert_eq!(
            client_time("end_time", now + MAX_CLOCK_AHEAD_MS, now),
            Ok(now + MAX_CLOCK_AHEAD_MS)
        );
        // Nanoseconds by mistake, and negative times, are refused naming the field.
        let refused = client_time("end_time", now * 1_000_000, now).expect_err("ns");
        assert_eq!(refused.field, "end_time");
        assert!(client_time("start_time", -1, now).is_err());
    }
}
