//! The accept loop of both listeners (public and admin): a router on hyper's HTTP/1 and
//! HTTP/2 connection builder, as `axum::serve` does, with two things it does not offer.
//!
//! - HTTP/1 buffers are capped at `max_header_bytes`. hyper starts a connection's read buffer
//!   at 8 KiB but, past the first request, reserves another 8 KiB on top of what is left and
//!   so keeps 16 KiB for the life of the connection; with the cap at 8 KiB it stays at 8 KiB.
//!   For 10,000 idle GET streams that is 80 MB (bench/NOTES.md).
//! - Each connection is one task holding only what hyper needs, without axum's per-connection
//!   wrapper.
//!
//! Each request carries its connection's [`ConnectionContext`]: the peer's address, the
//! [`ReadProof`] (an HTTP/1 request coming in proves the responses before it on the
//! connection were read, see there), and the [`Cut`]. One per connection, so a request costs
//! one reference to it.
//!
//! Nobody holds a connection for free ([`ConnectionLimits`]): an HTTP/1 request head must
//! arrive within `header_timeout` (hyper's timer, which also closes a keep-alive connection
//! that sends no next request in that time), a request body within `body_timeout` of its head
//! (else 408, [`BodyTimeout`]), and a connection with no request in flight for
//! `idle_timeout` (an HTTP/2 one that opens no stream, say) is closed. At most
//! `max_connections` are open at once; past that the listener stops accepting, and new
//! connections wait in the kernel's backlog, so a flood of slow connections cannot take the
//! file descriptors the admin listener, the plugins and the database need. A listener with a
//! [`PerAddress`] cap (the admin one) closes at once a connection from an address that holds
//! its share already, and keeps the last slots for addresses that hold none, so that one
//! client's flood of half-sent heads cannot keep the probes out.
//!
//! A stream whose client stops reading fires its connection's [`Cut`], and the connection is
//! closed at once rather than holding what was queued for it until the socket gives up.
//!
//! Every accepted socket gets `TCP_NODELAY` (SSE answers go out in several small writes).
//! When `stop` fires, the listener closes and every connection is asked to finish: an
//! HTTP/1 connection after the response it is writing, an HTTP/2 one after a GOAWAY. The
//! returned future ends when the last connection has.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Version};
use axum::response::Response;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use pin_project_lite::pin_project;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::Service;

use crate::config::{ConnectionLimits, PerAddress};
use crate::stream::{Cut, ReadProof};

pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .max_buf_size(limits.max_header_bytes)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let addresses = limits.per_address.map(Addresses::new);
    // Said at most once a minute: a flood must not flood the log as well.
    let mut said_full: Option<Instant> = None;
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if said_full.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    said_full = Some(Instant::now());
                    tracing::warn!(
                        "{} connections are open, the most allowed (max_connections): new ones wait",
                        limits.max_connections
                    );
                }
                tokio::select! {
                    slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
                    () = stop.cancelled() => break,
                }
            }
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let held = match &addresses {
            None => None,
            Some(a) => match a.admit(peer.ip(), slots.available_permits()) {
                Some(held) => Some(held),
                None => {
                    tracing::debug!(
                        "closing a connection from {peer}: its address holds its share"
                    );
                    continue;
                }
            },
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        let context = Arc::new(ConnectionContext {
            peer,
            proof: Arc::default(),
            cut: Cut::default(),
            activity: Activity::default(),
            body_timeout: limits.body_timeout,
        });
        let service = TowerToHyperService::new(Connection {
            app: app.clone(),
            context: context.clone(),
        });
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(tcp), service)
            .into_owned();
        let connection = graceful.watch(connection);
        let idle_timeout = limits.idle_timeout;
        tokio::spawn(async move {
            let _slot = (slot, held);
            tokio::select! {
                served = connection => if let Err(e) = served {
                    tracing::debug!("connection: {e}");
                },
                () = context.activity.idle_for(idle_timeout) => {
                    tracing::debug!("closing a connection with no request for {} s", idle_timeout.as_secs());
                }
                () = context.cut.fired() => tracing::debug!("closing a connection whose client does not read"),
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Fits the public listener's connection cap to the file descriptors the process may open,
/// so that a flood of connections cannot take those the admin listener, the plugins' pipes
/// and the database need: the soft limit is raised to the hard one, and the cap lowered (with
/// a warning) to leave a quarter of it, or 1,024 descriptors if fewer, to the rest.
pub fn within_descriptors(mut limits: ConnectionLimits) -> ConnectionLimits {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return limits;
    };
    let soft = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    let reserve = (soft / 4).min(1024);
    let fits = soft.saturating_sub(reserve).max(1);
    if limits.max_connections > fits {
        tracing::warn!(
            "max_connections is {}, but the process may open only {soft} files: at most {fits} client connections are taken at once",
            limits.max_connections
        );
        limits.max_connections = fits;
    }
    limits
}

/// The connections each client address holds, for a listener with a [`PerAddress`] cap.
struct Addresses {
    cap: PerAddress,
    held: Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>>,
}

/// One connection counted against its address until it is dropped.
struct Held {
    address: IpAddr,
    held: Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>>,
}

impl Addresses {
    fn new(cap: PerAddress) -> Addresses {
        Addresses {
            cap,
            held: Arc::default(),
        }
    }

    /// Counts a connection from `ip`, unless its address holds its share already, or holds
    /// any while only the kept slots are `free`.
    fn admit(&self, ip: IpAddr, free: usize) -> Option<Held> {
        let address = crate::http::checks::address_key(ip);
        let mut held = self.held.lock().expect("addresses lock");
        let n = held.get(&address).copied().unwrap_or(0);
        if n >= self.cap.max || (n > 0 && free < self.cap.reserved) {
            return None;
        }
        held.insert(address, n + 1);
        Some(Held {
            address,
            held: self.held.clone(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.held.lock().expect("addresses lock");
        if let Some(n) = held.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.address);
            }
        }
    }
}

/// The service of one connection: the router and the connection's context.
#[derive(Clone)]
struct Connection {
    app: Router,
    context: Arc<ConnectionContext>,
}

/// What a request learns of its connection, and the connection's own state.
pub struct ConnectionContext {
    /// The peer's address (a proxy's, when one is in front).
    pub peer: SocketAddr,
    /// Meaningful for HTTP/1 requests only: HTTP/2 ones prove nothing.
    pub proof: Arc<ReadProof>,
    pub cut: Cut,
    activity: Activity,
    body_timeout: Duration,
}

impl ConnectionContext {
    /// The proof of reading, for a request of `version`.
    pub fn proof_for(&self, version: Version) -> Option<Arc<ReadProof>> {
        (version <= Version::HTTP_11).then(|| self.proof.clone())
    }
}

impl Service<Request<Incoming>> for Connection {
    type Response = Response<InFlightBody>;
    type Error = Infallible;
    type Future = InFlight<<Router as Service<Request<Deadline<Incoming>>>>::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<Request<Deadline<Incoming>>>::poll_ready(&mut self.app, cx)
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let context = &self.context;
        let mut request = request.map(|body| Deadline::new(body, context.body_timeout));
        if request.version() <= Version::HTTP_11 {
            context.proof.next_request();
        }
        request.extensions_mut().insert(context.clone());
        InFlight {
            inner: self.app.call(request),
            open: Some(Open::new(context.clone())),
        }
    }
}

/// A connection's requests in flight, counted from the head's arrival to the end (or drop) of
/// the response body, with every start and end noted, so that idleness can be seen. One word:
/// the low half counts requests in flight, the high half (wrapping) counts starts and ends, so
/// each is one atomic step.
#[derive(Default)]
struct Activity(AtomicU64);

/// A request starts: one more in flight, one more change.
const START: u64 = (1 << 32) + 1;
/// A request ends: one more change, one fewer in flight (adding all ones to the low half takes
/// one from it and carries one into the high half).
const END: u64 = (1 << 32) - 1;

impl Activity {
    /// Returns once the connection has had nothing in flight and nothing start or end for
    /// `period` (at most twice `period` after that began).
    async fn idle_for(&self, period: Duration) {
        let mut seen = self.0.load(Ordering::Acquire);
        loop {
            tokio::time::sleep(period).await;
            let now = self.0.load(Ordering::Acquire);
            if now == seen && now as u32 == 0 {
                return;
            }
            seen = now;
        }
    }
}

/// One request in flight on its connection, until dropped.
struct Open(Arc<ConnectionContext>);

impl Open {
    fn new(context: Arc<ConnectionContext>) -> Open {
        context.activity.0.fetch_add(START, Ordering::AcqRel);
        Open(context)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.activity.0.fetch_add(END, Ordering::AcqRel);
    }
}

pin_project! {
    /// The router's future; its response's body carries the request's [`Open`] on.
    struct InFlight<F> {
        #[pin]
        inner: F,
        open: Option<Open>,
    }
}

impl<F: Future<Output = Result<Response, Infallible>>> Future for InFlight<F> {
    type Output = Result<Response<InFlightBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let open = this.open.take();
        Poll::Ready(Ok(response.map(|body| InFlightBody { body, _open: open })))
    }
}

