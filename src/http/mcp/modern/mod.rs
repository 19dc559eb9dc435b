//! A modern-era (2026-07-28) POST: no session, the version and the client's capabilities in
//! the request's `_meta`, the headers mirroring the body. Checked in this order: `_meta`
//! (-32602), the version header against `_meta` (-32020), the version served (-32022), the
//! other headers (-32020), the method (-32601); a `tools/call`'s `Mcp-Param-*` headers are
//! checked against its arguments once its tool is found (-32020). Then `server/discover` is
//! answered from the registry's view, and every other method goes to plugins through the
//! caller's hidden session ([`crate::session::SessionManager::for_caller`]), answered as one
//! JSON body or an SSE stream (no event ids, no priming: the modern era has no resumption; a
//! closed stream cancels the request; the response head waits for the first event, so an
//! answer that is -32021 goes with its 400). Every result gets `resultType`, the cacheable
//! ones caching hints.
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
use serde_json::value::RawValue;
use tracing::Instrument;

use super::step_up::visible_view;
use super::{Conn, json_response};
use crate::audit::Who;
use crate::auth::Principal;
use crate::config::ResponseMode;
use crate::http::Edge;
use crate::http::error::HttpError;
use crate::jsonrpc::{self, Body as RpcBody, Message};
use crate::protocol::modern::{self, MirroredHeaders, ModernError};
use crate::protocol::param_headers;
use crate::registry::View;
use crate::router;
use crate::session::Session;
use crate::stream::{self, Cursor, Opening, Sink, StreamGuard};

mod mrtr;

const VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");
const METHOD_HEADER: HeaderName = HeaderName::from_static("mcp-method");
const NAME_HEADER: HeaderName = HeaderName::from_static("mcp-name");

/// A mirrored header's one value. Sent twice, it is refused: an intermediary that reads the
/// other copy would route or authorize another request than the one served.
fn once<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
    shown: &str,
) -> Result<Option<&'h [u8]>, ModernError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(ModernError::HeaderMismatch(format!(
            "the {shown} header is sent more than once"
        )));
    }
    Ok(first.map(|v| v.as_bytes()))
}

