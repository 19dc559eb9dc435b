//! Step-up authorization and access by group: a token sees only the plugins it holds the
//! scopes for and whose `allow_groups` / `allow_subjects` let its subject in, and of those
//! only the tools no `tool_access` rule keeps from it. A `tools/call` of a tool it cannot
//! see is refused with 403 and the scope to ask for (step-up), the same refusal whether a
//! scope or a rule is missing. The decisions are `auth::access`'s.

use std::sync::Arc;

use serde_json::value::RawValue;

use crate::auth::{AuthError, Principal, access};
use crate::http::Edge;
use crate::http::error::HttpError;
use crate::jsonrpc::Id;
use crate::registry::{View, ViewPlugin};
use crate::router;

/// The plugins (and tools) this request's caller may use: all of them, unless some plugin
/// needs a scope the token lacks or has rules about who may use it or its tools. A plugin
/// the caller may not use is left out of the view (its tools are not listed), and so are
/// the tools denied to it; a `tools/call` of one of them is refused with 403 and the scope
/// to ask for (step-up).
pub(super) fn visible_view(
    gw: &Edge,
    view: &Arc<View>,
    principal: Option<&Principal>,
    requests: &[(Id, String, Option<Box<RawValue>>)],
) -> Result<Arc<View>, HttpError> {
    let concerned = |p: &ViewPlugin| {
        let c = &p.entry.config;
        c.restricts_callers() || access::lacks_scope(c, principal)
    };
    if !view.plugins.iter().any(concerned) {
        return Ok(view.clone());
    }
    for (_, method, params) in requests {
        if method != "tools/call" {
            continue;
        }
        let Some((p, tool)) = router::tool_target(view, params.as_deref()) else {
            continue;
        };
        let c = &p.entry.config;
        let refusal = if access::lacks_scope(c, principal) {
            Some(AuthError::InsufficientScope(needed(gw, p)))
        } else if !access::admitted(c, principal)
            || access::denied_tools(c, principal)
                .iter()
                .any(|pattern| crate::config::pattern_matches(pattern, &tool))
        {
            Some(AuthError::NotAllowed(needed(gw, p)))
        } else {
            None
        };
        if let Some(e) = refusal {
            let c = gw.auth.challenge(&e);
            return Err(HttpError::Auth(e, c));
        }
    }
    Ok(Arc::new(view.for_caller(|p| {
        let c = &p.entry.config;
        access::may_use(c, principal).then(|| Arc::from(access::denied_tools(c, principal)))
    })))
}

/// The scopes a call of `plugin`'s tools needs: those of `/mcp` and the plugin's own.
fn needed(gw: &Edge, plugin: &ViewPlugin) -> Vec<String> {
    let mut needed: Vec<String> = gw.auth.required_scopes().to_vec();
    needed.extend(plugin.entry.config.scope.clone());
    needed
}
