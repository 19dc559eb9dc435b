//! The Bearer challenge of an MCP server's refusal (`WWW-Authenticate`, RFC 6750 §3, as the
//! MCP authorization spec has servers send it): where its protected resource metadata is,
//! the scope it wants, and why it refused (`invalid_token`, `insufficient_scope`). Read by
//! the gateway as a client of remote MCP servers, from its discovery and from the remote
//! transport's refused requests.

/// The Bearer challenge among a response's `WWW-Authenticate` values.
pub fn bearer<'a>(mut values: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    values.find(|v| {
        let v = v.trim_start();
        v.len() >= 6 && v.is_char_boundary(6) && v[..6].eq_ignore_ascii_case("bearer")
    })
}

/// A parameter of a Bearer challenge (`name="value"` or `name=token`).
pub fn bearer_param(challenge: &str, name: &str) -> Option<String> {
    let mut rest = challenge.trim_start();
    rest = rest.get(6..)?;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if rest.is_empty() {
            return None;
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim();
        rest = &rest[eq + 1..];
        let value = if let Some(quoted) = rest.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            v.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => v.push(c),
                }
            }
            rest = &quoted[end.min(quoted.len())..];
            v
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            let v = rest[..end].trim().to_owned();
            rest = &rest[end..];
            v
        };
        if key.eq_ignore_ascii_case(name) {
            return Some(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenge_parameters() {
        let c = r#"Bearer error="invalid_token", error_description="Missing \"x\"", scope="mcp:basic mcp:read", resource_metadata="http://h/.well-known/oauth-protected-resource/mcp""#;
        assert_eq!(
            bearer_param(c, "scope").as_deref(),
            Some("mcp:basic mcp:read")
        );
        assert_eq!(
            bearer_param(c, "resource_metadata").as_deref(),
            Some("http://h/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(
            bearer_param(c, "error_description").as_deref(),
            Some("Missing \"x\"")
        );
        assert_eq!(
            bearer_param("Bearer realm=x, scope=a", "scope").as_deref(),
            Some("a")
        );
        assert_eq!(bearer_param("Bearer", "scope"), None);
        assert_eq!(
            bearer_param("Bearer scope=\"unterminated", "scope").as_deref(),
            Some("unterminated")
        );
    }

    #[test]
    fn the_bearer_challenge_is_found_among_others() {
        let values = [
            "Basic realm=x",
            "Bearer error=\"insufficient_scope\", scope=\"a b\"",
        ];
        let b = bearer(values.into_iter()).unwrap();
        assert_eq!(
            bearer_param(b, "error").as_deref(),
            Some("insufficient_scope")
        );
        assert_eq!(bearer(["Basic realm=x", "Bé"].into_iter()), None);
    }
}