pub(super) async fn modern(
    gw: &Edge,
    headers: &HeaderMap,
    parsed: RpcBody,
    declared: Option<Result<modern::RequestMeta, ModernError>>,
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
    // Read with the era, in the same pass; none when the params declared no version.
    let meta = declared
        .unwrap_or_else(|| Err(modern::undeclared(params.as_deref())))
        .map_err(refuse)?;
    let mirrored = MirroredHeaders {
        protocol_version: once(headers, &VERSION_HEADER, "MCP-Protocol-Version").map_err(refuse)?,
        method: once(headers, &METHOD_HEADER, "Mcp-Method").map_err(refuse)?,
        name: once(headers, &NAME_HEADER, "Mcp-Name").map_err(refuse)?,
    };
    modern::check_version_header(mirrored, &meta).map_err(refuse)?;
    if !modern::MODERN_VERSIONS.contains(&meta.declared.version.as_str()) {
        return Err(refuse(ModernError::UnsupportedVersion {
            requested: meta.declared.version.clone(),
        }));
    }
    modern::check_headers(mirrored, &method, &meta).map_err(refuse)?;
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
    // Who the caller is: the token's subject, else the client's address (its own hidden
    // session, plugin instances, caps, audit share and rate limits).
    let caller_key = crate::http::checks::client_key(
        principal.map(|p| p.subject.as_str()),
        conn.peer,
        headers,
        &gw.config.trusted_proxies,
    );
    let session = gw
        .sessions
        .for_caller(
            principal.map(|p| p.subject.as_str()),
            &caller_key,
            &gw.shutdown,
        )
        .map_err(|_| HttpError::TooManySessions(Some(id.clone())))?;
    session.touch();
    session.hold_token(principal);
    let requests = [(id, method, params)];
    let view = visible_view(gw, &session.view(), principal, &requests).inspect_err(|e| {
        let who = modern_who(principal, &meta, Some(&caller_key));
        let all = requests
            .iter()
            .map(|(_, m, p)| (m.as_str(), None, p.as_deref()));
        gw.audit.refused(who, all, e.status().as_u16());
    })?;
    let [(id, method, params)] = requests;
    if method == "server/discover" {
        let result = router::discover_result(&view, scope);
        return Ok(json_response(
            StatusCode::OK,
            jsonrpc::result_bytes(id.raw(), &result),
        ));
    }
    // It reaches plugins, or listens: the caller's session idles out on the idle timeout
    // from now on, not the unused one.
    session.mark_used();
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
    if method == "tools/call" {
        check_param_headers(
            &session,
            &view,
            headers,
            meta.name.as_deref(),
            params.as_deref(),
        )
        .await
        .map_err(refuse)?;
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
        declared: meta.declared.capabilities_raw.clone(),
        name: meta.name.clone(),
        task_hint: meta.task_hint,
    };
    let plan = router::plan_modern(&session, &view, &method, params.as_deref(), modern_part);
    // A modern plugin asks for input itself: its `InputRequiredResult` and `requestState`
    // pass through as they are, and the client's retry goes to it unchanged. The bridge is
    // for legacy plugins.
    let to_modern_plugin = plan
        .plugin()
        .and_then(|name| view.find(name))
        .is_some_and(|p| p.info.era == crate::backend::Era::Modern);
    // A retry's requestState is checked first (params the `_meta` reading found neither
    // `requestState` nor `inputResponses` in are no retry); one for a call on another
    // replica goes there.
    let retry = if to_modern_plugin || !meta.retry_members {
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
    // A retry resumes a call that was counted and recorded when it began.
    let caller: Option<&str> = retry.is_none().then_some(&caller_key);
    if let Some(caller) = caller
        && gw.limits.enabled()
    {
        super::limit::check(gw, caller, &id, &method, params.as_deref(), plan.plugin())
            .await
            .inspect_err(|e| {
                let this = (method.as_str(), plan.plugin(), params.as_deref());
                let who = modern_who(principal, &meta, Some(caller));
                gw.audit
                    .refused(who, std::iter::once(this), e.status().as_u16());
            })?;
    }
    // The call's room in the audit queue, before anything runs.
    let audit = match caller {
        Some(caller) => audit_ticket(
            gw,
            principal,
            &meta,
            caller,
            &method,
            &plan,
            params.as_deref(),
        )
        .map_err(|full| HttpError::AuditFull(full, Some(id.clone())))?,
        None => None,
    };
    let sse = plan.response_mode() == ResponseMode::Sse;
    let stream = session.new_post_stream(1, sse);
    let cache = modern::CACHEABLE
        .contains(&method.as_str())
        .then_some(scope);
    let bridged = mrtr::bridged(&method) && !to_modern_plugin;
    if !bridged {
        // A bridged request's own (`mrtr::start`).
        stream.rewrite_responses(Arc::new(move |bytes: Bytes| {
            Bytes::from(modern::modernize_response(&bytes, cache))
        }));
    }
    let mut attached = match stream
        .attach(Cursor::Start, conn.cut.clone().filter(|_| sse))
        .await
    {
        Ok(attached) => attached,
        Err(e) => {
            // Nothing ran: no record of a call that was never made.
            if let Some(ticket) = audit {
                ticket.withdraw();
            }
            return Err(HttpError::EventStore(e.to_string()));
        }
    };
    if sse && let Some(level) = &meta.declared.log_level {
        session.want_logs(&stream, level).await;
    }
    let guard = StreamGuard::new(session.connections.clone());
    let call: Call = if bridged {
        let request = (id.clone(), method, params);
        mrtr::start(
            gw,
            &session,
            retry,
            request,
            plan,
            &meta,
            principal,
            &stream,
            cache,
            audit,
            &caller_key,
        )?
    } else {
        Box::pin(router::dispatch(
            session.clone(),
            id.clone(),
            method,
            params,
            plan,
            Sink::new(stream.clone()),
            audit,
        ))
    };
    // The dispatch runs in this request's task, beside the reading of its answer: a task of
    // its own would cost a spawn and a wake-up per request.
    let mut call = Running(Some(call));
    if sse {
        // The head waits for the first event (a keep-alive's time at most): when that is the
        // answer, it goes as one JSON body, with the HTTP status the spec gives its error if
        // it has one (-32021: a bridged call that needs a capability the client did not
        // declare finds it out only then). The modern era has no resumption, so a stream
        // would carry nothing more. After anything else, the stream has begun with 200.
        let first = tokio::time::timeout(
            session.stream_settings.keep_alive,
            call.alongside(attached.peek()),
        )
        .await
        .ok()
        .flatten();
        if first.is_some() && stream.answered_alone() {
            let status = first.as_deref().map_or(StatusCode::OK, answer_status);
            let responses = call
                .alongside(stream::collect_responses(attached, &session.closed))
                .await;
            drop(guard);
            if let Some(answer) = responses.into_iter().next() {
                return Ok(json_response(status, answer));
            }
            call.abandon();
            return Err(HttpError::InvalidRequest(
                "the request ended without an answer".into(),
                Some(id),
            ));
        }
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
        // What is left of the dispatch goes on in a task of its own from here: the head
        // waits out its hold for the events the dispatch may still bring.
        drop(call);
        return Ok(stream::sse_response(attached, opening, session.closed.clone(), guard).await);
    }
    let responses = call
        .alongside(stream::collect_responses(attached, &session.closed))
        .await;
    drop(guard);
    match responses.into_iter().next() {
        Some(answer) => {
            let status = answer_status(&answer);
            Ok(json_response(status, answer))
        }
        None => {
            call.abandon();
            Err(HttpError::InvalidRequest(
                "the request ended without an answer".into(),
                Some(id),
            ))
        }
    }
}

/// A request's dispatch, run by the task that reads its answer ([`Running`]).
type Call = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// A dispatch run beside the reading of its answer, until it is done. What is left of it
/// when the request's task lets go of it (the answer is out, the stream goes on without
/// this task, or the client left) runs to its end in a task of its own, as a dispatch
/// always does: a plugin being started for it is not left half started.
struct Running(Option<Call>);

impl Running {
    /// What `work` gives, with the dispatch run beside it in this task meanwhile.
    /// Cancel-safe: dropped unfinished, the dispatch is left in place.
    async fn alongside<T>(&mut self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        if let Some(call) = &mut self.0 {
            tokio::select! {
                biased;
                () = call => {}
                out = &mut work => return out,
            }
            self.0 = None;
        }
        work.await
    }

    /// Drops what is left of the dispatch (its request ended without an answer).
    fn abandon(&mut self) {
        self.0 = None;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(call) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(call.instrument(tracing::Span::current()));
        }
    }
}

