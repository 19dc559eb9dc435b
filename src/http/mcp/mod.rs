//! `/mcp`: the Streamable HTTP transport, legacy era (2025-03-26 .. 2025-11-25).
//!
//! POST carries JSON-RPC: `initialize` opens a session; in a session, responses and
//! notifications get 202, requests get one JSON body or an SSE stream that ends after the last
//! response. GET opens the session's stream for server-initiated messages; DELETE ends the
//! session. Which era a POST belongs to is decided by [`crate::protocol::era`] alone.
//!
//! - [`post`]: a POST's body, era, messages, batching and the shape of its answer.
//! - [`initialize`]: a new session.
//! - [`get`]: the GET stream and resumption by `Last-Event-ID`.
//! - [`step_up`]: which plugins a token's scopes reach.
//!
//! This file holds the three handlers, DELETE, and what they share: the session header, the
//! version header, the token, and how a stream's connection opens.

mod get;
mod initialize;
mod limit;
mod modern;
mod post;
mod step_up;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;

use super::Edge;
use super::error::HttpError;
use super::serve::ConnectionContext;
use super::trace::{self, TraceContext};
use crate::auth::Principal;
use crate::cluster::Owner;
use crate::cluster::forward::Forwarded;
use crate::http::checks;
use crate::protocol;
use crate::session::{AdoptError, Session, TooManySessions};
use crate::stream::{Cut, EventId, Opening, ReadProof};
use get::handle_get;
use post::handle_post;

// Names, not strings: a lookup by `&str` parses and lowercases the name on every request.
const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
const VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");
const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// What the listener tells a request about its connection ([`ConnectionContext`]).
struct Conn {
    proof: Option<Arc<ReadProof>>,
    cut: Option<Cut>,
    /// The peer's address (a proxy's, when one is in front).
    peer: Option<SocketAddr>,
    /// Forwarded by another replica of the cluster (its secret checked): served here or
    /// refused, never forwarded again.
    forwarded: bool,
}

impl Conn {
    fn take(gw: &Edge, parts: &mut axum::http::request::Parts) -> Conn {
        let forwarded = parts.extensions.remove::<Forwarded>().is_some();
        match parts.extensions.remove::<Arc<ConnectionContext>>() {
            Some(c) => Conn {
                // A forwarder's or a proxy's pooled connection carries many clients'
                // requests: one of them proves nothing about what another client read.
                proof: if forwarded
                    || checks::via_proxy(c.peer.ip(), &parts.headers, &gw.config.trusted_proxies)
                {
                    None
                } else {
                    c.proof_for(parts.version)
                },
                cut: Some(c.cut.clone()),
                peer: Some(c.peer),
                forwarded,
            },
            None => Conn {
                proof: None,
                cut: None,
                peer: None,
                forwarded,
            },
        }
    }
}

// The handlers take the whole request: axum's `HeaderMap` and `Uri` extractors clone them.

pub async fn post(State(gw): State<Arc<Edge>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let trace = TraceContext::from_headers(&parts.headers);
    let conn = Conn::take(&gw, &mut parts);
    // Boxed: the handler's future is moved several times on its way through axum and hyper,
    // and this one, holding every state of a POST, is kilobytes.
    let forwarded = conn.forwarded;
    let mut response = Box::pin(handle_post(
        &gw,
        &parts.uri,
        &parts.headers,
        body,
        trace,
        conn,
    ))
    .await
    .unwrap_or_else(IntoResponse::into_response);
    name_session(&gw, forwarded, &parts.headers, &mut response);
    response
}

pub async fn get(State(gw): State<Arc<Edge>>, request: Request) -> Response {
    let (mut parts, _) = request.into_parts();
    let conn = Conn::take(&gw, &mut parts);
    let forwarded = conn.forwarded;
    let mut response = handle_get(&gw, &parts.uri, &parts.headers, conn)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    name_session(&gw, forwarded, &parts.headers, &mut response);
    response
}

pub async fn delete(State(gw): State<Arc<Edge>>, request: Request) -> Response {
    let (mut parts, _) = request.into_parts();
    let conn = Conn::take(&gw, &mut parts);
    let mut response = handle_delete(&gw, &parts.uri, &parts.headers, &conn)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    name_session(&gw, conn.forwarded, &parts.headers, &mut response);
    response
}

/// Marks an answer another replica gave (the session's owner, to a forwarded request).
#[derive(Clone, Copy)]
struct Relayed;

