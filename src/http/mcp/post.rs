//! A POST: its body read within bounds, its era decided, then either `initialize` (a new
//! session, [`super::initialize`]) or messages in a session: responses to the gateway's own
//! requests and notifications get 202; requests are planned by the router, dispatched each in
//! its own task, and answered in one JSON body or on an SSE stream that ends after the last
//! response. Batches only where the session's version has them.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::Instrument;

use super::initialize::initialize;
use super::modern::modern;
use super::step_up::visible_view;
use super::{
    Conn, Reached, authorize, check_version, json_response, opening, reach, session_header,
};
use crate::audit::{self, Who};
use crate::auth::Principal;
use crate::config::ResponseMode;
use crate::http::Edge;
use crate::http::checks;
use crate::http::error::HttpError;
use crate::http::trace::{self, TraceContext};
use crate::jsonrpc::{self, Body as RpcBody, Id, Message};
use crate::protocol;
use crate::protocol::era::{self, Era};
use crate::router;
use crate::session::Session;
use crate::stream::{self, Cursor, Sink, StreamGuard};

pub(super) async fn handle_post(
    gw: &Edge,
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
    let principal = authorize(gw, headers, uri).await?;
    checks::accepts_post(headers)?;
    checks::json_content(headers)?;
    let parsed = jsonrpc::parse_body(&bytes).map_err(HttpError::Parse)?;
    let session_id = session_header(headers)?;
    let version_header = headers.get(&super::VERSION_HEADER).map(|v| v.as_bytes());
    match era::classify(session_id, version_header, &parsed) {
        Era::Initialize => initialize(gw, headers, parsed, principal.as_ref(), &conn).await,
        Era::Modern(meta) => modern(gw, headers, parsed, meta, principal.as_ref(), &conn).await,
        Era::Sessionless => Err(HttpError::MissingSession(protocol::supported_list())),
        Era::Session(id) => {
            let request = (&conn, headers, Method::POST, bytes);
            let session = match reach(gw, id, principal.as_ref(), request).await? {
                Reached::Here(session) => session,
                Reached::Answered(answer) => return Ok(answer),
            };
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
        Err(e) if crate::http::serve::BodyTimeout::find(&*e).is_some() => {
            Err(HttpError::BodyTimeout(e.to_string()))
        }
        Err(e) => Err(HttpError::BodyRead(e.to_string())),
    }
}

async fn in_session(
    gw: &Edge,
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

    let who = Who {
        subject: principal.map(|p| p.subject.as_str()),
        session: Some(&session.id),
        client: session.client_label.as_deref(),
        caller: Some(&session.client),
    };
    let view = visible_view(gw, &session.view(), principal, &requests).inspect_err(|e| {
        let all = requests
            .iter()
            .map(|(_, m, p)| (m.as_str(), None, p.as_deref()));
        gw.audit.refused(who, all, e.status().as_u16());
    })?;
    let planned: Vec<_> = requests
        .into_iter()
        .map(|(id, method, params)| {
            let plan = router::plan(&session, &view, &method, params.as_deref());
            (id, method, params, plan)
        })
        .collect();
    // Over a rate limit: refused before anything runs (a batch as a whole).
    for (id, method, params, plan) in &planned {
        super::limit::check(
            gw,
            &session.client,
            id,
            method,
            params.as_deref(),
            plan.plugin(),
        )
        .await
        .inspect_err(|e| {
            let all = planned
                .iter()
                .map(|(_, m, p, plan)| (m.as_str(), plan.plugin(), p.as_deref()));
            gw.audit.refused(who, all, e.status().as_u16());
        })?;
    }
    // Each call's room in the audit queue, before anything runs: none for one of them, and
    // none of them runs (unrecorded is worse than refused).
    let mut tickets = Vec::with_capacity(planned.len());
    for (id, method, params, plan) in &planned {
        match gw.audit.call(who, method, plan.plugin(), params.as_deref()) {
            Ok(ticket) => tickets.push(ticket),
            Err(full) => {
                tickets
                    .into_iter()
                    .flatten()
                    .for_each(audit::Ticket::withdraw);
                return Err(HttpError::AuditFull(full, Some(id.clone())));
            }
        }
    }
    let sse = planned
        .iter()
        .any(|(.., plan)| plan.response_mode() == ResponseMode::Sse);
    trace::record_plugins(planned.iter().filter_map(|(.., p)| p.plugin()));
    let n = planned.len();
    let stream = session.new_post_stream(n, sse);
    if sse {
        let ids: Vec<&RawValue> = planned.iter().map(|(id, ..)| id.raw()).collect();
        session.owes(&stream, &ids);
    }
    // Attached before any request runs, so no answer can come before the connection.
    // A JSON answer is collected in full before it is written: nothing to cut.
    let attached = match stream.attach(Cursor::Start, conn.cut.filter(|_| sse)).await {
        Ok(attached) => attached,
        Err(e) => {
            // Nothing ran: no record of calls that were never made.
            tickets
                .into_iter()
                .flatten()
                .for_each(audit::Ticket::withdraw);
            return Err(HttpError::EventStore(e.to_string()));
        }
    };
    let guard = StreamGuard::new(session.connections.clone());
    // JSON mode answers every request in the body, so it needs the ids; SSE does not.
    let ids: Vec<Id> = if sse {
        Vec::new()
    } else {
        planned.iter().map(|(id, ..)| id.clone()).collect()
    };
    for ((id, method, params, plan), audit) in planned.into_iter().zip(tickets) {
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
                audit,
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
