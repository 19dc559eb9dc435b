//! The config file: TOML in the gateway's shape or the clients' `mcpServers`/`servers` JSON,
//! then validated as `mcp-gateway check --config FILE` does (no flags).
//!
//! Invariants: a refused file is refused with a message, never a panic; every plugin of a
//! config that `check` accepts survives the trip through the form the admin API stores
//! (the JSON of its spec) unchanged and still valid, and the Host/Origin guard can be built
//! from the config.

#![no_main]

use std::sync::OnceLock;

use clap::Parser;
use libfuzzer_sys::fuzz_target;
use mcp_gateway::config::{Cli, Config, FileConfig, PluginSpec, validate_plugin};
use mcp_gateway::http::checks::Guard;

fn cli() -> &'static Cli {
    static CLI: OnceLock<Cli> = OnceLock::new();
    CLI.get_or_init(|| Cli::parse_from(["mcp-gateway", "check"]))
}

fuzz_target!(|data: &[u8]| {
    // `FileConfig::read` reads the file as UTF-8 text.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = match FileConfig::parse(text) {
        Ok(f) => f,
        Err(message) => {
            assert!(!message.is_empty());
            return;
        }
    };
    let config = match Config::merge(cli(), file) {
        Ok(c) => c,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    for p in &config.plugins {
        let stored = serde_json::to_string(&PluginSpec::from_config(p)).expect("serializable");
        let spec: PluginSpec = serde_json::from_str(&stored)
            .unwrap_or_else(|e| panic!("stored spec {stored} does not read back: {e}"));
        let back = spec.into_config(p.name.clone());
        assert_eq!(&back, p, "plugin {} changed in the store: {stored}", p.name);
        validate_plugin(&back, &config.separator, &config.credentials.names())
            .expect("still valid");
    }
    let _ = Guard::new(&config);
});
