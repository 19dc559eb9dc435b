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
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tower::Service;

use crate::config::{ConnectionLimits, PerAddress};
use crate::stream::{Cut, ReadProof};

mod watch;

use watch::{Activity, Deadline, InFlight, Open, Served};
pub use watch::{BodyTimeout, InFlightBody};

pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let mut h1 = http1::Builder::new();
    h1.max_buf_size(limits.max_header_bytes)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new());
    let protocols = Arc::new(Protocols { h1, h2 });
    let connections = TaskTracker::new();
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
        connections.spawn(sniff_then_serve(
            tcp,
            service,
            context,
            limits.idle_timeout,
            (slot, held),
            Spawn {
                protocols: protocols.clone(),
                connections: connections.clone(),
                stop: stop.clone(),
            },
        ));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// How a connection is served, once its first bytes show its protocol: HTTP/2 with prior
/// knowledge (its preface), else HTTP/1, told apart as hyper-util's `auto` builder does. Each
/// protocol's connections run in tasks of their own type: `auto`'s one future keeps room for
/// an HTTP/2 connection (1.5 KB) in every HTTP/1 one (0.65 KB).
struct Protocols {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
}

/// What a connection's first task needs to start the one that serves it.
struct Spawn {
    protocols: Arc<Protocols>,
    /// Every connection's task, waited for when the listener stops.
    connections: TaskTracker,
    stop: CancellationToken,
}

/// HTTP/2's connection preface: what a client with prior knowledge sends first.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection's first task: reads its first bytes (as long as its idle timeout, unless the
/// listener stops), then starts the task that serves it by its protocol.
async fn sniff_then_serve(
    tcp: TcpStream,
    service: TowerToHyperService<Connection>,
    context: Arc<ConnectionContext>,
    idle_timeout: Duration,
    slot: (OwnedSemaphorePermit, Option<Held>),
    spawn: Spawn,
) {
    let sniffed = tokio::select! {
        sniffed = sniff(tcp) => sniffed,
        () = tokio::time::sleep(idle_timeout) => {
            tracing::debug!("closing a connection with no request for {} s", idle_timeout.as_secs());
            return;
        }
        () = spawn.stop.cancelled() => return,
    };
    let (h2, io) = match sniffed {
        Ok(sniffed) => sniffed,
        Err(e) => {
            tracing::debug!("connection: {e}");
            return;
        }
    };
    let io = TokioIo::new(io);
    let stop = spawn.stop.cancelled_owned();
    if h2 {
        let connection = spawn.protocols.h2.serve_connection(io, service);
        let served = Served::new(connection, context, idle_timeout, slot, stop);
        spawn.connections.spawn(served);
    } else {
        let connection = spawn
            .protocols
            .h1
            .serve_connection(io, service)
            .with_upgrades();
        let served = Served::new(connection, context, idle_timeout, slot, stop);
        spawn.connections.spawn(served);
    }
}

/// Reads a connection's first bytes until they are HTTP/2's preface or cannot be: whether
/// the client speaks HTTP/2, and the connection with what was read put back.
async fn sniff(mut tcp: TcpStream) -> std::io::Result<(bool, Rewind)> {
    let mut pre = [0; H2_PREFACE.len()];
    let mut len = 0;
    let h2 = loop {
        let n = tcp.read(&mut pre[len..]).await?;
        let was = len;
        len += n;
        if n == 0 || pre[was..len] != H2_PREFACE[was..len] {
            break false;
        }
        if len == H2_PREFACE.len() {
            break true;
        }
    };
    Ok((
        h2,
        Rewind {
            pre,
            at: 0,
            len: len as u8,
            tcp,
        },
    ))
}

/// A connection with the bytes [`sniff`] read put back in front of it, kept in place (no
/// allocation).
struct Rewind {
    pre: [u8; H2_PREFACE.len()],
    /// How much of `pre` was handed out, and how much there is.
    at: u8,
    len: u8,
    tcp: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let (at, len) = (usize::from(self.at), usize::from(self.len));
        if at < len {
            let n = (len - at).min(buf.remaining());
            buf.put_slice(&self.pre[at..at + n]);
            self.at += n as u8;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// A connection the listener can ask to finish when it stops: an HTTP/1 one after the
/// response it is writing, an HTTP/2 one after a GOAWAY.
trait Finish: Future<Output = Result<(), hyper::Error>> {
    fn finish(self: Pin<&mut Self>);
}

type Io = TokioIo<Rewind>;
type HyperService = TowerToHyperService<Connection>;

impl Finish for http1::UpgradeableConnection<Io, HyperService> {
    fn finish(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl Finish for http2::Connection<Io, HyperService, TokioExecutor> {
    fn finish(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
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

/// The router's future for one request.
type RouterFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

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
    // Boxed: hyper keeps room for a request's future in each connection for the connection's
    // life (a GET stream's connection, the stream's), 330 bytes for the router's own future;
    // boxed, the room is 24 bytes, and the box goes with the request.
    type Future = InFlight<RouterFuture>;

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
            inner: Box::pin(self.app.call(request)),
            open: Some(Open::new(context.clone())),
        }
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