/// In cluster mode, a successful answer that this replica gave itself to a client's request
/// for a session names the session (`Mcp-Session-Id`, as the answer to `initialize` does):
/// this replica serves it, so a load balancer can learn where each session lives from its
/// answers (HAProxy's `stick store-response`) and send its next requests straight here. An
/// answer to a forwarded request, and one relayed from the owner, name nothing: they would
/// teach the balancer a replica that does not hold the session.
fn name_session(gw: &Edge, forwarded: bool, request: &HeaderMap, response: &mut Response) {
    if gw.cluster.is_none()
        || forwarded
        || !response.status().is_success()
        || response.extensions().get::<Relayed>().is_some()
        || response.headers().contains_key(&SESSION_HEADER)
    {
        return;
    }
    if let Some(id) = request.get(&SESSION_HEADER) {
        response.headers_mut().insert(SESSION_HEADER, id.clone());
    }
}

/// The request's token, checked (with authorization on): who it speaks for.
async fn authorize(
    gw: &Edge,
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<Option<Principal>, HttpError> {
    let principal = gw.auth.authenticate(headers, uri).await.map_err(|e| {
        let c = gw.auth.challenge(&e);
        HttpError::Auth(e, c)
    })?;
    if let Some(p) = &principal {
        tracing::debug!(subject = %p.subject, client_id = %p.client_id, scopes = ?p.scopes, groups = ?p.groups, "bearer token accepted");
    }
    Ok(principal)
}

/// The session, if it belongs to the request's subject: another subject's session is as
/// unknown to it as one that never existed.
fn owned(session: Arc<Session>, principal: Option<&Principal>) -> Result<Arc<Session>, HttpError> {
    trace::record_session(&session.id);
    if session.owner.as_deref() != principal.map(|p| p.subject.as_str()) {
        tracing::warn!(session = %session.id, "a session was used with another subject's token");
        return Err(HttpError::SessionNotFound);
    }
    session.hold_token(principal);
    Ok(session)
}

/// How a new connection of this session starts: priming and `retry:` for clients at
/// 2025-11-25 or later, event ids when resumable, polling when configured.
fn opening(session: &Session, priming: Option<EventId>, hold: bool) -> Opening {
    let settings = &session.stream_settings;
    let current = protocol::primes_streams(session.version);
    Opening {
        priming: priming.filter(|_| current && settings.resumable),
        retry: current.then_some(settings.retry),
        ids: settings.resumable,
        poll_after: settings
            .poll_after
            .filter(|_| current && settings.resumable),
        keep_alive: settings.keep_alive,
        hold: if hold { settings.hold } else { Duration::ZERO },
        drain: None,
        proof: None,
    }
}

async fn handle_delete(
    gw: &Edge,
    uri: &Uri,
    headers: &HeaderMap,
    conn: &Conn,
) -> Result<Response, HttpError> {
    gw.guard.check(headers, uri)?;
    let principal = authorize(gw, headers, uri).await?;
    let id = session_header(headers)?
        .ok_or_else(|| HttpError::MissingSession(protocol::supported_list()))?;
    let request = (conn, headers, Method::DELETE, Bytes::new());
    let session = match reach(gw, id, principal.as_ref(), request).await? {
        Reached::Here(session) => session,
        Reached::Answered(answer) => return Ok(answer),
    };
    check_version(headers, &session)?;
    gw.sessions
        .delete(&session.id)
        .await
        .ok_or(HttpError::SessionNotFound)?;
    Ok(StatusCode::OK.into_response())
}

fn session_header(headers: &HeaderMap) -> Result<Option<&str>, HttpError> {
    match headers.get(&SESSION_HEADER) {
        None => Ok(None),
        // A value with bytes outside visible ASCII cannot name any session.
        Some(v) => v.to_str().map(Some).map_err(|_| HttpError::SessionNotFound),
    }
}

/// Where a session is served, seen from this replica.
enum Located {
    /// Here: the session, owned by the request's subject.
    Here(Arc<Session>),
    /// On another live replica of the cluster: its id and URL, and whether that answer was
    /// remembered rather than read from Redis just now (see [`crate::cluster::owners`]).
    There {
        replica: String,
        url: String,
        remembered: bool,
    },
}

/// A request for a session: to serve here, or already answered by the replica that owns it.
enum Reached {
    Here(Arc<Session>),
    Answered(Response),
}

/// Finds the request's session and, in cluster mode, the replica that serves it: here (taken
/// over if its replica is gone), or forwarded to the live replica that owns it, whose answer
/// comes back. A forward that finds the owner gone takes the session over and serves it here.
/// An owner taken from memory that turns out not to serve the session (gone, or no longer
/// holding it) is looked up again in Redis, once.
async fn reach(
    gw: &Edge,
    id: &str,
    principal: Option<&Principal>,
    request: (&Conn, &HeaderMap, Method, Bytes),
) -> Result<Reached, HttpError> {
    let (conn, headers, method, body) = request;
    let mut located = locate(gw, id, principal, conn, headers, false).await?;
    loop {
        let (replica, url, remembered) = match located {
            Located::Here(session) => return Ok(Reached::Here(session)),
            Located::There {
                replica,
                url,
                remembered,
            } => (replica, url, remembered),
        };
        let cluster = gw.cluster.as_ref().expect("only cluster mode forwards");
        let get = method == Method::GET;
        let forwarded = cluster
            .forward(&replica, &url, method.clone(), headers, body.clone())
            .await;
        return match forwarded {
            // A GET stream passed through ends when this replica drains, as its own GET
            // streams do: it would otherwise hold the drain for the whole grace period. The
            // client reconnects elsewhere and resumes.
            Ok(answer) if get => {
                let (mut parts, body) = answer.into_parts();
                parts.extensions.insert(Relayed);
                let draining = gw.draining.clone().cancelled_owned();
                let body =
                    axum::body::Body::from_stream(body.into_data_stream().take_until(draining));
                Ok(Reached::Answered(Response::from_parts(parts, body)))
            }
            Ok(mut answer) => {
                answer.extensions_mut().insert(Relayed);
                Ok(Reached::Answered(answer))
            }
            // Neither reached a replica that serves the session: Redis says who does now.
            Err(e) if remembered && (e.gone || e.not_here) => {
                cluster.forget_owner(id);
                located = locate(gw, id, principal, conn, headers, true).await?;
                match &located {
                    // Named again, and still not reachable: gone.
                    Located::There { replica: r, .. } if e.gone && *r == replica => {
                        take_over_gone(gw, id, &replica, principal, conn, headers, &e).await
                    }
                    _ => continue,
                }
            }
            Err(e) if e.not_here => Err(HttpError::SessionNotFound),
            Err(e) if e.gone => {
                take_over_gone(gw, id, &replica, principal, conn, headers, &e).await
            }
            Err(e) => Err(HttpError::OwnerFailed(e.to_string())),
        };
    }
}

/// Takes over a session whose owner, `replica`, a forward found gone.
async fn take_over_gone(
    gw: &Edge,
    id: &str,
    replica: &str,
    principal: Option<&Principal>,
    conn: &Conn,
    headers: &HeaderMap,
    e: &crate::cluster::forward::ForwardError,
) -> Result<Reached, HttpError> {
    tracing::warn!(session = %id, "{e}: taking the session over");
    take_over(gw, id, replica, principal, conn, headers)
        .await
        .map(|located| match located {
            Located::Here(s) => Reached::Here(s),
            // Another replica took it over first: the client retries there.
            Located::There { .. } => {
                Reached::Answered(HttpError::OwnerUnreachable(e.to_string()).into_response())
            }
        })
}

/// Finds a session here, or (in cluster mode, for a request not already forwarded) the live
/// replica that owns it; a session whose replica is gone is taken over. A session no replica
/// serves is not found. With `fresh`, the owner is read from Redis even if remembered.
async fn locate(
    gw: &Edge,
    id: &str,
    principal: Option<&Principal>,
    conn: &Conn,
    headers: &HeaderMap,
    fresh: bool,
) -> Result<Located, HttpError> {
    if let Some(session) = gw.sessions.get(id) {
        return owned(session, principal).map(Located::Here);
    }
    let Some(cluster) = gw.cluster.as_ref() else {
        return Err(HttpError::SessionNotFound);
    };
    if conn.forwarded {
        // Its record names this replica, which does not hold it: a takeover here that failed
        // halfway (the shared store did not answer). Taken over again, as a request that came
        // straight here would.
        let mine = cluster
            .owner_of(id)
            .await
            .map_err(|e| HttpError::Cluster(e.to_string()))?;
        if mine == Some(Owner::Me) {
            let me = cluster.replica().to_string();
            return take_over(gw, id, &me, principal, conn, headers).await;
        }
        // The forwarder named this replica from memory, or a moment ago: it asks again.
        return Err(HttpError::SessionNotHere);
    }
    let (owner, remembered) = cluster
        .owner_of_cached(id, fresh)
        .await
        .map_err(|e| HttpError::Cluster(e.to_string()))?;
    match owner {
        None => Err(HttpError::SessionNotFound),
        Some(Owner::Alive { replica, url }) => Ok(Located::There {
            replica,
            url,
            remembered,
        }),
        Some(Owner::Draining) => Err(HttpError::OwnerUnreachable(
            "the replica that serves this session is handing it over".into(),
        )),
        Some(Owner::Unsure) => Err(HttpError::OwnerUnreachable(
            "the replica that serves this session has not been heard from".into(),
        )),
        // Its record names this replica but it is not here: a takeover that failed halfway.
        Some(Owner::Me) => {
            let me = cluster.replica().to_string();
            take_over(gw, id, &me, principal, conn, headers).await
        }
        Some(Owner::Gone(replica)) => take_over(gw, id, &replica, principal, conn, headers).await,
    }
}

/// Takes over a session whose replica, `gone`, is no more: claimed in the shared store (of
/// two replicas trying, one wins), then rebuilt here from its record.
async fn take_over(
    gw: &Edge,
    id: &str,
    gone: &str,
    principal: Option<&Principal>,
    conn: &Conn,
    headers: &HeaderMap,
) -> Result<Located, HttpError> {
    let cluster = gw.cluster.as_ref().expect("only cluster mode takes over");
    let _one_at_a_time = gw.sessions.adoption_lock(id).lock().await;
    if let Some(session) = gw.sessions.get(id) {
        return owned(session, principal).map(Located::Here);
    }
    let cluster_error = |e: crate::cluster::ClusterError| HttpError::Cluster(e.to_string());
    let claimed = cluster
        .claim(id, gone, gw.config.session.idle_timeout)
        .await
        .map_err(cluster_error)?;
    let Some(record) = claimed else {
        // Ended, or another replica took it over first.
        return match cluster.owner_of(id).await.map_err(cluster_error)? {
            Some(Owner::Alive { replica, url }) => Ok(Located::There {
                replica,
                url,
                remembered: false,
            }),
            Some(Owner::Draining | Owner::Unsure) => Err(HttpError::OwnerUnreachable(
                "the replica that serves this session is handing it over".into(),
            )),
            _ => Err(HttpError::SessionNotFound),
        };
    };
    // As at `initialize`: the plugins' probes are awaited on a replica that just started, so
    // the session's first request here finds the tools they offer.
    gw.registry.ready(gw.probe_wait()).await;
    let client = checks::client_key(
        record.owner.as_deref(),
        conn.peer,
        headers,
        &gw.config.trusted_proxies,
    );
    let session = gw
        .sessions
        .adopt(record, client, &gw.shutdown)
        .await
        .map_err(|e| match e {
            AdoptError::TooMany(TooManySessions::Gateway) => HttpError::TooManySessions(None),
            AdoptError::TooMany(TooManySessions::Client(n)) => {
                HttpError::TooManySessionsForClient(n, None)
            }
            AdoptError::Store(e) => HttpError::EventStore(e),
        })?;
    owned(session, principal).map(Located::Here)
}

/// `MCP-Protocol-Version`, when sent, must be a supported version and the session's. The
/// transport's fallback version (2025-03-26, what a server assumes for a request without the
/// header) is accepted on any session: the official conformance suite sends it on sessions it
/// negotiated at 2025-11-25.
fn check_version(headers: &HeaderMap, session: &Session) -> Result<(), HttpError> {
    let mut values = headers.get_all(&VERSION_HEADER).iter();
    let Some(v) = values.next() else {
        return Ok(());
    };
    if values.next().is_some() {
        return Err(HttpError::BadProtocolVersion(
            "MCP-Protocol-Version is sent more than once".into(),
        ));
    }
    let v = v.to_str().map_err(|_| {
        HttpError::BadProtocolVersion("MCP-Protocol-Version is not valid text".into())
    })?;
    protocol::check_version_header(v, session.version).map_err(HttpError::BadProtocolVersion)
}

fn json_response(status: StatusCode, body: Bytes) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
