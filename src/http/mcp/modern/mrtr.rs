//! Multi round-trip requests at the edge (2026-07-28): a modern client's `tools/call`,
//! `resources/read` or `prompts/get` runs through the bridge of its caller's session
//! ([`Session::bridge`]), so a legacy plugin's requests to the client come back to it as an
//! `InputRequiredResult`. A retry carrying `requestState` is checked before anything else:
//! sealed by this gateway, by the same caller, for the same request (method and params), not
//! expired. It then resumes its parked call here, or, in cluster mode, is sent on to the
//! replica that holds the call, which serves it as its own.
//!
//! A state that fails a check is refused with -32602 (Invalid params), HTTP 400, telling the
//! client to send the request again without it: a call that is lost (timed out, resumed
//! already, its replica gone) cannot be resumed, only started again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, Method};
use axum::response::Response;
use bytes::Bytes;
use serde_json::value::RawValue;

use super::super::Conn;
use super::Call;
use crate::auth::Principal;
use crate::http::Edge;
use crate::http::error::HttpError;
use crate::jsonrpc::{self, Id, code};
use crate::protocol::modern::{self, RequestMeta};
use crate::protocol::mrtr;
use crate::router::{self, Plan};
use crate::session::{Binding, Exchange, Resume, Seed, Session};
use crate::stream::{Sink, Stream};

/// Whether a method's requests go through the bridge.
pub(super) fn bridged(method: &str) -> bool {
    mrtr::BRIDGED_METHODS.contains(&method)
}

/// A checked retry, for the call it resumes on this replica.
pub(super) struct Resumed {
    call: u64,
    nonce: u64,
    caller: Option<String>,
    responses: HashMap<String, Box<RawValue>>,
}

/// What a request's `requestState` makes of it.
pub(super) enum Retry {
    /// None: a first request.
    First,
    /// A retry of a call parked here.
    Here(Resumed),
    /// A retry of a call parked on another replica, which answered it.
    Answered(Response),
}

/// Reads and checks a request's `requestState`, if it carries one; a retry of a call held by
/// another replica is forwarded to it (in cluster mode) and its answer returned.
pub(super) async fn retry(
    gw: &Edge,
    headers: &HeaderMap,
    principal: Option<&Principal>,
    id: &Id,
    method: &str,
    params: Option<&RawValue>,
    conn: &Conn,
) -> Result<Retry, HttpError> {
    if !bridged(method) {
        return Ok(Retry::First);
    }
    let refuse = |why: &str| {
        HttpError::InvalidParams(
            format!("{why}; send the request again without requestState"),
            id.clone(),
        )
    };
    let retry = mrtr::read_retry(params).map_err(|e| HttpError::InvalidParams(e, id.clone()))?;
    let Some(state) = retry.state else {
        return Ok(Retry::First);
    };
    let claims = gw
        .parked
        .key
        .open(&state)
        .map_err(|e| refuse(&e.to_string()))?;
    let caller = principal.map(|p| p.subject.as_str());
    if claims.caller.as_deref() != caller {
        tracing::warn!(
            "a requestState was presented by another caller than the one it was issued to"
        );
        return Err(refuse(&mrtr::StateError::Invalid.to_string()));
    }
    if claims.digest != mrtr::request_digest(method, params) {
        return Err(refuse(
            "requestState belongs to another request (a retry repeats the method and params of the request it retries)",
        ));
    }
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if claims.expires_ms <= now_ms {
        return Err(refuse("requestState has expired"));
    }
    if claims.fresh {
        // A round the gateway asked itself: nothing is parked, the request runs again.
        return Ok(Retry::First);
    }
    if *claims.replica == *gw.parked.replica {
        return Ok(Retry::Here(Resumed {
            call: claims.call,
            nonce: claims.nonce,
            caller: claims.caller,
            responses: retry.responses,
        }));
    }
    let lost = || {
        refuse(
            "the call requestState names is no longer held (the gateway replica that held it is gone)",
        )
    };
    // Forwarded once at most: a replica that is not the one named does not send it on again.
    let Some(cluster) = gw.cluster.as_ref().filter(|_| !conn.forwarded) else {
        return Err(lost());
    };
    let url = cluster
        .replica_url(&claims.replica)
        .await
        .map_err(|e| HttpError::Cluster(e.to_string()))?
        .ok_or_else(lost)?;
    let body = jsonrpc::request_bytes(Some(id.raw()), method, params);
    match cluster
        .forward(&claims.replica, &url, Method::POST, headers, body)
        .await
    {
        Ok(answer) => Ok(Retry::Answered(answer)),
        Err(e) if e.gone => {
            tracing::info!("{e}: the call a retry resumes is lost");
            Err(lost())
        }
        Err(e) => Err(HttpError::OwnerFailed(e.to_string())),
    }
}

/// Runs a bridged request whose answer goes to `stream` (attached already): a first request
/// is dispatched to its plugin under the client's id, seeded so that it becomes a bridged
/// call if the plugin asks the client for input; a retry resumes its parked call with the
/// client's answers. What is returned is the dispatch, for the request's own task to run
/// (a retry's hand-over is done by then).
#[allow(clippy::too_many_arguments)]
pub(super) fn start(
    gw: &Edge,
    session: &Arc<Session>,
    retry: Option<Resumed>,
    request: (Id, String, Option<Box<RawValue>>),
    plan: Plan,
    meta: &RequestMeta,
    principal: Option<&Principal>,
    stream: &Arc<Stream>,
    cache: Option<&'static str>,
    audit: Option<crate::audit::Ticket>,
    caller_key: &Arc<str>,
) -> Result<Call, HttpError> {
    let (id, method, params) = request;
    // An `InputRequiredResult` carries no caching hints, nor does what a retry gets.
    let cache = cache.filter(|_| retry.is_none());
    stream.rewrite_responses(Arc::new(move |bytes: Bytes| {
        Bytes::from(modern::modernize_response(&bytes, cache))
    }));
    let sink = Sink::new(stream.clone());
    if let Some(r) = retry {
        let exchange = Exchange {
            id: id.clone(),
            sink,
            capabilities: meta.declared.capabilities_raw.clone(),
            // A retry's answers are handed to what they answer.
            offered: HashMap::new(),
        };
        let wake = gw
            .parked
            .resume(r.call, r.caller.as_deref(), r.nonce)
            .map_err(|_| {
                HttpError::InvalidParams(
                    "requestState was used already, or the call it names is no longer waiting; send the request again without requestState".into(),
                    id.clone(),
                )
            })?;
        let resume = Resume {
            exchange,
            responses: r.responses,
        };
        if let Err(resume) = wake.send(resume) {
            // The call ended the moment its retry took it.
            let e = resume.exchange;
            e.sink.respond(jsonrpc::error_bytes(
                Some(&e.id),
                code::INVALID_PARAMS,
                "the call requestState names ended; send the request again without requestState",
            ));
        }
        return Ok(Box::pin(std::future::ready(())));
    }
    session.seed(
        stream.number(),
        Seed {
            parked: gw.parked.clone(),
            binding: Binding::new(
                principal.map(|p| p.subject.clone()),
                caller_key.clone(),
                method.clone(),
                params.clone(),
            ),
            capabilities: meta.declared.capabilities_raw.clone(),
            // A first request's answers wait for what they answer.
            offered: if meta.retry_members {
                mrtr::offered_responses(params.as_deref())
            } else {
                HashMap::new()
            },
        },
    );
    Ok(Box::pin(router::dispatch(
        session.clone(),
        id,
        method,
        params,
        plan,
        sink,
        audit,
    )))
}
