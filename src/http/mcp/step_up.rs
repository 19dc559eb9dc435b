//! Step-up authorization: with scopes on plugins, a token sees only the plugins it holds the
//! scopes for, and a `tools/call` of a tool it cannot see is refused with 403 and the scope to
//! ask for.

use std::sync::Arc;

use serde_json::value::RawValue;

use crate::auth::{AuthError, Principal};
use crate::http::Edge;
use crate::http::error::HttpError;
use crate::jsonrpc::Id;
use crate::registry::{View, ViewPlugin};
use crate::router;

/// The plugins this request's token may use: all of them, unless some plugin needs a scope
/// the token lacks. Such a plugin is left out of the view (its tools are not listed), and a
/// `tools/call` of one of its tools is refused with 403 and the scope to ask for (step-up).
pub(super) fn visible_view(
    gw: &Edge,
    view: &Arc<View>,
    principal: Option<&Principal>,
    requests: &[(Id, String, Option<Box<RawValue>>)],
) -> Result<Arc<View>, HttpError> {
    let Some(principal) = principal else {
        return Ok(view.clone());
    };
    let lacks = |p: &ViewPlugin| {
        p.entry
            .config
            .scope
            .as_ref()
            .is_some_and(|s| !principal.scopes.contains(s))
    };
    if !view.plugins.iter().any(lacks) {
        return Ok(view.clone());
    }
    for (_, method, params) in requests {
        if method == "tools/call"
            && let Some(p) = router::tool_plugin(view, params.as_deref())
            && lacks(p)
        {
            let mut needed: Vec<String> = gw.auth.required_scopes().to_vec();
            needed.extend(p.entry.config.scope.clone());
            let e = AuthError::InsufficientScope(needed);
            let c = gw.auth.challenge(&e);
            return Err(HttpError::Auth(e, c));
        }
    }
    Ok(Arc::new(view.without(lacks)))
}
