//! Tool and prompt names across plugins: `<prefix><separator><name>` when names are
//! prefixed, the plugin's own name otherwise (resolving a public name back is the router's,
//! against the configured prefixes). Resource URI templates are matched in
//! [`crate::session::routes`], beside the routes they serve.
//!
//! A prefixed name stays within what the spec allows a tool name (2025-11-25): the prefix and
//! separator are checked when a plugin is configured ([`crate::config::validate_plugin`]: the
//! allowed characters, at most [`MAX_PREFIX_LEN`] together), and a name the prefix makes longer
//! than [`MAX_TOOL_NAME_LEN`] is left out of lists, with a warning naming plugin and name.

use std::collections::HashSet;
use std::sync::Mutex;

pub use crate::config::{MAX_PREFIX_LEN, MAX_TOOL_NAME_LEN};
pub use crate::session::routes::template_matches;

/// Names warned about once each, at most this many (then no more warnings).
const MAX_WARNED: usize = 1024;

static WARNED: Mutex<Option<HashSet<(String, String)>>> = Mutex::new(None);

/// The public name of a plugin's tool or prompt.
pub fn join(prefix: Option<&str>, separator: &str, local: &str) -> String {
    match prefix {
        Some(p) => format!("{p}{separator}{local}"),
        None => local.to_owned(),
    }
}

/// Whether a public name is short enough to be offered (see the module's doc).
pub fn fits(public: &str) -> bool {
    public.len() <= MAX_TOOL_NAME_LEN || public.chars().count() <= MAX_TOOL_NAME_LEN
}

/// Logs, once per plugin and name, that a `kind` (tool, prompt) was left out of a list because
/// its prefixed name is too long.
pub fn warn_too_long(plugin: &str, kind: &str, public: &str) {
    let mut warned = WARNED.lock().expect("warned lock");
    let warned = warned.get_or_insert_with(HashSet::new);
    if warned.len() >= MAX_WARNED || !warned.insert((plugin.to_owned(), public.to_owned())) {
        return;
    }
    tracing::warn!(
        plugin,
        "{kind} `{public}` is left out: with its prefix the name is longer than {MAX_TOOL_NAME_LEN} characters (set a shorter prefix for the plugin)"
    );
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
    fn names_fit_in_128_characters() {
        assert!(fits(&"a".repeat(128)));
        assert!(!fits(&"a".repeat(129)));
        assert!(fits(&"é".repeat(128)), "characters, not bytes");
    }
}
