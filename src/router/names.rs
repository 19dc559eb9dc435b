//! Tool and prompt names across plugins: `<prefix><separator><name>` when names are
//! prefixed, the plugin's own name otherwise; and resource URI templates (RFC 6570, matched
//! loosely: each expression stands for any non-empty text).

/// Splits a public name into (prefix, local name).
pub fn split<'a>(name: &'a str, separator: &str) -> Option<(&'a str, &'a str)> {
    let (prefix, local) = name.split_once(separator)?;
    (!prefix.is_empty() && !local.is_empty()).then_some((prefix, local))
}

/// The public name of a plugin's tool or prompt.
pub fn join(prefix: Option<&str>, separator: &str, local: &str) -> String {
    match prefix {
        Some(p) => format!("{p}{separator}{local}"),
        None => local.to_owned(),
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
                match after.get(1..).and_then(|a| a.find(next_literal)) {
                    Some(pos) => rest = &after[pos + 1..],
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
    fn split_and_join() {
        assert_eq!(split("fs__read", "__"), Some(("fs", "read")));
        assert_eq!(split("fs__read__x", "__"), Some(("fs", "read__x")));
        assert_eq!(split("read", "__"), None);
        assert_eq!(split("__read", "__"), None);
        assert_eq!(join(Some("fs"), "__", "read"), "fs__read");
        assert_eq!(join(None, "__", "read"), "read");
    }

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
    }

    proptest::proptest! {
        #[test]
        fn matching_never_panics(t in "[a-z{}/:]{0,20}", u in "[a-z{}/:é]{0,20}") {
            let _ = template_matches(&t, &u);
        }
    }
}
