//! The accept loop. `axum::serve` has no header read timeout and no connection limit, so a
//! client that opens connections and never finishes a request (slowloris) could hold every file
//! descriptor the process has. Here each HTTP/1.1 connection must send its request headers
//! within the header timeout (an idle keep-alive connection, too, is closed after as long), and
//! at most `max_connections` are served at once; further ones wait in the kernel's accept queue,
//! holding none of our descriptors, until a slot frees. One client address holds at most
//! `max_per_address` of them: a connection beyond that is answered `429` at once and closed, so
//! one address cannot take every slot. Request bodies have a total deadline ([`DeadlineBody`]),
//! so a body trickled byte by byte cannot hold its connection for ever either.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Descriptors kept free of connections: the database pool, run log files, launched runs' pipes.
const FD_RESERVE: u64 = 64;

#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
    /// Connections one client address may hold at once (all of them when it is larger).
    pub max_per_address: usize,
}

/// The body of the `429` a connection beyond its address's share gets before it is closed.
const TOO_MANY_CONNECTIONS: &str = "{\"error\":{\"code\":\"too_many_requests\",\"message\":\
    \"this client address has too many connections open to this server; close some first\"}}";

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
    let per_address = Arc::new(PerAddress::default());
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
        let Some(share) = per_address.take(peer.ip(), limits.max_per_address) else {
            refuse(stream, peer);
            continue; // `slot` goes back with this iteration
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
            drop(share);
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Answers a connection over its address's share `429` and closes it. The answer fits in the
/// empty send buffer of a fresh socket; when it does not, the connection just closes.
fn refuse(stream: TcpStream, peer: std::net::SocketAddr) {
    tracing::debug!(%peer, "refused a connection: its address holds its share of connections");
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
         x-content-type-options: nosniff\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{}",
        TOO_MANY_CONNECTIONS.len(),
        TOO_MANY_CONNECTIONS
    );
    let _ = stream.try_write(answer.as_bytes());
    drop(stream);
}

