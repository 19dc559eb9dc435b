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

/// The public router: `/mcp`, and with authorization on, the OAuth metadata and (built-in
/// mode) the authorization server's endpoints, behind the same Host check.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let mcp = Router::new()
        .route("/mcp", post(mcp::post).get(mcp::get).delete(mcp::delete))
        .with_state(gateway.clone());
    let app = if gateway.auth.enabled() {
        let oauth = crate::auth::server::router(gateway.auth.clone()).layer(
            axum::middleware::from_fn_with_state(gateway.clone(), host_guard),
        );
        mcp.merge(oauth)
    } else {
        mcp
    };
    app.layer(tower_http::trace::TraceLayer::new_for_http())
}

/// The Host and Origin checks (DNS rebinding) for the OAuth endpoints.
async fn host_guard(
    axum::extract::State(gw): axum::extract::State<Arc<Gateway>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match gw.guard.check(request.headers(), request.uri()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}
