//! Every way the `/mcp` endpoint refuses a request, each with its HTTP status and JSON-RPC
//! error code. The body is always a JSON-RPC error saying what was wrong, with the request's
//! id when it could be read.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::auth::{AuthError, Challenge};
use crate::jsonrpc::{self, Id, ParseError, code};
use crate::protocol::modern::ModernError;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("Forbidden: Origin `{0}` is not allowed")]
    ForbiddenOrigin(String),
    #[error("Forbidden: Host `{0}` is not allowed")]
    ForbiddenHost(String),
    #[error("Not Acceptable: {0}")]
    NotAcceptable(&'static str),
    #[error("Unsupported Media Type: Content-Type must be application/json")]
    UnsupportedMediaType,
    #[error("Payload Too Large: the body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    #[error("Bad Request: the body could not be read: {0}")]
    BodyRead(String),
    #[error("Request Timeout: {0}")]
    BodyTimeout(String),
    #[error("{}", .0.message())]
    Parse(ParseError),
    #[error("Invalid request: {0}")]
    InvalidRequest(String, Option<Id>),
    #[error("Invalid params: {0}")]
    InvalidParams(String, Id),
    #[error(
        "Bad Request: no Mcp-Session-Id header. Open a session with initialize first (this endpoint serves protocol versions {0})"
    )]
    MissingSession(String),
    #[error(
        "Not Found: no session with this Mcp-Session-Id (it ended or never existed); initialize a new one"
    )]
    SessionNotFound,
    /// Not Found, to a request another replica forwarded for a session this one does not
    /// hold: marked so that the forwarder asks again who holds it.
    #[error(
        "Not Found: no session with this Mcp-Session-Id (it ended or never existed); initialize a new one"
    )]
    SessionNotHere,
    #[error("Bad Request: {0}")]
    BadProtocolVersion(String),
    #[error("Conflict: {0}")]
    Conflict(&'static str),
    #[error("Bad Request: Last-Event-ID cannot be resumed: {0}")]
    BadLastEventId(String),
    #[error("Gone: Last-Event-ID cannot be resumed: {0}. Re-send the request instead")]
    Gone(String),
    /// The store's own words stay in the logs: with a shared store they can name its address.
    #[error("Service Unavailable: the event store failed; retry later")]
    EventStore(String),
    #[error("Service Unavailable: the gateway holds its maximum number of sessions; retry later")]
    TooManySessions(Option<Id>),
    #[error(
        "Too Many Requests: this client holds {0} sessions, the most one client may; end one (DELETE) or retry later"
    )]
    TooManySessionsForClient(usize, Option<Id>),
    #[error(
        "Service Unavailable: the gateway holds its maximum number of subscriptions/listen streams; retry later"
    )]
    TooManyListeners(Option<Id>),
    #[error(
        "Too Many Requests: this caller holds {0} subscriptions/listen streams, the most one caller may; close one or retry later"
    )]
    TooManyListenersForCaller(usize, Option<Id>),
    #[error("{0}")]
    Auth(AuthError, Challenge),
    /// Cluster mode's shared state did not answer; the cause stays in the logs.
    #[error("Service Unavailable: the cluster's shared state cannot be reached; retry later")]
    Cluster(String),
    /// The replica that owns the session did not take the forwarded request.
    #[error(
        "Service Unavailable: the gateway replica serving this session cannot be reached; retry later"
    )]
    OwnerUnreachable(String),
    /// The replica that owns the session took the forwarded request but its answer broke
    /// off: it may have run, so no `Retry-After` invites sending it again.
    #[error("Bad Gateway: the gateway replica serving this session did not answer this request")]
    OwnerFailed(String),
    /// A modern-era (2026-07-28) request the spec says to refuse, with its own code and data.
    #[error("{0}")]
    Modern(ModernError, Option<Id>),
    /// Over a rate limit ([`crate::limits`]): never reached a plugin.
    #[error("Too Many Requests: {0}")]
    RateLimited(crate::limits::Limited, Option<Id>),
    /// The audit log has no room to record the call: refused before it ran.
    #[error("Service Unavailable: {0}")]
    AuditFull(crate::audit::Full, Option<Id>),
}

impl HttpError {
    pub fn status(&self) -> StatusCode {
        match self {
            HttpError::ForbiddenOrigin(_) | HttpError::ForbiddenHost(_) => StatusCode::FORBIDDEN,
            HttpError::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            HttpError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            HttpError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            HttpError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            HttpError::BodyRead(_)
            | HttpError::Parse(_)
            | HttpError::InvalidRequest(..)
            | HttpError::InvalidParams(..)
            | HttpError::MissingSession(_)
            | HttpError::BadLastEventId(_)
            | HttpError::BadProtocolVersion(_) => StatusCode::BAD_REQUEST,
            HttpError::Gone(_) => StatusCode::GONE,
            HttpError::EventStore(_) | HttpError::AuditFull(..) => StatusCode::SERVICE_UNAVAILABLE,
            HttpError::SessionNotFound | HttpError::SessionNotHere => StatusCode::NOT_FOUND,
            HttpError::Conflict(_) => StatusCode::CONFLICT,
            HttpError::TooManySessions(_) => StatusCode::SERVICE_UNAVAILABLE,
            HttpError::TooManySessionsForClient(..) => StatusCode::TOO_MANY_REQUESTS,
            HttpError::TooManyListeners(_) => StatusCode::SERVICE_UNAVAILABLE,
            HttpError::TooManyListenersForCaller(..) | HttpError::RateLimited(..) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            HttpError::Auth(_, c) => c.status,
            HttpError::Cluster(_) | HttpError::OwnerUnreachable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            HttpError::OwnerFailed(_) => StatusCode::BAD_GATEWAY,
            HttpError::Modern(ModernError::MethodNotFound(_), _) => StatusCode::NOT_FOUND,
            HttpError::Modern(..) => StatusCode::BAD_REQUEST,
        }
    }