/// The HTTP status of an answer: 400 for an error the spec gives that status on HTTP
/// (-32021, a capability the client did not declare: 2026-07-28 basic, "Per-request protocol
/// fields"), else 200. Only an answer that names that code is read.
fn answer_status(answer: &[u8]) -> StatusCode {
    const MISSING: i64 = modern::code::MISSING_REQUIRED_CLIENT_CAPABILITY;
    const _: () = assert!(MISSING == -32021);
    static NAMED: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new("-32021"));
    if NAMED.find(answer).is_some() && modern::response_outcome(answer) == Some(Err(MISSING)) {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    }
}

/// Checks a `tools/call`'s `Mcp-Param-*` headers against its arguments, for the parameters
/// its tool mirrors in headers (`x-mcp-header`, learned from the plugin's list). A tool the
/// view does not have, or whose list cannot be read, is not checked: its call fails, or goes
/// on as an intermediary would let it.
async fn check_param_headers(
    session: &Session,
    view: &View,
    headers: &HeaderMap,
    name: Option<&str>,
    params: Option<&RawValue>,
) -> Result<(), ModernError> {
    let Some(name) = name else {
        return Ok(());
    };
    let Some(mapped) = router::tool_header_params(session, view, name).await else {
        return Ok(());
    };
    if mapped.is_empty() {
        return Ok(());
    }
    let sent: Vec<(&str, &[u8])> = headers
        .iter()
        .filter_map(|(name, value)| {
            let suffix = name.as_str().strip_prefix(param_headers::PREFIX)?;
            Some((suffix, value.as_bytes()))
        })
        .collect();
    #[derive(serde::Deserialize)]
    struct Call {
        arguments: Option<serde_json::Value>,
    }
    let arguments = params
        .and_then(|p| serde_json::from_str::<Call>(p.get()).ok())
        .and_then(|c| c.arguments);
    param_headers::check_param_headers(&mapped, &sent, arguments.as_ref())
}

/// A modern request's audit record in the making (no session; the client named by its
/// `_meta`), if its method is audited.
fn audit_ticket(
    gw: &Edge,
    principal: Option<&Principal>,
    meta: &crate::protocol::modern::RequestMeta,
    caller: &str,
    method: &str,
    plan: &router::Plan,
    params: Option<&RawValue>,
) -> Result<Option<crate::audit::Ticket>, crate::audit::Full> {
    // What the `_meta` reading found of the params, instead of reading them again.
    let target = meta.name.as_deref().or(meta.uri.as_deref());
    gw.audit.call_read(
        modern_who(principal, meta, Some(caller)),
        method,
        plan.plugin(),
        target,
        meta.arguments(params),
    )
}

/// Who a modern request is, for the audit log: no session; the client named by its `_meta`.
fn modern_who<'a>(
    principal: Option<&'a Principal>,
    meta: &'a crate::protocol::modern::RequestMeta,
    caller: Option<&'a str>,
) -> Who<'a> {
    Who {
        subject: principal.map(|p| p.subject.as_str()),
        session: None,
        client: meta.declared.client.as_deref(),
        caller,
    }
}
