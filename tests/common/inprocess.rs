//! The gateway served inside the test's own process: the flags become a `Config` as the binary
//! makes it, `Server::bind` takes `127.0.0.1:0` for both listeners, and `serve` runs as a task
//! until the test stops it. A status-code check then costs no process start.
//!
//! What it must never be used for: anything that reads `/metrics` counts (the counters are
//! global to a process, shared by every gateway in it), logs (nothing is captured), signals,
//! exit codes, the process tree, or the command line. Those stay on the child-process harness
//! (`process`), and never in the same test binary as this one: the gateway makes the test
//! process the subreaper of plugin processes, reaps whichever child of it exits (under a
//! `Command::output` waiting for it), and when it stops kills every child it did not start
//! itself, child-process gateways included.

use clap::Parser;
use mcp_gateway::config::{Cli, Config};
use mcp_gateway::gateway::{Reloader, StartError};
use mcp_gateway::server::Server;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::admin::admin_get;
use super::{Client, Endpoints, FIXTURE, claim_harness};

/// A gateway serving in this process. Call [`InProcess::stop`] at the end of a test to wait
/// for its plugins to stop; dropping it only tells it to stop.
pub struct InProcess {
    /// The MCP endpoint, `http://ADDR/mcp`.
    pub url: String,
    /// The public listener's address.
    pub addr: String,
    /// The admin listener's address (health, readiness, metrics; the admin API with
    /// `--admin-token`). Always known here; an `Option` as in the process harness, so tests
    /// read it the same way.
    pub admin: Option<String>,
    /// Resolves the shutdown future `serve` was given.
    shutdown: Option<oneshot::Sender<()>>,
    /// The `serve` task: it ends once every plugin is stopped.
    served: Option<JoinHandle<Result<(), StartError>>>,
    /// Holds the gateway's database unless the test gave its own.
    _db_dir: tempfile::TempDir,
}

impl Endpoints for InProcess {
    fn public_addr(&self) -> &str {
        &self.addr
    }

    fn admin_addr(&self) -> Option<&str> {
        self.admin.as_deref()
    }
}

impl InProcess {
    /// Serves with the binary's flags `args` (before any `--`), both listeners on free ports
    /// and a database of its own unless `args` name them. `/admin/reload` re-reads the same
    /// flags, as the binary's does.
    pub async fn start(args: &[&str]) -> InProcess {
        claim_harness("in-process");
        if std::env::var_os("GATEWAY_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter("info,mcp_gateway=debug")
                .with_test_writer()
                .try_init();
        }
        let db_dir = tempfile::tempdir().unwrap();
        let database_url = format!("sqlite://{}/gw.db?mode=rwc", db_dir.path().display());
        let mut argv = vec!["mcp-gateway".to_owned()];
        if !args.contains(&"--listen") {
            argv.extend(["--listen".into(), "127.0.0.1:0".into()]);
        }
        if !args.contains(&"--database-url") {
            argv.extend(["--database-url".into(), database_url]);
        }
        if !args.contains(&"--admin-listen") {
            argv.extend(["--admin-listen".into(), "127.0.0.1:0".into()]);
        }
        argv.extend(args.iter().map(|a| a.to_string()));
        let cli = |argv: &[String]| {
            Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("flags {argv:?}: {e}"))
        };
        let config = Config::load(&cli(&argv)).unwrap_or_else(|e| panic!("config: {e}"));
        let reload_cli = cli(&argv);
        let reloader: Reloader = Box::new(move || Config::load(&reload_cli));
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .expect("the public listener");
        let server = Server::bind(listener, config, Some(reloader))
            .await
            .unwrap_or_else(|e| panic!("the gateway did not start: {e}"));
        let addr = server.public_addr().to_string();
        let admin = server.admin_addr().to_string();
        let (shutdown, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(server.serve(async move {
            // A dropped sender stops it too.
            let _ = stopped.await;
        }));
        InProcess {
            url: format!("http://{addr}/mcp"),
            addr,
            admin: Some(admin),
            shutdown: Some(shutdown),
            served: Some(served),
            _db_dir: db_dir,
        }
    }

    /// Quick mode in front of the fixture server (with extra fixture flags).
    pub async fn fixture(extra_gateway_args: &[&str], fixture_args: &[&str]) -> InProcess {
        let mut args: Vec<&str> = extra_gateway_args.to_vec();
        args.push("--");
        args.push(FIXTURE);
        args.extend_from_slice(fixture_args);
        InProcess::start(&args).await
    }

    /// Quick mode in front of another stdio server (`command` with `args`).
    pub async fn fixture_with(command: &str, args: &[&str]) -> InProcess {
        let mut all = vec!["--", command];
        all.extend_from_slice(args);
        InProcess::start(&all).await
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url)
    }

    /// GET on the admin listener: status and body.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        admin_get(self, path).await
    }

    /// Stops the gateway as SIGTERM stops the binary (drain, end sessions, stop plugins) and
    /// waits until it has, asserting it stopped cleanly.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let served = self.served.take().expect("serving");
        let result = tokio::time::timeout(std::time::Duration::from_secs(60), served)
            .await
            .expect("the gateway stopped within 60 s")
            .expect("the serve task did not panic");
        if let Err(e) = result {
            panic!("the gateway stopped with an error: {e}");
        }
    }
}

impl Drop for InProcess {
    /// Tells the gateway to stop; the test's runtime ends its task (and each plugin's process
    /// group goes with its handle) if the test does not wait for it.
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}
