//! Proof that a client read a response to its end, from the order of HTTP/1.1.
//!
//! A finished POST stream lingers (its events kept for a resume) because the gateway cannot
//! tell whether the last bytes it wrote reached the client before the connection broke. On an
//! HTTP/1.1 connection, a client sends its next request only after it has read the response
//! before it to its end, so that next request proves the streams the response ended were
//! delivered: they are released at once instead of after the linger time. A connection that
//! breaks sends no next request, and its last stream lingers as before. Under sustained load
//! on one connection this keeps a session's replay buffer at the streams still in flight,
//! where it would otherwise hold every stream of the last linger period.
//!
//! A proxy in front breaks it too: the proxy reads the response before its client does, and
//! its kept-alive connection carries other clients' requests. Requests that came through one
//! (`http::checks::via_proxy`) or from another replica carry no proof.
//!
//! Pipelining (a client sending requests before reading the responses before them) would break
//! this reasoning. No MCP client pipelines, and RFC 9112 tells clients not to pipeline after a
//! POST. HTTP/2 multiplexes and proves nothing: its requests carry no proof.

use std::sync::{Arc, Mutex};

use super::Stream;

/// One per HTTP/1 connection: the streams its responses carried to their end since the
/// connection's last request. It holds the streams themselves, not their session's hooks: a
/// hooks object is shared by all of a session's streams, and its count is one more memory
/// line for every request on every core to write.
#[derive(Default)]
pub struct ReadProof(Mutex<Vec<Arc<Stream>>>);

impl ReadProof {
    /// A response on this connection carried `stream` to its end.
    pub(super) fn ended(&self, stream: Arc<Stream>) {
        self.0.lock().expect("proof lock").push(stream);
    }

    /// A new request came on this connection: every response before it was read.
    pub fn next_request(&self) {
        let read = std::mem::take(&mut *self.0.lock().expect("proof lock"));
        for stream in read {
            stream.read();
        }
    }
}
