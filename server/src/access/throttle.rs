//! Sign-in throttling: failed attempts are counted per user name and per client address over a
//! sliding window; past the limit, further attempts are refused (429 with `Retry-After`) until the
//! oldest failure leaves the window. A guesser is slowed whether it tries many passwords for one
//! user or one password for many users. Counts live in memory: a restart forgets them, which
//! costs an attacker a restart of our server, not something they control.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed sign-ins allowed per user name within [`WINDOW`].
pub const PER_USER: usize = 5;
/// Failed sign-ins allowed per client address within [`WINDOW`] (a lab behind one NAT shares an
/// address, so this is higher).
pub const PER_CLIENT: usize = 20;
pub const WINDOW: Duration = Duration::from_secs(15 * 60);
/// Keys remembered at most; past it the stalest are forgotten (memory stays bounded under a
/// flood of made-up names).
const MAX_KEYS: usize = 100_000;

#[derive(Default)]
pub struct Throttle {
    failures: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl Throttle {
    /// `Some(seconds to wait)` when the user or the client has used up its failures.
    pub fn check(&self, user: &str, client: &str, now: Instant) -> Option<u64> {
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let wait = |key: String, limit: usize, map: &mut HashMap<String, VecDeque<Instant>>| {
            let times = map.get_mut(&key)?;
            while times
                .front()
                .is_some_and(|t| now.duration_since(*t) >= WINDOW)
            {
                times.pop_front();
            }
            if times.len() < limit {
                return None;
            }
            let oldest = *times.front()?;
            let left = WINDOW.saturating_sub(now.duration_since(oldest));
            Some(left.as_secs().max(1))
        };
        let by_user = wait(user_key(user), PER_USER, &mut map);
        let by_client = wait(client_key(client), PER_CLIENT, &mut map);
        by_user.max(by_client)
    }

    /// Records a failed attempt for both keys.
    pub fn failed(&self, user: &str, client: &str, now: Instant) {
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_KEYS {
            map.retain(|_, times| {
                times
                    .back()
                    .is_some_and(|t| now.duration_since(*t) < WINDOW)
            });
            if map.len() >= MAX_KEYS {
                map.clear();
            }
        }
        for key in [user_key(user), client_key(client)] {
            map.entry(key).or_default().push_back(now);
        }
    }

    /// A successful sign-in clears the user's count (not the client's).
    pub fn succeeded(&self, user: &str) {
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(&user_key(user));
    }
}

fn user_key(user: &str) -> String {
    format!("u:{}", user.to_lowercase())
}

fn client_key(client: &str) -> String {
    format!("c:{client}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_is_refused_after_five_failures_until_the_window_passes() {
        let t = Throttle::default();
        let start = Instant::now();
        for i in 0..PER_USER {
            assert_eq!(t.check("alice", "10.0.0.1", start), None, "attempt {i}");
            t.failed("alice", "10.0.0.1", start);
        }
        let wait = t.check("alice", "10.0.0.2", start).expect("refused");
        assert!(wait > 0 && wait <= WINDOW.as_secs());
        assert_eq!(t.check("bob", "10.0.0.2", start), None);
        assert_eq!(t.check("alice", "10.0.0.2", start + WINDOW), None);
    }

    #[test]
    fn a_client_trying_many_users_is_refused_too() {
        let t = Throttle::default();
        let now = Instant::now();
        for i in 0..PER_CLIENT {
            t.failed(&format!("user{i}"), "10.0.0.9", now);
        }
        assert!(t.check("someone-new", "10.0.0.9", now).is_some());
        assert_eq!(t.check("someone-new", "10.0.0.8", now), None);
    }

    #[test]
    fn success_clears_the_users_count() {
        let t = Throttle::default();
        let now = Instant::now();
        for _ in 0..PER_USER {
            t.failed("alice", "c", now);
        }
        t.succeeded("alice");
        assert_eq!(t.check("alice", "d", now), None);
    }
}
