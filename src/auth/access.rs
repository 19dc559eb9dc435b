//! Who may use which plugin and which of its tools: a plugin's `scope` (the token must hold
//! it), its `allow_groups` / `allow_subjects` (the token's subject or one of its groups must
//! be named), and its `tool_access` rules (the same, for the tools whose names match). The
//! same answers serve both eras and every place a caller meets a plugin: lists, calls and
//! change notices. Without a caller (authorization off) a plugin with rules is nobody's:
//! the config refuses such rules then, and an admin API definition is closed rather than
//! open. Decisions only: the `http` edge turns them into refusals.

use super::Principal;
use crate::config::PluginConfig;

/// Whether the caller lacks the scope the plugin needs.
pub fn lacks_scope(config: &PluginConfig, principal: Option<&Principal>) -> bool {
    match principal {
        Some(p) => config.scope.as_ref().is_some_and(|s| !p.scopes.contains(s)),
        None => false,
    }
}

/// Whether the plugin's `allow_groups` / `allow_subjects` let the caller in.
pub fn admitted(config: &PluginConfig, principal: Option<&Principal>) -> bool {
    match principal {
        Some(p) => config.access.admits(&p.subject, &p.groups),
        None => !config.access.restricts(),
    }
}

/// Whether the caller may see and use the plugin: its scope and its rules.
pub fn may_use(config: &PluginConfig, principal: Option<&Principal>) -> bool {
    !lacks_scope(config, principal) && admitted(config, principal)
}

/// The tool name patterns of the plugin's `tool_access` rules that leave the caller out.
pub fn denied_tools(config: &PluginConfig, principal: Option<&Principal>) -> Vec<String> {
    match principal {
        Some(p) => config.tools_denied_to(&p.subject, &p.groups),
        None => config
            .tool_access
            .iter()
            .flat_map(|r| r.tools.iter().cloned())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ToolAccess;

    fn principal(subject: &str, groups: &[&str], scopes: &[&str]) -> Principal {
        Principal {
            subject: subject.into(),
            client_id: "c".into(),
            scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
            groups: groups.iter().map(|s| (*s).to_owned()).collect(),
            token: None,
        }
    }

    #[test]
    fn scopes_and_rules_both_hold() {
        let mut c = PluginConfig::new("p", "x", vec![]);
        let eng = principal("bob", &["eng"], &["mcp"]);
        let ops = principal("carol", &["ops"], &["mcp", "vault"]);
        assert!(may_use(&c, Some(&eng)) && may_use(&c, None));
        c.access.allow_groups = vec!["eng".into()];
        assert!(may_use(&c, Some(&eng)) && !may_use(&c, Some(&ops)));
        assert!(!may_use(&c, None), "no caller, no way in");
        c.scope = Some("vault".into());
        assert!(lacks_scope(&c, Some(&eng)) && !may_use(&c, Some(&eng)));
        c.access.allow_subjects = vec!["carol".into()];
        assert!(may_use(&c, Some(&ops)));
        c.tool_access = vec![ToolAccess {
            tools: vec!["rm*".into()],
            allow_groups: vec!["ops".into()],
            allow_subjects: vec![],
        }];
        assert_eq!(denied_tools(&c, Some(&eng)), ["rm*"]);
        assert!(denied_tools(&c, Some(&ops)).is_empty());
        assert_eq!(denied_tools(&c, None), ["rm*"]);
    }
}
