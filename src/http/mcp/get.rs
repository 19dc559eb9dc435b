//! GET: the session's stream for server-initiated messages, or, with `Last-Event-ID`, the
//! resumption of any of its streams: what the event store holds after the cursor, then live
//! events. A cursor that cannot be resumed is counted, logged and refused with what is wrong.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, Method, Uri};
use axum::response::Response;
use bytes::Bytes;

use super::{
    Conn, LAST_EVENT_ID, Reached, authorize, check_version, opening, reach, session_header,
};
use crate::http::Edge;
use crate::http::checks;
use crate::http::error::HttpError;
use crate::protocol;
use crate::session::{Session, UnknownStream};
use crate::stream::{self, AttachError, Cursor, EventId, ReplayError, Stream, StreamGuard};

/// Opens the session's GET stream, or (with `Last-Event-ID`) resumes any of its streams:
/// what the store holds after the cursor, then live events.
pub(super) async fn handle_get(
    gw: &Edge,
    uri: &Uri,
    headers: &HeaderMap,
    conn: Conn,
) -> Result<Response, HttpError> {
    gw.guard.check(headers, uri)?;
    let principal = authorize(gw, headers, uri).await?;
    checks::accepts_sse(headers)?;
    let id = session_header(headers)?
        .ok_or_else(|| HttpError::MissingSession(protocol::supported_list()))?;
    let request = (&conn, headers, Method::GET, Bytes::new());
    let session = match reach(gw, id, principal.as_ref(), request).await? {
        Reached::Here(session) => session,
        Reached::Answered(answer) => return Ok(answer),
    };
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
pub(super) fn resume_point(
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
pub(super) fn cursor_miss(session: &Session, e: HttpError) -> HttpError {
    crate::metrics::get().cursors_not_found.inc();
    tracing::warn!(session = %session.id, "{e}");
    e
}
