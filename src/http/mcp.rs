//! `/mcp`: the Streamable HTTP transport, legacy era (2025-03-26 .. 2025-11-25).
//!
//! POST carries JSON-RPC: `initialize` opens a session; in a session, responses and
//! notifications get 202, requests get one JSON body or an SSE stream that ends after the last
//! response. GET opens the session's stream for server-initiated messages; DELETE ends the
//! session. Which era a POST belongs to is decided by [`crate::protocol::era`] alone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::Instrument;

use super::checks;
use super::error::HttpError;
use super::serve::ConnectionContext;
use super::trace::{self, TraceContext};
use crate::auth::{AuthError, Principal};
use crate::config::ResponseMode;
use crate::gateway::Gateway;
use crate::jsonrpc::{self, Body as RpcBody, Id, Message};
use crate::protocol;
use crate::protocol::era::{self, Era};
use crate::registry::{View, ViewPlugin};
use crate::router;
use crate::session::UnknownStream;
use crate::session::{ClientInit, Session, TooManySessions};
use crate::stream::{
    self, AttachError, Cursor, Cut, EventId, Opening, ReadProof, ReplayError, Sink, Stream,
    StreamGuard,
};

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
}

impl Conn {
    fn take(parts: &mut axum::http::request::Parts) -> Conn {
        match parts.extensions.remove::<Arc<ConnectionContext>>() {
            Some(c) => Conn {
                proof: c.proof_for(parts.version),
                cut: Some(c.cut.clone()),
                peer: Some(c.peer),
            },
            None => Conn {
                proof: None,
                cut: None,
                peer: None,
            },
        }
    }
}

// The handlers take the whole request: axum's `HeaderMap` and `Uri` extractors clone them.

