//! Which plugin answered which resource URI for this session, learned from the plugins'
//! `resources/list` and `resources/templates/list` results (the router fills it while merging
//! lists and reads it to route `resources/read` and subscriptions). It is cleared when the
//! plugins' resources change. URI templates are matched loosely (RFC 6570: each expression
//! stands for any non-empty text).
//!
//! It only remembers; it never lists anything itself.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Which plugin serves which resource URI, as learned from list results.
#[derive(Debug, Default)]
pub struct ResourceRoutes {
    /// URI to plugin name.
    exact: HashMap<String, String>,
    /// URI template and plugin name.
    templates: Vec<(String, String)>,
    /// When every plugin's lists were last read in full for an unknown URI: at most once per
    /// the router's interval, so unknown URIs cannot make the gateway list everything each
    /// time.
    learned_at: Option<Instant>,
}

impl ResourceRoutes {
    pub fn find(&self, uri: &str) -> Option<&str> {
        self.exact.get(uri).map(String::as_str).or_else(|| {
            self.templates
                .iter()
                .find(|(t, _)| template_matches(t, uri))
                .map(|(_, plugin)| plugin.as_str())
        })
    }

    pub fn clear(&mut self) {
        self.exact.clear();
        self.templates.clear();
        self.learned_at = None;
    }

    /// `plugin` listed `uri`.
    pub fn learn_uri(&mut self, plugin: &str, uri: &str) {
        self.exact.insert(uri.to_owned(), plugin.to_owned());
    }

    /// `plugin` listed the URI template `template`.
    pub fn learn_template(&mut self, plugin: &str, template: &str) {
        if !self
            .templates
            .iter()
            .any(|(x, p)| x == template && p == plugin)
        {
            self.templates
                .push((template.to_owned(), plugin.to_owned()));
        }
    }

    /// Claims a full listing of every plugin's resources for an unknown URI: false when one
    /// began less than `every` ago.
    pub fn claim_listing(&mut self, every: Duration) -> bool {
        if self.learned_at.is_some_and(|t| t.elapsed() < every) {
            return false;
        }
        self.learned_at = Some(Instant::now());
        true
    }
}

/// Whether `uri` is one of the URIs `template` describes.
pub fn template_matches(template: &str, uri: &str) -> bool {
    // Literal pieces must appear in order; each `{...}` expression takes the shortest
    // non-empty run up to the next literal (or the rest, for a trailing expression).
    let mut rest = uri;
    let mut t = template;
    loop {
        match t.find('{') {
            None => return rest == t,
            Some(open) => {
                let literal = &t[..open];
                let Some(after) = rest.strip_prefix(literal) else {
                    return false;
                };
                let Some(close) = t[open..].find('}') else {
                    return false;
                };
                t = &t[open + close + 1..];
                let next_literal = &t[..t.find('{').unwrap_or(t.len())];
                if next_literal.is_empty() {
                    if t.is_empty() {
                        return !after.is_empty();
                    }
                    // Two expressions in a row: give the first one character at least.
                    let mut chars = after.chars();
                    if chars.next().is_none() {
                        return false;
                    }
                    rest = chars.as_str();
                    continue;
                }
                // The expression takes at least one character, then runs to the literal.
                let Some(first) = after.chars().next() else {
                    return false;
                };
                let skip = first.len_utf8();
                match after[skip..].find(next_literal) {
                    Some(pos) => rest = &after[skip + pos..],
                    None => return false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        assert!(template_matches(
            "test://template/{id}/data",
            "test://template/123/data"
        ));
        assert!(!template_matches(
            "test://template/{id}/data",
            "test://template//data"
        ));
        assert!(!template_matches(
            "test://template/{id}/data",
            "test://other/123/data"
        ));
        assert!(template_matches("file:///{path}", "file:///a/b/c"));
        assert!(!template_matches("file:///{path}", "file:///"));
        assert!(template_matches("x://{a}{b}", "x://12"));
        assert!(template_matches("test://static", "test://static"));
        assert!(!template_matches("test://static", "test://static2"));
        assert!(!template_matches("test://{broken", "test://x"));
        assert!(template_matches("file:///{name}.txt", "file:///é.txt"));
        assert!(template_matches("file:///{name}.txt", "file:///ab.txt"));
        assert!(!template_matches("file:///{name}.txt", "file:///.txt"));
    }

    proptest::proptest! {
        #[test]
        fn matching_never_panics(t in "[a-z{}/:]{0,20}", u in "[a-z{}/:é]{0,20}") {
            let _ = template_matches(&t, &u);
        }
    }
}
