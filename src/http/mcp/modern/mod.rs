//! A modern-era (2026-07-28) POST: no session, the version and the client's capabilities in
//! the request's `_meta`, the headers mirroring the body. Checked in the spec's order (the
//! version served, the headers, the method), then `server/discover` is answered from the
//! registry's view, and every other method goes to plugins through the caller's hidden
//! session ([`crate::session::SessionManager::for_caller`]), answered as one JSON body or an
//! SSE stream (no event ids, no priming: the modern era has no resumption; a closed stream
//! cancels the request). Every result gets `resultType`, the cacheable ones caching hints.
//! `tools/call`, `resources/read` and `prompts/get` go through the bridge of multi round-trip
//! requests ([`mrtr`]): a plugin's requests to the client come back as an
//! `InputRequiredResult`, and the retry resumes the call. The tasks extension's methods are
//! served when a plugin runs tasks, to requests that declare the extension (-32021 to the
//! others); whether a `tools/call` runs as a task is decided here, before it is planned
//! (`router::runs_as_task`).

mod listen;

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tracing::Instrument;

use super::step_up::visible_view;
use super::{Conn, json_response};
use crate::auth::Principal;
use crate::config::ResponseMode;
use crate::http::Edge;
use crate::http::error::HttpError;
use crate::jsonrpc::{self, Body as RpcBody, Message};
use crate::protocol::modern::{self, MirroredHeaders, ModernError};
use crate::router;
use crate::stream::{self, Cursor, Opening, Sink, StreamGuard};

mod mrtr;

const VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");
const METHOD_HEADER: HeaderName = HeaderName::from_static("mcp-method");
const NAME_HEADER: HeaderName = HeaderName::from_static("mcp-name");

