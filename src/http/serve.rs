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
//! Each HTTP/1 request carries its connection's [`ReadProof`], and coming in proves the
//! responses before it on the connection were read (see there).
//!
//! Every accepted socket gets `TCP_NODELAY` (SSE answers go out in several small writes).
//! When `stop` fires, the listener closes and every connection is asked to finish: an
//! HTTP/1 connection after the response it is writing, an HTTP/2 one after a GOAWAY. The
//! returned future ends when the last connection has.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::{Request, Version};
use axum::response::Response;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::Service;

use crate::stream::ReadProof;

pub async fn serve(
    listener: TcpListener,
    app: Router,
    max_header_bytes: usize,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().max_buf_size(max_header_bytes);
    let graceful = GracefulShutdown::new();
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        let service = TowerToHyperService::new(Connection {
            app: app.clone(),
            proof: Arc::default(),
        });
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(tcp), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection: {e}");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The service of one connection: the router, and the connection's proof of reading.
#[derive(Clone)]
struct Connection {
    app: Router,
    proof: Arc<ReadProof>,
}

impl<B> Service<Request<B>> for Connection
where
    Router: Service<Request<B>, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = <Router as Service<Request<B>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<Request<B>>::poll_ready(&mut self.app, cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if request.version() <= Version::HTTP_11 {
            self.proof.next_request();
            request.extensions_mut().insert(self.proof.clone());
        }
        self.app.call(request)
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
