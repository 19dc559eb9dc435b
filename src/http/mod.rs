//! The HTTP edge: the `/mcp` endpoint and the checks in front of it.
//!
//! `POST`, `GET` and `DELETE` on `/mcp` are the Streamable HTTP transport ([`mcp`]); every
//! request first passes the Host/Origin guard and the media-type checks ([`checks`]); every
//! refusal is an [`error::HttpError`]. Handlers decide status codes and stream shapes, and
//! hand JSON-RPC to the session and router layers. Every request is counted and timed
//! ([`crate::metrics`]) and runs in a span that its log lines carry ([`trace`]).

pub mod checks;
mod connect;
mod connections;
pub mod error;
mod mcp;
pub mod serve;
mod signin;
pub mod trace;

use std::ops::Deref;
use std::sync::Arc;

use axum::Router;
use axum::routing::post;

use crate::gateway::Gateway;

/// What the public handlers hold: the gateway's state, and the edge's own checks built from
/// its config once.
pub struct Edge {
    gateway: Arc<Gateway>,
    /// The Host and Origin allow-lists (DNS rebinding).
    guard: checks::Guard,
    /// The OpenID provider people sign in at on their credential pages (`[auth.upstream]`,
    /// with people's credentials defined).
    signin: Option<Arc<crate::auth::upstream::Upstream>>,
}

impl Deref for Edge {
    type Target = Gateway;
    fn deref(&self) -> &Gateway {
        &self.gateway
    }
}

/// The public router: `/mcp`, and with authorization on, the OAuth metadata and (built-in
/// mode) the authorization server's endpoints, behind the same Host check.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let signin = match (
        &gateway.config.auth.upstream,
        &gateway.config.auth.public_url,
    ) {
        (Some(up), Some(public)) if gateway.sessions.supervisor.credentials().is_some() => {
            Some(Arc::new(crate::auth::upstream::Upstream::for_pages(
                up.clone(),
                &public.origin().ascii_serialization(),
            )))
        }
        _ => None,
    };
    let edge = Arc::new(Edge {
        guard: checks::Guard::new(&gateway.config),
        signin,
        gateway,
    });
    let mut mcp = Router::new().route("/mcp", post(mcp::post).get(mcp::get).delete(mcp::delete));
    if edge.cluster.is_some() {
        // What another replica forwards: the same handlers, behind the cluster's secret.
        mcp = mcp.route(
            crate::cluster::forward::FORWARDED_PATH,
            post(mcp::post).get(mcp::get).delete(mcp::delete).layer(
                axum::middleware::from_fn_with_state(edge.clone(), from_a_replica),
            ),
        );
    }
    let mcp = mcp.with_state(edge.clone());
    let app = if edge.auth.enabled() {
        let oauth = crate::auth::server::router(edge.auth.clone())
            .merge(connect::router(edge.clone()))
            .merge(connections::router(edge.clone()))
            .merge(signin::router(edge.clone()))
            .layer(axum::middleware::from_fn_with_state(
                edge.clone(),
                host_guard,
            ));
        mcp.merge(oauth)
    } else {
        mcp
    };
    app.layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
        .layer(trace::ObserveLayer)
}

/// A handler that panicked (a bug) answers 500 with a JSON-RPC error instead of dropping the
/// connection; the panic is logged in the request's span.
fn panicked(cause: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let what = cause
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| cause.downcast_ref::<&str>().copied())
        .unwrap_or("a panic");
    tracing::error!("request handler panicked: {what}");
    let body = crate::jsonrpc::error_bytes(
        None,
        crate::jsonrpc::code::INTERNAL_ERROR,
        "Internal error: the gateway failed on this request",
    );
    (
        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// Lets through only requests that carry the cluster's secret, marked as forwarded; anything
/// else is answered as an unknown path.
async fn from_a_replica(
    axum::extract::State(gw): axum::extract::State<Arc<Edge>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let known = gw
        .cluster
        .as_ref()
        .is_some_and(|c| c.is_forwarded(request.headers()));
    if !known {
        return axum::http::StatusCode::NOT_FOUND.into_response();
    }
    if gw
        .cluster
        .as_ref()
        .is_some_and(|c| c.meant_for_another(request.headers()))
    {
        return axum::http::StatusCode::MISDIRECTED_REQUEST.into_response();
    }
    request
        .extensions_mut()
        .insert(crate::cluster::forward::Forwarded);
    next.run(request).await
}

/// The Host and Origin checks (DNS rebinding) for the OAuth endpoints, and the client's
/// address (behind trusted proxies, the one they name) for their per-address limits.
async fn host_guard(
    axum::extract::State(gw): axum::extract::State<Arc<Edge>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if let Err(e) = gw.guard.check(request.headers(), request.uri()) {
        return e.into_response();
    }
    let peer = request
        .extensions()
        .get::<Arc<serve::ConnectionContext>>()
        .map(|c| c.peer.ip().to_canonical());
    if let Some(peer) = peer {
        let ip = checks::client_ip(peer, request.headers(), &gw.config.trusted_proxies);
        request
            .extensions_mut()
            .insert(crate::auth::server::ClientIp(ip));
    }
    next.run(request).await
}
