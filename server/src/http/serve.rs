//! The accept loop. `axum::serve` has no header read timeout and no connection limit, so a
//! client that opens connections and never finishes a request (slowloris) could hold every file
//! descriptor the process has. Here each HTTP/1.1 connection must send its request headers
//! within the header timeout (an idle keep-alive connection, too, is closed after as long), and
//! at most `max_connections` are served at once; further ones wait in the kernel's accept queue,
//! holding none of our descriptors, until a slot frees.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Descriptors kept free of connections: the database pool, run log files, launched runs' pipes.
const FD_RESERVE: u64 = 64;

#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` completes, then lets open connections finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let cap = connection_cap(limits.max_connections, fd_soft_limit());
    if cap < limits.max_connections {
        tracing::warn!(
            configured = limits.max_connections,
            serving = cap,
            "the open-file limit is too low for --max-connections; serving fewer connections"
        );
    }
    let slots = Arc::new(Semaphore::new(cap));
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break, // never closed; stop serving if it were
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = accept(&listener) => accepted,
            () = &mut shutdown => break,
        };
        // Handlers see the client's address (audit log, sign-in throttling).
        let with_peer = tower::ServiceExt::map_request(
            app.clone(),
            move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                req
            },
        );
        let service = TowerToHyperService::new(with_peer);
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                // Timeouts and clients that hang up land here; nothing the operator must act on.
                tracing::debug!(%peer, error = %err, "connection closed with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The next connection. Errors of one connection (reset before accept) are skipped; others, such
/// as running out of descriptors, are logged and retried after a pause instead of spinning.
async fn accept(listener: &TcpListener) -> (tokio::net::TcpStream, std::net::SocketAddr) {
    use std::io::ErrorKind;
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(err)
                if matches!(
                    err.kind(),
                    ErrorKind::ConnectionAborted
                        | ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionRefused
                ) => {}
            Err(err) => {
                tracing::error!(error = %err, "accepting a connection failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// How many connections to serve at once: the configured number, lowered when the open-file
/// limit would not leave [`FD_RESERVE`] descriptors for everything else (at least one).
pub fn connection_cap(configured: usize, fd_limit: Option<u64>) -> usize {
    match fd_limit {
        Some(limit) => {
            let room = usize::try_from(limit.saturating_sub(FD_RESERVE)).unwrap_or(usize::MAX);
            configured.min(room).max(1)
        }
        None => configured.max(1),
    }
}

/// The soft `RLIMIT_NOFILE`, when there is one.
#[cfg(unix)]
fn fd_soft_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given, which lives for the call.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    // `rlim_t` is u64 on Linux but not on every Unix.
    #[allow(clippy::unnecessary_cast)]
    let current = limit.rlim_cur as u64;
    (ok && limit.rlim_cur != libc::RLIM_INFINITY).then_some(current)
}

#[cfg(not(unix))]
fn fd_soft_limit() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_leaves_descriptors_for_the_rest_of_the_server() {
        assert_eq!(connection_cap(512, None), 512);
        assert_eq!(connection_cap(512, Some(65_536)), 512);
        assert_eq!(connection_cap(512, Some(256)), 256 - FD_RESERVE as usize);
        assert_eq!(connection_cap(512, Some(10)), 1);
        assert_eq!(connection_cap(0, None), 1);
    }
}