/// Open connections per client address. IPv4-mapped IPv6 addresses count as their IPv4 one.
#[derive(Default)]
struct PerAddress {
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl PerAddress {
    /// A share for one more connection of `ip`, or `None` when it already holds `cap`.
    fn take(self: &Arc<Self>, ip: IpAddr, cap: usize) -> Option<AddressShare> {
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(ip).or_insert(0);
        if *count >= cap.max(1) {
            return None;
        }
        *count += 1;
        Some(AddressShare {
            table: Arc::clone(self),
            ip,
        })
    }

    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// One connection's place in its address's count, given back when the connection ends.
struct AddressShare {
    table: Arc<PerAddress>,
    ip: IpAddr,
}

impl Drop for AddressShare {
    fn drop(&mut self) {
        let mut open = self
            .table
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// A request body that must arrive by a deadline: `deadline` after the request's headers for
/// its first `allowance` bytes, and `deadline` more for each further `allowance` bytes (only
/// streamed uploads, such as MLflow artifacts, are larger than the body limit). The body
/// timeout bounds each pause; this bounds the whole, so a body trickled one byte at a time
/// cannot hold its connection for ever. Past the deadline reading fails with
/// [`BodyDeadlineExceeded`], which the API answers `408`.
pub struct DeadlineBody {
    inner: Body,
    sleep: Pin<Box<Sleep>>,
    deadline: Instant,
    period: Duration,
    allowance: u64,
    received: u64,
    /// Bytes the current deadline covers.
    covered: u64,
    expired: bool,
}

impl DeadlineBody {
    pub fn new(inner: Body, deadline: Duration, allowance: usize) -> Self {
        let at = Instant::now() + deadline;
        let allowance = u64::try_from(allowance).unwrap_or(u64::MAX).max(1);
        DeadlineBody {
            inner,
            sleep: Box::pin(tokio::time::sleep_until(at)),
            deadline: at,
            period: deadline,
            allowance,
            received: 0,
            covered: allowance,
            expired: false,
        }
    }

    /// Wraps every request's body (for `tower::util::MapRequestLayer`).
    pub fn wrap(deadline: Duration, allowance: usize) -> impl Fn(Request) -> Request + Clone {
        move |request: Request| request.map(|body| Body::new(Self::new(body, deadline, allowance)))
    }

    fn exceeded(&self) -> axum::Error {
        axum::Error::new(BodyDeadlineExceeded {
            secs: self.period.as_secs(),
        })
    }
}

type Request = axum::http::Request<Body>;

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.expired || this.sleep.as_mut().poll(cx).is_ready() {
            this.expired = true;
            return Poll::Ready(Some(Err(this.exceeded())));
        }
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            let len = u64::try_from(data.len()).unwrap_or(u64::MAX);
            this.received = this.received.saturating_add(len);
            if this.received > this.covered {
                while this.received > this.covered {
                    this.covered = this.covered.saturating_add(this.allowance);
                    this.deadline += this.period;
                }
                let at = this.deadline;
                this.sleep.as_mut().reset(at);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body did not arrive by its deadline ([`DeadlineBody`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "the request body did not arrive within its deadline ({secs} s, more for a body larger than \
     the body limit); send it faster"
)]
pub struct BodyDeadlineExceeded {
    pub secs: u64,
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
/// limit would not leave `FD_RESERVE` descriptors for everything else (at least one).
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

    #[test]
    fn an_address_holds_at_most_its_share_and_gets_it_back_when_connections_end() {
        let table = Arc::new(PerAddress::default());
        let one: IpAddr = "127.0.0.1".parse().expect("ip");
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().expect("ip");
        let other: IpAddr = "127.0.0.2".parse().expect("ip");
        let first = table.take(one, 2).expect("first");
        let second = table.take(mapped, 2).expect("second, the same address");
        assert!(table.take(one, 2).is_none(), "a third is over the share");
        assert!(
            table.take(mapped, 2).is_none(),
            "mapped IPv6 is the same address"
        );
        let elsewhere = table
            .take(other, 2)
            .expect("another address has its own share");
        drop(first);
        let again = table
            .take(one, 2)
            .expect("a share freed by a closed connection");
        drop((second, again, elsewhere));
        assert_eq!(table.addresses(), 0, "no address stays in the table");
    }

    /// A body whose chunks arrive `pause` apart, `count` of them of `size` bytes.
    fn trickled(count: usize, size: usize, pause: Duration) -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        tokio::spawn(async move {
            for _ in 0..count {
                tokio::time::sleep(pause).await;
                if tx.send(Ok(Bytes::from(vec![b'x'; size]))).await.is_err() {
                    return;
                }
            }
        });
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    /// Reads `body` to its end; the bytes read, and whether it failed on its deadline.
    async fn read(body: DeadlineBody) -> (usize, bool) {
        use futures::StreamExt;
        let mut stream = Body::new(body).into_data_stream();
        let mut read = 0;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => read += bytes.len(),
                Err(e) => {
                    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
                    let mut deadline = false;
                    while let Some(err) = cause {
                        deadline |= err.is::<BodyDeadlineExceeded>();
                        cause = err.source();
                    }
                    return (read, deadline);
                }
            }
        }
        (read, false)
    }

    // Real time, with wide margins: what is asserted is how much of a body arrives, never how
    // fast.
    #[tokio::test]
    async fn a_trickled_body_is_cut_off_at_its_deadline_however_short_each_pause() {
        // A byte every 50 ms for 10 s, against a deadline of half a second.
        let body = trickled(200, 1, Duration::from_millis(50));
        let (read, cut) = read(DeadlineBody::new(body, Duration::from_millis(500), 1000)).await;
        assert!(cut, "the body is cut off on its deadline");
        assert!(read < 200, "cut before the end: {read} bytes");
    }

    #[tokio::test]
    async fn a_body_in_time_arrives_whole_and_a_large_one_earns_more_time() {
        let small = trickled(5, 1, Duration::from_millis(10));
        let small = DeadlineBody::new(small, Duration::from_secs(30), 1000);
        assert_eq!(read(small).await, (5, false));
        // 1,000 bytes over about 2 s against a 1 s deadline per 100 bytes: each chunk of 50
        // bytes earns half a second more than the 100 ms to the next one.
        let large = trickled(20, 50, Duration::from_millis(100));
        let large = DeadlineBody::new(large, Duration::from_secs(1), 100);
        assert_eq!(read(large).await, (1000, false));
    }
}