/// A response body, its request in flight until it is dropped.
pub struct InFlightBody {
    body: Body,
    _open: Option<Open>,
}

impl hyper::body::Body for InFlightBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} s", .0.as_secs())]
pub struct BodyTimeout(pub Duration);

impl BodyTimeout {
    /// The timeout among an error's causes, if that is what it was.
    pub fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyTimeout> {
        let mut cause = Some(e);
        while let Some(c) = cause {
            if let Some(t) = c.downcast_ref::<BodyTimeout>() {
                return Some(t);
            }
            cause = c.source();
        }
        None
    }
}

pin_project! {
    /// A request body that must end by a deadline. The timer starts only when a read has to
    /// wait: a body that came with its head costs none.
    pub struct Deadline<B> {
        #[pin]
        body: B,
        timeout: Duration,
        at: Instant,
        #[pin]
        timer: Option<Sleep>,
    }
}

impl<B> Deadline<B> {
    fn new(body: B, timeout: Duration) -> Deadline<B> {
        Deadline {
            body,
            timeout,
            at: Instant::now() + timeout,
            timer: None,
        }
    }
}

impl<B> hyper::body::Body for Deadline<B>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let mut this = self.project();
        if let Poll::Ready(frame) = this.body.poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.timer.is_none() {
            this.timer.set(Some(tokio::time::sleep_until(*this.at)));
        }
        match this.timer.as_pin_mut().map(|t| t.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Some(Err(BodyTimeout(*this.timeout).into()))),
            _ => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A failed `accept`: a connection that went away before it was taken is nothing; anything
/// else (out of file descriptors, most often) is logged and waited out, as a busy loop would
/// not help.
async fn accept_failed(e: &std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::warn!("accepting a connection failed: {e}; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_counts_requests_in_flight_and_changes_in_one_word() {
        let a = Activity::default();
        a.0.fetch_add(START, Ordering::AcqRel);
        a.0.fetch_add(START, Ordering::AcqRel);
        a.0.fetch_add(END, Ordering::AcqRel);
        let now = a.0.load(Ordering::Acquire);
        assert_eq!((now as u32, now >> 32), (1, 3));
        a.0.fetch_add(END, Ordering::AcqRel);
        let now = a.0.load(Ordering::Acquire);
        assert_eq!((now as u32, now >> 32), (0, 4));
        // The change count wraps without touching the count in flight.
        let wrapped = AtomicU64::new(u64::MAX << 32);
        wrapped.fetch_add(START, Ordering::AcqRel);
        assert_eq!(wrapped.load(Ordering::Acquire), 1);
    }
}
