//! Tool and prompt names across plugins: `<prefix><separator><name>` when names are
//! prefixed, the plugin's own name otherwise (resolving a public name back is the router's,
//! against the configured prefixes); and resource URI templates (RFC 6570, matched
//! loosely: each expression stands for any non-empty text).

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
    fn join_names() {
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
