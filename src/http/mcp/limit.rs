//! The rate limits ([`crate::limits`]) at `/mcp`: a counted request over a limit is refused
//! with 429, `Retry-After` and a JSON-RPC error naming the limit, before it is dispatched.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::http::Edge;
use crate::http::error::HttpError;
use crate::jsonrpc::{self, Id};
use crate::limits::{self, Call};

/// Counts one request of `caller` (a client key), or refuses it.
pub(super) async fn check(
    gw: &Edge,
    caller: &str,
    id: &Id,
    method: &str,
    params: Option<&RawValue>,
    plugin: Option<&str>,
) -> Result<(), HttpError> {
    if !gw.limits.enabled() || !limits::counts(method) {
        return Ok(());
    }
    #[derive(Deserialize)]
    struct Named {
        name: Option<String>,
    }
    let tool = if method == "tools/call" {
        jsonrpc::params_as::<Named>(params)
            .ok()
            .and_then(|n| n.name)
    } else {
        None
    };
    let call = Call {
        plugin,
        tool: tool.as_deref(),
    };
    gw.limits.admit(caller, call).await.map_err(|limited| {
        tracing::info!(limit = %limited.rule, "{method} refused: {limited}");
        HttpError::RateLimited(limited, Some(id.clone()))
    })
}
