//! `initialize`: a new legacy-era session. The version is negotiated, the plugins' probes
//! are awaited (up to the longest start-up timeout), and the merged `initialize` result is
//! answered with the new `Mcp-Session-Id`. Session limits (the gateway's and each client's)
//! are checked here.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;

use super::{Conn, SESSION_HEADER, json_response};
use crate::auth::Principal;
use crate::http::Edge;
use crate::http::checks;
use crate::http::error::HttpError;
use crate::http::trace;
use crate::jsonrpc::{self, Body as RpcBody, Message};
use crate::protocol;
use crate::router;
use crate::session::{ClientInit, TooManySessions};

pub(super) async fn initialize(
    gw: &Edge,
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
        return Err(HttpError::TooManySessions(Some(id)));
    }
    let version = hello.version;
    let view = gw.registry.ready(gw.probe_wait()).await;
    let result = router::initialize_result(&view, version);
    let init = ClientInit {
        version,
        plugin_params: hello.plugin_params.into(),
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
            TooManySessions::Gateway => HttpError::TooManySessions(Some(id.clone())),
            TooManySessions::Client(n) => HttpError::TooManySessionsForClient(n, Some(id.clone())),
        })?;
    trace::record_session(&session.id);
    session.hold_token(principal);
    // In cluster mode no other replica could find a session without its record.
    gw.sessions
        .record(&session)
        .await
        .map_err(|e| HttpError::Cluster(e.to_string()))?;
    let body = jsonrpc::result_bytes(id.raw(), &result);
    let mut response = json_response(StatusCode::OK, body);
    response.headers_mut().insert(
        SESSION_HEADER,
        HeaderValue::from_str(&session.id).expect("session ids are visible ASCII"),
    );
    Ok(response)
}
