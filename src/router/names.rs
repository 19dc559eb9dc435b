//! Tool and prompt names across plugins: `<prefix><separator><name>` when names are
//! prefixed, the plugin's own name otherwise (resolving a public name back is the router's,
//! against the configured prefixes). Resource URI templates are matched in
//! [`crate::session::routes`], beside the routes they serve.

pub use crate::session::routes::template_matches;

/// The public name of a plugin's tool or prompt.
pub fn join(prefix: Option<&str>, separator: &str, local: &str) -> String {
    match prefix {
        Some(p) => format!("{p}{separator}{local}"),
        None => local.to_owned(),
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
}
