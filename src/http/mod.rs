//! The HTTP edge: the `/mcp` endpoint and the checks in front of it.
//!
//! `POST`, `GET` and `DELETE` on `/mcp` are the Streamable HTTP transport ([`mcp`]); every
//! request first passes the Host/Origin guard and the media-type checks ([`checks`]); every
//! refusal is an [`error::HttpError`]. Handlers decide status codes and stream shapes, and
//! hand JSON-RPC to the session and router layers.

pub mod checks;
pub mod error;
mod mcp;

use std::sync::Arc;

use axum::Router;
use axum::routing::post;

use crate::gateway::Gateway;

/// The public router.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/mcp", post(mcp::post).get(mcp::get).delete(mcp::delete))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(gateway)
}
