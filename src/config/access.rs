//! Who may reach a plugin and which of its tools: [`Access`] (`allow_groups`,
//! `allow_subjects`) and [`ToolAccess`] rules (`[[plugins.NAME.tool_access]]`), the tool name
//! patterns they hold, and the checks a plugin's rules pass. The edge applies them per token
//! (`auth::access`); nothing here knows of tokens.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::plugin::{PluginConfig, tool_name_char};
use super::{ConfigError, invalid};

/// Who may use something (a plugin, or tools of it): the subjects named, and the members of
/// the groups named (the groups a token carries). Empty: no one is left out.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Access {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_subjects: Vec<String>,
}

impl Access {
    /// Whether it names anyone (and so leaves out everyone else).
    pub fn restricts(&self) -> bool {
        !self.allow_groups.is_empty() || !self.allow_subjects.is_empty()
    }

    /// Whether the caller `subject`, a member of `groups`, is let in.
    pub fn admits(&self, subject: &str, groups: &BTreeSet<String>) -> bool {
        !self.restricts()
            || self.allow_subjects.iter().any(|s| s == subject)
            || self.allow_groups.iter().any(|g| groups.contains(g))
    }
}

/// A rule for some of a plugin's tools (`[[plugins.NAME.tool_access]]`): the tools whose own
/// names (before any prefix) match one of `tools` (`*` stands for any run of characters) are
/// for the subjects and groups named only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolAccess {
    pub tools: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_subjects: Vec<String>,
}

impl ToolAccess {
    pub fn covers(&self, tool: &str) -> bool {
        self.tools.iter().any(|p| pattern_matches(p, tool))
    }

    pub fn access(&self) -> Access {
        Access {
            allow_groups: self.allow_groups.clone(),
            allow_subjects: self.allow_subjects.clone(),
        }
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters (none too)
/// and everything else for itself.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole name.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The longest group or subject name an access rule may hold.
const MAX_PRINCIPAL_NAME: usize = 256;

/// Checks a plugin's access rules: names that can be written in a token, tool patterns made
/// of what a tool name may hold (and `*`), and no tool rule that names no one.
pub(super) fn validate_access(p: &PluginConfig) -> Result<(), ConfigError> {
    let key = |k: &str| format!("plugins.{}.{k}", p.name);
    let names_ok = |names: &[String]| {
        names.iter().all(|n| {
            !n.is_empty() && n.len() <= MAX_PRINCIPAL_NAME && !n.chars().any(char::is_control)
        })
    };
    let lists = [
        ("allow_groups", &p.access.allow_groups),
        ("allow_subjects", &p.access.allow_subjects),
    ];
    for (k, names) in lists {
        if !names_ok(names) {
            return Err(invalid(
                key(k),
                format!("names are 1 to {MAX_PRINCIPAL_NAME} characters, no control characters"),
            ));
        }
    }
    for (i, rule) in p.tool_access.iter().enumerate() {
        let key = |k: &str| key(&format!("tool_access[{i}].{k}"));
        if rule.tools.is_empty() {
            return Err(invalid(key("tools"), "name at least one tool or pattern"));
        }
        if let Some(bad) = rule
            .tools
            .iter()
            .find(|t| t.is_empty() || !t.chars().all(|c| c == '*' || tool_name_char(c)))
        {
            return Err(invalid(
                key("tools"),
                format!(
                    "`{}` is not a tool name pattern (ASCII letters, digits, '_', '-', '.', and '*' for any run of them)",
                    bad.escape_debug()
                ),
            ));
        }
        if rule.allow_groups.is_empty() && rule.allow_subjects.is_empty() {
            return Err(invalid(
                key("allow_groups"),
                "a tool rule names who may use the tools (allow_groups or allow_subjects); to hide tools from everyone use tools_deny",
            ));
        }
        if !names_ok(&rule.allow_groups) || !names_ok(&rule.allow_subjects) {
            return Err(invalid(
                key("allow_groups"),
                format!("names are 1 to {MAX_PRINCIPAL_NAME} characters, no control characters"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_patterns() {
        for (pattern, name, matches) in [
            ("echo", "echo", true),
            ("echo", "echo2", false),
            ("echo", "ech", false),
            ("*", "anything", true),
            ("*", "", true),
            ("delete_*", "delete_repo", true),
            ("delete_*", "delete_", true),
            ("delete_*", "undelete_repo", false),
            ("*_admin", "repo_admin", true),
            ("*_admin", "repo_admin2", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "a-b-b-c", true),
            ("a*b*c", "a-c-b", false),
            ("ab*ba", "aba", false),
            ("**", "x", true),
        ] {
            assert_eq!(
                pattern_matches(pattern, name),
                matches,
                "{pattern} ~ {name}"
            );
        }
    }
}
