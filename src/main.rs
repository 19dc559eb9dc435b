//! The `mcp-gateway` binary: parse flags, set up logging, serve until SIGTERM or Ctrl-C.

use std::process::ExitCode;

use clap::Parser;
use mcp_gateway::config::{Cli, Command, Config, PluginEra};

// Request and event buffers are freed out of order (replay buffers linger): glibc's allocator
// spent over a tenth of the gateway's time consolidating chunks under load. jemalloc does not,
// and it keeps idle connections smaller than mimalloc did (bench/NOTES.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    mcp_gateway::logs::init(cli.log_format);

    if let Some(Command::HashPassword) = &cli.command {
        let mut password = String::new();
        if std::io::stdin().read_line(&mut password).is_err() || password.trim_end().is_empty() {
            eprintln!("mcp-gateway: give the password on standard input");
            return ExitCode::from(2);
        }
        println!(
            "{}",
            mcp_gateway::auth::server::hash_password(password.trim_end_matches(['\n', '\r']))
        );
        return ExitCode::SUCCESS;
    }
    if let Some(Command::Healthcheck) = &cli.command {
        return runtime().block_on(healthcheck(&cli));
    }
    let config = match Config::load(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcp-gateway: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Check) = &cli.command {
        println!(
            "config OK: {} plugin(s): {}",
            config.plugins.len(),
            config
                .plugins
                .iter()
                .map(|p| match p.era {
                    // A pinned era is said: the probe will not try the other one.
                    PluginEra::Auto => p.name.clone(),
                    PluginEra::Legacy => format!("{} (era legacy)", p.name),
                    PluginEra::Modern => format!("{} (era modern)", p.name),
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some(c) = &config.cluster {
            // What the deployment files set, read back (scripts/check-deploy asserts it); the
            // Redis password and the cluster secret are never printed.
            let advertise = c
                .advertise(config.listen)
                .unwrap_or_else(|e| format!("(unknown: {e})"));
            println!(
                "cluster mode: Redis {}, key prefix {}, advertised as {advertise}",
                mcp_gateway::config::redact_url(&c.redis_url),
                c.key_prefix,
            );
        }
        return ExitCode::SUCCESS;
    }

    // Before any thread exists: plugins are someone else's code, run as this user.
    hide_gateway();
    runtime().block_on(serve(cli, config))
}

/// The multi-threaded runtime `#[tokio::main]` would make.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

/// Makes the gateway non-dumpable (no process of the same user reads its
/// `/proc/PID/environ`, `mem`, `fd` or `maps`, or attaches to it), and takes its secrets out
/// of its environment: the config keeps reading them from memory, no child can inherit them,
/// and their text in the process's initial environment block is overwritten.
#[allow(unsafe_code)]
fn hide_gateway() {
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!("the gateway could not make itself non-dumpable: {e}");
    }
    let names = mcp_gateway::config::seal_environment();
    unsafe extern "C" {
        static mut environ: *mut *mut std::ffi::c_char;
    }
    // SAFETY: no other thread exists yet (the runtime is made after this), and each entry of
    // `environ` is a NUL-terminated `NAME=value` string of this process's own, writable.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let text = std::ffi::CStr::from_ptr(*entry).to_bytes();
            if let Some(n) = names.iter().find(|n| {
                text.len() > n.len() && text.starts_with(n.as_bytes()) && text[n.len()] == b'='
            }) {
                let value_len = text.len() - n.len() - 1;
                std::ptr::write_bytes((*entry).add(n.len() + 1), b'*', value_len);
            }
            entry = entry.add(1);
        }
        for n in &names {
            std::env::remove_var(n);
        }
    }
}

async fn serve(cli: Cli, config: Config) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mcp-gateway: cannot listen on {}: {e}", config.listen);
            return ExitCode::from(1);
        }
    };
    let reloader: mcp_gateway::gateway::Reloader = Box::new(move || Config::load(&cli));
    match mcp_gateway::run(listener, config, Some(reloader), shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp-gateway: {e}");
            ExitCode::from(1)
        }
    }
}

/// `GET /healthz` on the admin listener of a gateway configured like this one.
async fn healthcheck(cli: &Cli) -> ExitCode {
    let configured = cli
        .admin_listen
        .or_else(|| Config::load(cli).ok().map(|c| c.admin.listen))
        .unwrap_or_else(|| {
            mcp_gateway::config::DEFAULT_ADMIN_LISTEN
                .parse()
                .expect("valid default")
        });
    let mut addr = configured;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let url = format!("http://{addr}/healthz");
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(3))
        .build()
        .expect("an HTTP client");
    match client.get(&url).send().await {
        Ok(r) if r.status().is_success() => ExitCode::SUCCESS,
        Ok(r) => {
            eprintln!("mcp-gateway: {url} answered {}", r.status());
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("mcp-gateway: {url}: {e}");
            ExitCode::from(1)
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
