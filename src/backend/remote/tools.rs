//! The transport's own `tools/list`, for an instance that has seen none of the upstream's
//! lists before its first 2026-07-28 `tools/call` (its client's list came from another
//! instance): without it the call's `x-mcp-header` parameters could not be mirrored, nor a
//! tool breaking their rules refused. Asked once at a time (concurrent calls wait for it),
//! in a task of its own (a caller that gives up does not cut it short), page after page up
//! to [`MAX_PAGES`], and again at a later call when it failed, up to [`MAX_TRIES`] times.

use std::sync::Arc;

use bytes::Bytes;

use super::Inner;
use super::outgoing::{Kind, Outgoing};
use super::streamable::Failure;

/// The id of the transport's own `tools/list` (a string: the connection writes numbers), and
/// as it is written.
pub(super) const OWN_LIST_ID: &str = "mcp-gateway/tools-list";
pub(super) const OWN_LIST_ID_RAW: &str = "\"mcp-gateway/tools-list\"";

/// The most pages read, and the most times the listing is tried.
const MAX_PAGES: usize = 10;
pub(super) const MAX_TRIES: u32 = 3;

impl Inner {
    /// Lists the upstream's tools unless this instance has seen a list (see the module's doc).
    pub(super) async fn learn_tools(self: &Arc<Self>, version: &str) {
        let listed = || self.state.lock().expect("state lock").tool_headers.listed;
        if listed() {
            return;
        }
        let mut tries = self.listing.lock().await;
        if listed() || *tries >= MAX_TRIES {
            return;
        }
        *tries += 1;
        let (inner, version) = (self.clone(), version.to_owned());
        let _ = tokio::spawn(async move { inner.list_pages(&version).await }).await;
    }

    async fn list_pages(self: Arc<Self>, version: &str) {
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut params = serde_json::json!({"_meta": {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION")}}});
            if let Some(c) = cursor.take() {
                params["cursor"] = serde_json::Value::String(c);
            }
            let body = serde_json::json!({"jsonrpc": "2.0", "id": OWN_LIST_ID, "method": "tools/list", "params": params});
            let Some(out) = Outgoing::read(Bytes::from(body.to_string())) else {
                return;
            };
            let Kind::Request(r) = &out.kind else { return };
            if let Err(Failure::Network(why) | Failure::Answer(why) | Failure::Refused(why)) =
                self.clone().post_request(&out, r).await
            {
                self.note(format!("the gateway's own tools/list failed: {why}"));
                return;
            }
            cursor = self
                .state
                .lock()
                .expect("state lock")
                .tool_headers
                .next_cursor
                .take();
            if cursor.is_none() {
                return;
            }
        }
    }
}