pub async fn post(State(gw): State<Arc<Gateway>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let trace = TraceContext::from_headers(&parts.headers);
    let conn = Conn::take(&mut parts);
    // Boxed: the handler's future is moved several times on its way through axum and hyper,
    // and this one, holding every state of a POST, is kilobytes.
    Box::pin(handle_post(
        &gw,
        &parts.uri,
        &parts.headers,
        body,
        trace,
        conn,
    ))
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

pub async fn get(State(gw): State<Arc<Gateway>>, request: Request) -> Response {
    let (mut parts, _) = request.into_parts();
    let conn = Conn::take(&mut parts);
    handle_get(&gw, &parts.uri, &parts.headers, conn)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn delete(State(gw): State<Arc<Gateway>>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    handle_delete(&gw, &parts.uri, &parts.headers).unwrap_or_else(IntoResponse::into_response)
}

async fn handle_post(
    gw: &Arc<Gateway>,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
    trace: Option<TraceContext>,
    conn: Conn,
) -> Result<Response, HttpError> {
    gw.guard.check(headers, uri)?;
    // The body is read before the checks that may refuse the request: hyper ends a
    // connection whose request body was not all read when its response went out, and a
    // client that pooled it (a 401, then the same request with a token) finds it closed
    // under its next request.
    let bytes = read_body(headers, body, gw.config.max_body_bytes).await?;
    let principal = authorize(gw, headers, uri)?;
    checks::accepts_post(headers)?;
    checks::json_content(headers)?;
    let parsed = jsonrpc::parse_body(&bytes).map_err(HttpError::Parse)?;
    let session_id = session_header(headers)?;
    match era::classify(session_id, &parsed) {
        Era::Initialize => initialize(gw, headers, parsed, principal.as_ref(), &conn).await,
        Era::Sessionless { .. } => Err(HttpError::MissingSession(protocol::supported_list())),
        Era::Session(id) => {
            let session = owned_session(gw, id, principal.as_ref())?;
            check_version(headers, &session)?;
            in_session(
                gw,
                session,
                parsed,
                principal.as_ref(),
                trace.as_ref(),
                conn,
            )
            .await
        }
    }
}

/// The request's token, checked (with authorization on): who it speaks for.
fn authorize(gw: &Gateway, headers: &HeaderMap, uri: &Uri) -> Result<Option<Principal>, HttpError> {
    gw.auth.authenticate(headers, uri).map_err(|e| {
        let c = gw.auth.challenge(&e);
        HttpError::Auth(e, c)
    })
}

/// A session, if it exists and belongs to the request's subject: another subject's session
/// is as unknown to it as one that never existed.
fn owned_session(
    gw: &Gateway,
    id: &str,
    principal: Option<&Principal>,
) -> Result<Arc<Session>, HttpError> {
    let session = gw.sessions.get(id).ok_or(HttpError::SessionNotFound)?;
    trace::record_session(&session.id);
    if session.owner.as_deref() != principal.map(|p| p.subject.as_str()) {
        tracing::warn!(session = %session.id, "a session was used with another subject's token");
        return Err(HttpError::SessionNotFound);
    }
    Ok(session)
}

/// Opens the session's GET stream, or (with `Last-Event-ID`) resumes any of its streams:
/// what the store holds after the cursor, then live events.
async fn handle_get(
    gw: &Arc<Gateway>,
    uri: &Uri,
    headers: &HeaderMap,
    conn: Conn,
) -> Result<Response, HttpError> {
    gw.guard.check(headers, uri)?;
    let principal = authorize(gw, headers, uri)?;
    checks::accepts_sse(headers)?;
    let session = require_session(gw, headers, principal.as_ref())?;
    check_version(headers, &session)?;
    session.touch();
    session.mark_used();
    let (stream, cursor) = match headers.get(&LAST_EVENT_ID) {
        None => (session.get.clone(), Cursor::Undelivered),
        Some(v) => resume_point(&session, v).map_err(|e| cursor_miss(&session, e))?,
    };
    let resumed = matches!(cursor, Cursor::After(_));
    let attached = stream.attach(cursor, conn.cut).await.map_err(|e| match e {
        AttachError::Busy => HttpError::Conflict("a GET stream is already open for this session"),
        AttachError::Released => cursor_miss(
            &session,
            HttpError::Gone("that stream has ended and its events were released".into()),
        ),
        AttachError::BeyondEnd(seq) => cursor_miss(
            &session,
            HttpError::BadLastEventId(format!("no event {seq} was sent on that stream")),
        ),
        AttachError::Replay(ReplayError::Evicted { oldest_kept }) => cursor_miss(
            &session,
            HttpError::Gone(format!(
                "the events after it are no longer kept (the oldest kept is event {oldest_kept})"
            )),
        ),
        AttachError::Replay(ReplayError::Backend(e)) => HttpError::EventStore(e),
    })?;
    if resumed {
        crate::metrics::get().replays_served.inc();
        tracing::debug!(session = %session.id, "resuming stream {} after {:?}", stream.number(), headers.get(&LAST_EVENT_ID));
    }
    let priming = (!resumed).then(|| attached.cursor_id());
    let guard = StreamGuard::new(session.connections.clone());
    let mut opening = opening(&session, priming, false);
    opening.drain = Some(gw.draining.clone());
    opening.proof = conn.proof;
    Ok(stream::sse_response(attached, opening, session.closed.clone(), guard).await)
}

/// The stream and cursor a `Last-Event-ID` names in this session.
fn resume_point(
    session: &Session,
    value: &HeaderValue,
) -> Result<(Arc<Stream>, Cursor), HttpError> {
    if !session.stream_settings.resumable {
        return Err(HttpError::BadLastEventId(
            "resumption is turned off on this gateway".into(),
        ));
    }
    let text = value
        .to_str()
        .map_err(|_| HttpError::BadLastEventId("the header is not text".into()))?;
    let id = EventId::parse(text).map_err(|e| HttpError::BadLastEventId(e.to_string()))?;
    match session.stream_for(&id) {
        Ok(stream) => Ok((stream, Cursor::After(id.seq))),
        Err(UnknownStream::OtherSession) => Err(HttpError::BadLastEventId(format!(
            "`{text}` belongs to another session"
        ))),
        Err(UnknownStream::NeverIssued) => Err(HttpError::BadLastEventId(format!(
            "no stream {} was opened in this session",
            id.stream
        ))),
        Err(UnknownStream::Released) => Err(HttpError::Gone(format!(
            "stream {} has ended and its events were released",
            id.stream
        ))),
    }
}

/// Counts and logs a `Last-Event-ID` that cannot be resumed.
fn cursor_miss(session: &Session, e: HttpError) -> HttpError {
    crate::metrics::get().cursors_not_found.inc();
    tracing::warn!(session = %session.id, "{e}");
    e
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

fn handle_delete(gw: &Arc<Gateway>, uri: &Uri, headers: &HeaderMap) -> Result<Response, HttpError> {
    gw.guard.check(headers, uri)?;
    let principal = authorize(gw, headers, uri)?;
    let session = require_session(gw, headers, principal.as_ref())?;
    check_version(headers, &session)?;
    gw.sessions
        .end(&session.id)
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

fn require_session(
    gw: &Gateway,
    headers: &HeaderMap,
    principal: Option<&Principal>,
) -> Result<Arc<Session>, HttpError> {
    let id = session_header(headers)?
        .ok_or_else(|| HttpError::MissingSession(protocol::supported_list()))?;
    owned_session(gw, id, principal)
}

/// `MCP-Protocol-Version`, when sent, must be a supported version and the session's. The
/// transport's fallback version (2025-03-26, what a server assumes for a request without the
/// header) is accepted on any session: the official conformance suite sends it on sessions it
/// negotiated at 2025-11-25.
fn check_version(headers: &HeaderMap, session: &Session) -> Result<(), HttpError> {
    let Some(v) = headers.get(&VERSION_HEADER) else {
        return Ok(());
    };
    let v = v.to_str().map_err(|_| {
        HttpError::BadProtocolVersion("MCP-Protocol-Version is not valid text".into())
    })?;
    protocol::check_version_header(v, session.version).map_err(HttpError::BadProtocolVersion)
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, HttpError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(HttpError::PayloadTooLarge(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(HttpError::PayloadTooLarge(limit)),
        Err(e) if super::serve::BodyTimeout::find(&*e).is_some() => {
            Err(HttpError::BodyTimeout(e.to_string()))
        }
        Err(e) => Err(HttpError::BodyRead(e.to_string())),
    }
}

async fn initialize(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    parsed: RpcBody,
    principal: Option<&Principal>,
    conn: &Conn,
) -> Result<Response, HttpError> {
    let (id, params) = match parsed {
        RpcBody::Batch(_) => {
            return Err(HttpError::InvalidRequest(
                "initialize must not be part of a JSON-RPC batch".into(),
                None,
            ));
        }
        RpcBody::Single(Message::Request { id, params, .. }) => (id, params),
        RpcBody::Single(_) => {
            return Err(HttpError::InvalidRequest(
                "initialize is a request: it needs an id".into(),
                None,
            ));
        }
    };
    let hello = protocol::read_initialize(params.as_deref())
        .map_err(|e| HttpError::InvalidParams(e, id.clone()))?;
    if gw.sessions.len() >= gw.config.session.max_sessions {
        return Err(HttpError::TooManySessions);
    }
    let version = hello.version;
    let view = gw.registry.ready(gw.probe_wait()).await;
    let result = router::initialize_result(&view, version);
    let init = ClientInit {
        version,
        plugin_params: hello.plugin_params,
        client_params: params.unwrap_or_default(),
        owner: principal.map(|p| p.subject.clone()),
        client: checks::client_key(
            principal.map(|p| p.subject.as_str()),
            conn.peer,
            headers,
            &gw.config.trusted_proxies,
        ),
    };
    let session = gw
        .sessions
        .create(init, &gw.shutdown)
        .map_err(|e| match e {
            TooManySessions::Gateway => HttpError::TooManySessions,
            TooManySessions::Client(n) => HttpError::TooManySessionsForClient(n),
        })?;
    trace::record_session(&session.id);
    let body = jsonrpc::result_bytes(id.raw(), &result);
    let mut response = json_response(StatusCode::OK, body);
    response.headers_mut().insert(
        SESSION_HEADER,
        HeaderValue::from_str(&session.id).expect("session ids are visible ASCII"),
    );
    Ok(response)
}

async fn in_session(
    gw: &Gateway,
    session: Arc<Session>,
    parsed: RpcBody,
    principal: Option<&Principal>,
    trace: Option<&TraceContext>,
    conn: Conn,
) -> Result<Response, HttpError> {
    session.touch();
    let (messages, batch) = match parsed {
        RpcBody::Single(m) => (vec![m], false),
        RpcBody::Batch(v) => {
            if !protocol::allows_batches(session.version) {
                return Err(HttpError::InvalidRequest(
                    format!(
                        "JSON-RPC batches are not part of protocol version {} (only 2025-03-26); send one message per POST",
                        session.version
                    ),
                    None,
                ));
            }
            (v, true)
        }
    };
    // `notifications/initialized` alone does not make a session used.
    if messages
        .iter()
        .any(|m| m.method().is_none() || m.is_request())
    {
        session.mark_used();
    }
    if let Some(m) = messages.iter().find(|m| m.method() == Some("initialize")) {
        let id = match m {
            Message::Request { id, .. } => Some(id.clone()),
            _ => None,
        };
        let why = if batch {
            "initialize must not be part of a JSON-RPC batch"
        } else {
            "this session is already initialized; to start over, send initialize without Mcp-Session-Id"
        };
        return Err(HttpError::InvalidRequest(why.into(), id));
    }

    let mut requests = Vec::new();
    for m in messages {
        match m {
            Message::Response { id, outcome } => {
                if !session.client_response(&id, &outcome) && !batch {
                    return Err(HttpError::InvalidRequest(
                        format!("no request with id {id} is waiting for an answer"),
                        None,
                    ));
                }
            }
            Message::Notification { method, params } => {
                notification(&session, &method, params.as_deref())
            }
            Message::Request { id, method, params } => {
                let params = match trace {
                    Some(t) => t.inject(params),
                    None => params,
                };
                requests.push((id, method, params))
            }
        }
    }
    if requests.is_empty() {
        return Ok(StatusCode::ACCEPTED.into_response());
    }

    let view = visible_view(gw, &session.view(), principal, &requests)?;
    let planned: Vec<_> = requests
        .into_iter()
        .map(|(id, method, params)| {
            let plan = router::plan(&session, &view, &method, params.as_deref());
            (id, method, params, plan)
        })
        .collect();
    let sse = planned
        .iter()
        .any(|(.., plan)| plan.response_mode() == ResponseMode::Sse);
    trace::record_plugins(planned.iter().filter_map(|(.., p)| p.plugin()));
    let n = planned.len();
    let stream = session.new_post_stream(n, sse);
    // Attached before any request runs, so no answer can come before the connection.
    // A JSON answer is collected in full before it is written: nothing to cut.
    let attached = stream
        .attach(Cursor::Start, conn.cut.filter(|_| sse))
        .await
        .map_err(|e| HttpError::EventStore(e.to_string()))?;
    let guard = StreamGuard::new(session.connections.clone());
    // JSON mode answers every request in the body, so it needs the ids; SSE does not.
    let ids: Vec<Id> = if sse {
        Vec::new()
    } else {
        planned.iter().map(|(id, ..)| id.clone()).collect()
    };
    for (id, method, params, plan) in planned {
        // Its own task: a client that disconnects does not cancel the work. It logs in the
        // request's span.
        tokio::spawn(
            router::dispatch(
                session.clone(),
                id,
                method,
                params,
                plan,
                Sink::new(stream.clone()),
            )
            .instrument(tracing::Span::current()),
        );
    }
    if sse {
        let priming = Some(attached.cursor_id());
        let mut opening = opening(&session, priming, true);
        opening.proof = conn.proof;
        return Ok(stream::sse_response(attached, opening, session.closed.clone(), guard).await);
    }
    let mut responses = stream::collect_responses(attached, &session.closed).await;
    drop(guard);
    // Every request gets an answer in the body: one cancelled by the client, or cut off by the
    // session's or the gateway's end, gets an error saying so.
    if responses.len() < n {
        let answered: Vec<Id> = responses.iter().filter_map(|r| response_id(r)).collect();
        let why = if session.closed.is_cancelled() {
            "the session ended before the plugin answered"
        } else {
            "the request was cancelled"
        };
        for id in ids.iter().filter(|id| !answered.contains(id)) {
            responses.push(jsonrpc::error_bytes(
                Some(id),
                jsonrpc::code::SERVER_ERROR,
                why,
            ));
        }
    }
    Ok(match (batch, responses.as_slice()) {
        (false, [one]) => json_response(StatusCode::OK, one.clone()),
        (_, many) => {
            let mut body =
                Vec::with_capacity(many.iter().map(Bytes::len).sum::<usize>() + many.len() + 1);
            body.push(b'[');
            for (i, r) in many.iter().enumerate() {
                if i > 0 {
                    body.push(b',');
                }
                body.extend_from_slice(r);
            }
            body.push(b']');
            json_response(StatusCode::OK, Bytes::from(body))
        }
    })
}

/// The plugins this request's token may use: all of them, unless some plugin needs a scope
/// the token lacks. Such a plugin is left out of the view (its tools are not listed), and a
/// `tools/call` of one of its tools is refused with 403 and the scope to ask for (step-up).
fn visible_view(
    gw: &Gateway,
    view: &Arc<View>,
    principal: Option<&Principal>,
    requests: &[(Id, String, Option<Box<RawValue>>)],
) -> Result<Arc<View>, HttpError> {
    let Some(principal) = principal else {
        return Ok(view.clone());
    };
    let lacks = |p: &ViewPlugin| {
        p.entry
            .config
            .scope
            .as_ref()
            .is_some_and(|s| !principal.scopes.contains(s))
    };
    if !view.plugins.iter().any(lacks) {
        return Ok(view.clone());
    }
    for (_, method, params) in requests {
        if method == "tools/call"
            && let Some(p) = router::tool_plugin(view, params.as_deref())
            && lacks(p)
        {
            let mut needed: Vec<String> = gw.auth.required_scopes().to_vec();
            needed.extend(p.entry.config.scope.clone());
            let e = AuthError::InsufficientScope(needed);
            let c = gw.auth.challenge(&e);
            return Err(HttpError::Auth(e, c));
        }
    }
    Ok(Arc::new(view.without(lacks)))
}

fn response_id(response: &[u8]) -> Option<Id> {
    match jsonrpc::parse_message(response).ok()? {
        Message::Response { id, .. } => Some(id),
        _ => None,
    }
}

/// A client notification: cancellations and roots changes reach the plugins; the rest needs
/// nothing from the gateway.
fn notification(session: &Session, method: &str, params: Option<&RawValue>) {
    match method {
        "notifications/cancelled" => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase")]
            struct Cancelled {
                request_id: Box<RawValue>,
                reason: Option<Box<RawValue>>,
            }
            let Ok(c) = jsonrpc::params_as::<Cancelled>(params) else {
                tracing::debug!(session = %session.id, "notifications/cancelled without a requestId; ignored");
                return;
            };
            let Ok(id) = Id::from_raw(&c.request_id) else {
                return;
            };
            if !session.cancel(&id, c.reason.as_deref()) {
                tracing::debug!(session = %session.id, "cancellation of {id}, which is not in flight");
            }
        }
        "notifications/roots/list_changed" => {
            for conn in session.running() {
                conn.notify(method, params);
            }
        }
        _ => tracing::trace!(session = %session.id, "client notification {method}"),
    }
}

fn json_response(status: StatusCode, body: Bytes) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
