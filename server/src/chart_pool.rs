//! The bounded pool rendered charts go through: rasterising a large PNG holds its whole pixel
//! buffer, so many at once would hold many buffers. At most [`ChartPool::permits`] charts
//! render at a time (one per core); at most [`QUEUE_PER_PERMIT`] times as many requests are
//! admitted at once (rendering or waiting their turn, with their series read); a request beyond
//! that is refused at once ([`PoolBusy`], a 503 with `Retry-After`) before it reads anything.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Requests admitted per render permit (the one rendering and those waiting for it).
pub const QUEUE_PER_PERMIT: usize = 4;
/// Seconds a client refused by a full pool is asked to wait.
pub const CHART_RETRY_AFTER_S: u32 = 2;

/// Every place in the pool is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the server is rendering as many charts as it can ({admitted} requests admitted); retry shortly")]
pub struct PoolBusy {
    pub admitted: usize,
}

#[derive(Debug)]
pub struct ChartPool {
    render: Arc<Semaphore>,
    admitted: Arc<Semaphore>,
    permits: usize,
    capacity: usize,
}

/// A request's place in the pool, held from before its series are read until its chart is
/// rendered.
#[derive(Debug)]
pub struct Admitted {
    _place: OwnedSemaphorePermit,
}

impl Default for ChartPool {
    /// One render permit per core the server may use.
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        ChartPool::new(cores)
    }
}

impl ChartPool {
    pub fn new(permits: usize) -> Self {
        let permits = permits.max(1);
        let capacity = permits * QUEUE_PER_PERMIT;
        ChartPool {
            render: Arc::new(Semaphore::new(permits)),
            admitted: Arc::new(Semaphore::new(capacity)),
            permits,
            capacity,
        }
    }

    /// Charts rendered at once, at most.
    pub fn permits(&self) -> usize {
        self.permits
    }

    /// Requests admitted at once, at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Render permits free now.
    pub fn idle_permits(&self) -> usize {
        self.render.available_permits()
    }

    /// A place for one more chart request, or [`PoolBusy`] when all are taken.
    pub fn admit(&self) -> Result<Admitted, PoolBusy> {
        self.admitted
            .clone()
            .try_acquire_owned()
            .map(|place| Admitted { _place: place })
            .map_err(|_| PoolBusy {
                admitted: self.capacity,
            })
    }

    /// Runs `work` on the blocking pool once a render permit is free. The permit (and the
    /// request's place) are held until `work` returns, even when the client has gone.
    pub async fn render<T: Send + 'static>(
        &self,
        admitted: Admitted,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> anyhow::Result<T> {
        let permit = self.render.clone().acquire_owned().await?;
        let done = tokio::task::spawn_blocking(move || {
            let out = work();
            drop((permit, admitted));
            out
        })
        .await?;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn no_more_charts_render_at_once_than_the_pool_has_permits() {
        let pool = Arc::new(ChartPool::new(2));
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..pool.capacity() {
            let admitted = pool.admit().unwrap();
            let (pool, now, most) = (pool.clone(), now.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                pool.render(admitted, move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    // Some work, so renders overlap when the pool lets them.
                    let v: u64 = (0..200_000u64).map(|i| i ^ (i >> 3)).sum();
                    now.fetch_sub(1, Ordering::SeqCst);
                    v
                })
                .await
                .unwrap()
            }));
        }
        // Every place is taken while they run: one more is refused.
        assert_eq!(pool.admit().unwrap_err().admitted, 8);
        for t in tasks {
            t.await.unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 2, "{most:?}");
        assert_eq!(pool.idle_permits(), 2);
        assert!(pool.admit().is_ok(), "places come back after rendering");
    }

    #[test]
    fn the_default_pool_has_a_permit_per_core() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pool = ChartPool::default();
        assert_eq!(pool.permits(), cores);
        assert_eq!(pool.capacity(), cores * QUEUE_PER_PERMIT);
    }
}