pub(super) async fn modern(
    gw: &Edge,
    headers: &HeaderMap,
    parsed: RpcBody,
    principal: Option<&Principal>,
    conn: &Conn,
) -> Result<Response, HttpError> {
    let message = match parsed {
        RpcBody::Single(m) => m,
        RpcBody::Batch(_) => {
            return Err(HttpError::InvalidRequest(
                "a 2026-07-28 POST carries one request or notification, not a batch".into(),
                None,
            ));
        }
    };
    let (id, method, params) = match message {
        Message::Request { id, method, params } => (id, method, params),
        // Nothing a modern client notifies needs an answer here.
        Message::Notification { .. } => return Ok(StatusCode::ACCEPTED.into_response()),
        Message::Response { .. } => {
            return Err(HttpError::InvalidRequest(
                "a 2026-07-28 client sends no responses".into(),
                None,
            ));
        }
    };
    let refuse = |e: ModernError| HttpError::Modern(e, Some(id.clone()));
    let meta = modern::read_meta(params.as_deref()).map_err(refuse)?;
    if !modern::MODERN_VERSIONS.contains(&meta.version.as_str()) {
        return Err(refuse(ModernError::UnsupportedVersion {
            requested: meta.version,
        }));
    }
    let mirrored = MirroredHeaders {
        protocol_version: headers.get(&VERSION_HEADER).map(|v| v.as_bytes()),
        method: headers.get(&METHOD_HEADER).map(|v| v.as_bytes()),
        name: headers.get(&NAME_HEADER).map(|v| v.as_bytes()),
    };
    modern::check_headers(mirrored, &meta, &method, params.as_deref()).map_err(refuse)?;
    if !modern::METHODS.contains(&method.as_str()) {
        return Err(refuse(ModernError::MethodNotFound(method)));
    }
    // As at `initialize`: a gateway that just started answers once its plugins' probes did.
    gw.registry.ready(gw.probe_wait()).await;
    // What depends on who asks is private to the caller.
    let scope = if gw.auth.enabled() {
        "private"
    } else {
        "public"
    };
    let session = gw
        .sessions
        .for_caller(principal.map(|p| p.subject.as_str()), &gw.shutdown);
    session.touch();
    let requests = [(id, method, params)];
    let view = visible_view(gw, &session.view(), principal, &requests)?;
    let [(id, method, params)] = requests;
    if method == "server/discover" {
        let result = router::discover_result(&view, scope);
        return Ok(json_response(
            StatusCode::OK,
            jsonrpc::result_bytes(id.raw(), &result),
        ));
    }
    if method == "subscriptions/listen" {
        let tasks = meta.tasks();
        return listen::listen(gw, &session, &view, principal, id, params, tasks, conn).await;
    }
    let refuse = |e: ModernError| HttpError::Modern(e, Some(id.clone()));
    // The tasks extension: offered when a plugin runs tasks, to a request that declares it.
    if modern::TASK_METHODS.contains(&method.as_str()) {
        if !router::offers_tasks(&view) {
            return Err(refuse(ModernError::MethodNotFound(method)));
        }
        if !meta.tasks() {
            return Err(refuse(ModernError::tasks_extension_missing()));
        }
    }
    let as_task = if method == "tools/call" {
        router::runs_as_task(&session, &view, params.as_deref(), meta.tasks())
            .await
            .map_err(refuse)?
    } else {
        false
    };
    let modern_part = router::Modern {
        tasks: meta.tasks(),
        as_task,
        declared: meta.capabilities_raw.clone(),
    };
    let plan = router::plan_modern(&session, &view, &method, params.as_deref(), modern_part);
    // A modern plugin asks for input itself: its `InputRequiredResult` and `requestState`
    // pass through as they are, and the client's retry goes to it unchanged. The bridge is
    // for legacy plugins.
    let to_modern_plugin = plan
        .plugin()
        .and_then(|name| view.find(name))
        .is_some_and(|p| p.info.era == crate::backend::Era::Modern);
    // A retry's requestState is checked first; one for a call on another replica goes there.
    let retry = if to_modern_plugin {
        None
    } else {
        match mrtr::retry(
            gw,
            headers,
            principal,
            &id,
            &method,
            params.as_deref(),
            conn,
        )
        .await?
        {
            mrtr::Retry::Answered(answer) => return Ok(answer),
            mrtr::Retry::Here(resumed) => Some(resumed),
            mrtr::Retry::First => None,
        }
    };
    let sse = plan.response_mode() == ResponseMode::Sse;
    let stream = session.new_post_stream(1, sse);
    let cache = modern::CACHEABLE
        .contains(&method.as_str())
        .then_some(scope);
    stream.rewrite_responses(Arc::new(move |bytes: Bytes| {
        Bytes::from(modern::modernize_response(&bytes, cache))
    }));
    let attached = stream
        .attach(Cursor::Start, conn.cut.clone().filter(|_| sse))
        .await
        .map_err(|e| HttpError::EventStore(e.to_string()))?;
    if sse && let Some(level) = &meta.log_level {
        session.want_logs(&stream, level).await;
    }
    let guard = StreamGuard::new(session.connections.clone());
    let call = if mrtr::bridged(&method) && !to_modern_plugin {
        let request = (id.clone(), method, params);
        mrtr::start(
            gw, &session, retry, request, plan, &meta, principal, &stream, cache,
        )
        .await?
    } else {
        tokio::spawn(
            router::dispatch(
                session.clone(),
                id.clone(),
                method,
                params,
                plan,
                Sink::new(stream.clone()),
            )
            .instrument(tracing::Span::current()),
        )
    };
    if sse {
        let opening = Opening {
            priming: None,
            retry: None,
            ids: false,
            poll_after: None,
            keep_alive: session.stream_settings.keep_alive,
            hold: session.stream_settings.hold,
            drain: None,
            proof: None,
        };
        return Ok(stream::sse_response(attached, opening, session.closed.clone(), guard).await);
    }
    let responses = stream::collect_responses(attached, &session.closed).await;
    drop(guard);
    match responses.into_iter().next() {
        Some(answer) => Ok(json_response(StatusCode::OK, answer)),
        None => {
            call.abort();
            Err(HttpError::InvalidRequest(
                "the request ended without an answer".into(),
                Some(id),
            ))
        }
    }
}