    /// The JSON-RPC error code of the body. Refusals of the transport itself (headers, body,
    /// session limits, resumption) are the implementation-defined server error; each case is
    /// named so a new refusal must choose.
    pub fn code(&self) -> i64 {
        match self {
            HttpError::Parse(e) => e.code(),
            HttpError::InvalidRequest(..) => code::INVALID_REQUEST,
            HttpError::InvalidParams(..) => code::INVALID_PARAMS,
            HttpError::SessionNotFound | HttpError::SessionNotHere => code::SESSION_NOT_FOUND,
            HttpError::Modern(e, _) => e.code(),
            HttpError::ForbiddenOrigin(_)
            | HttpError::ForbiddenHost(_)
            | HttpError::NotAcceptable(_)
            | HttpError::UnsupportedMediaType
            | HttpError::PayloadTooLarge(_)
            | HttpError::BodyRead(_)
            | HttpError::BodyTimeout(_)
            | HttpError::MissingSession(_)
            | HttpError::BadProtocolVersion(_)
            | HttpError::Conflict(_)
            | HttpError::BadLastEventId(_)
            | HttpError::Gone(_)
            | HttpError::EventStore(_)
            | HttpError::TooManySessions(_)
            | HttpError::TooManySessionsForClient(..)
            | HttpError::TooManyListeners(_)
            | HttpError::TooManyListenersForCaller(..)
            | HttpError::RateLimited(..)
            | HttpError::Auth(..)
            | HttpError::Cluster(_)
            | HttpError::OwnerUnreachable(_)
            | HttpError::OwnerFailed(_)
            | HttpError::AuditFull(..) => code::SERVER_ERROR,
        }
    }

    /// The request's id, when the refusal came after it was read.
    fn id(&self) -> Option<&Id> {
        match self {
            HttpError::Parse(e) => e.id(),
            HttpError::InvalidRequest(_, id) => id.as_ref(),
            HttpError::InvalidParams(_, id) => Some(id),
            HttpError::Modern(_, id)
            | HttpError::RateLimited(_, id)
            | HttpError::TooManySessions(id)
            | HttpError::TooManySessionsForClient(_, id)
            | HttpError::TooManyListeners(id)
            | HttpError::TooManyListenersForCaller(_, id)
            | HttpError::AuditFull(_, id) => id.as_ref(),
            HttpError::ForbiddenOrigin(_)
            | HttpError::ForbiddenHost(_)
            | HttpError::NotAcceptable(_)
            | HttpError::UnsupportedMediaType
            | HttpError::PayloadTooLarge(_)
            | HttpError::BodyRead(_)
            | HttpError::BodyTimeout(_)
            | HttpError::MissingSession(_)
            | HttpError::SessionNotFound
            | HttpError::SessionNotHere
            | HttpError::BadProtocolVersion(_)
            | HttpError::Conflict(_)
            | HttpError::BadLastEventId(_)
            | HttpError::Gone(_)
            | HttpError::EventStore(_)
            | HttpError::Auth(..)
            | HttpError::Cluster(_)
            | HttpError::OwnerUnreachable(_)
            | HttpError::OwnerFailed(_) => None,
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            HttpError::EventStore(cause) => tracing::error!("the event store failed: {cause}"),
            HttpError::Cluster(cause)
            | HttpError::OwnerUnreachable(cause)
            | HttpError::OwnerFailed(cause) => {
                tracing::error!("cluster: {cause}")
            }
            _ => {}
        }
        if status.is_server_error() || status == StatusCode::FORBIDDEN {
            tracing::warn!(status = status.as_u16(), "{self}");
        } else {
            tracing::debug!(status = status.as_u16(), "{self}");
        }
        let body = match &self {
            HttpError::Modern(e, id) => {
                let mut error = serde_json::json!({ "code": e.code(), "message": e.to_string() });
                if let Some(data) = e.data() {
                    error["data"] = data;
                }
                let error = serde_json::value::RawValue::from_string(error.to_string())
                    .expect("valid JSON");
                let null =
                    serde_json::value::RawValue::from_string("null".into()).expect("valid JSON");
                jsonrpc::error_object_bytes(id.as_ref().map_or(&*null, Id::raw), &error)
            }
            _ => jsonrpc::error_bytes(self.id(), self.code(), &self.to_string()),
        };
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if matches!(
            self,
            HttpError::TooManySessions(_)
                | HttpError::TooManySessionsForClient(..)
                | HttpError::TooManyListeners(_)
                | HttpError::TooManyListenersForCaller(..)
        ) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        if matches!(
            self,
            HttpError::Cluster(_)
                | HttpError::OwnerUnreachable(_)
                | HttpError::EventStore(_)
                | HttpError::AuditFull(..)
                | HttpError::Auth(AuthError::Unavailable, _)
        ) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let HttpError::RateLimited(limited, _) = &self {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(limited.retry_after()),
            );
        }
        if matches!(self, HttpError::SessionNotHere) {
            headers.insert(
                crate::cluster::forward::NOT_HERE_HEADER,
                HeaderValue::from_static("1"),
            );
        }
        if let HttpError::Auth(_, c) = &self {
            headers.insert(header::WWW_AUTHENTICATE, c.www_authenticate.clone());
        }
        response
    }
}
