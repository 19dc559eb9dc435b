//! What the gateway knows of MCP itself: protocol versions, their negotiation, and the era a
//! request belongs to. It holds no state and does no I/O.

pub mod era;

/// Versions the gateway speaks to HTTP clients, newest first.
pub const CLIENT_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// Versions the gateway accepts from stdio plugins, newest first. 2024-11-05 predates
/// Streamable HTTP but is still what many stdio servers speak; over stdio it is compatible.
pub const PLUGIN_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The newest version the gateway speaks.
pub const LATEST: &str = CLIENT_VERSIONS[0];

/// The version the transport spec says to assume when a request carries no
/// `MCP-Protocol-Version` header and nothing else tells.
pub const DEFAULT_HTTP_VERSION: &str = "2025-03-26";

/// Lifecycle negotiation: echo the client's version when supported, else offer the latest.
pub fn negotiate(requested: &str) -> &'static str {
    CLIENT_VERSIONS
        .iter()
        .find(|v| **v == requested)
        .copied()
        .unwrap_or(LATEST)
}

/// Whether a session at this version may POST JSON-RPC batches (removed in 2025-06-18).
pub fn allows_batches(version: &str) -> bool {
    version == "2025-03-26"
}

/// Whether clients at this version get SSE priming events and `retry:` advice (SEP-1699,
/// 2025-11-25): older clients may fail on an event with empty data.
pub fn primes_streams(version: &str) -> bool {
    version >= "2025-11-25"
}

/// A comma-separated list of supported versions, for error messages.
pub fn supported_list() -> String {
    CLIENT_VERSIONS.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_echoes_or_offers_latest() {
        assert_eq!(negotiate("2025-06-18"), "2025-06-18");
        assert_eq!(negotiate("2025-03-26"), "2025-03-26");
        assert_eq!(negotiate("2024-11-05"), LATEST);
        assert_eq!(negotiate("2026-07-28"), LATEST);
        assert_eq!(negotiate("garbage"), LATEST);
    }
}
