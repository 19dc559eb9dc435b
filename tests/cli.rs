//! The command line: `check`, config files in both shapes, flags and their environment
//! forms, `--help`, and quick mode combined with a config file.

mod common;

use common::{FIXTURE, Gateway};
use common::{run_cli as gateway, write_file as write};
use serde_json::json;

#[test]
fn check_accepts_good_configs_and_names_bad_keys() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        &dir,
        "good.toml",
        "listen = \"127.0.0.1:9000\"\n[plugins.a]\ncommand = \"x\"\n[session]\nmax_sessions = 5\n",
    );
    let (code, out, _) = gateway(&["check", "--config", &good], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("config OK") && out.contains('a'), "{out}");

    let typo = write(
        &dir,
        "typo.toml",
        "[plugins.a]\ncommand = \"x\"\nargz = [\"y\"]\n",
    );
    let (code, _, err) = gateway(&["check", "--config", &typo], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("argz"), "{err}");

    let nested = write(
        &dir,
        "nested.toml",
        "[plugins.a]\ncommand = \"x\"\n[session]\nidle_timeout = 5\n",
    );
    let (code, _, err) = gateway(&["check", "--config", &nested], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("idle_timeout"), "{err}");

    let bad_value = write(
        &dir,
        "value.toml",
        "[plugins.a]\ncommand = \"x\"\n[session]\nmax_sessions = 0\n",
    );
    let (code, _, err) = gateway(&["check", "--config", &bad_value], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("session.max_sessions"), "{err}");

    let empty = write(&dir, "empty.toml", "");
    let (code, _, err) = gateway(&["check", "--config", &empty], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("no plugins"), "{err}");

    let (code, _, err) = gateway(&["check", "--config", "/nonexistent.toml"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("/nonexistent.toml"), "{err}");
}

/// A `token_exchange` credential exchanges the caller's own token, which only mode
/// `external` receives: `check` refuses it in another mode and passes it there.
#[test]
fn check_refuses_token_exchange_without_external_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let credential = "[credentials.api]\nkind = \"token_exchange\"\nissuer = \"https://idp.example.com\"\n\
                      client_id = \"gw\"\naudience = \"https://api.example.com\"\n\
                      [plugins.a]\ncommand = \"x\"\nenv = { T = \"${credential:api}\" }\n";
    let key = [("MCP_GATEWAY_CREDENTIALS_KEY", "ab".repeat(32))];
    let env: Vec<(&str, &str)> = key.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let builtin = write(
        &dir,
        "builtin.toml",
        &format!(
            "[auth]\nmode = \"builtin\"\npublic_url = \"https://gw.example.com/mcp\"\n{credential}"
        ),
    );
    let (code, _, err) = gateway(&["check", "--config", &builtin], &env);
    assert_ne!(code, 0);
    assert!(
        err.contains("credentials.api.kind") && err.contains("external"),
        "{err}"
    );
    let external = write(
        &dir,
        "external.toml",
        &format!(
            "[auth]\nmode = \"external\"\npublic_url = \"https://gw.example.com/mcp\"\n\
             issuer = \"https://idp.example.com\"\n{credential}"
        ),
    );
    let (code, out, err) = gateway(&["check", "--config", &external], &env);
    assert_eq!(code, 0, "{out}{err}");
}

/// `check` names each plugin whose era is pinned, and refuses an era that is not one.
#[test]
fn check_names_pinned_eras() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        &dir,
        "eras.toml",
        "[plugins.a]\ncommand = \"x\"\n[plugins.b]\ncommand = \"y\"\nera = \"modern\"\n[plugins.c]\ncommand = \"z\"\nera = \"legacy\"\n",
    );
    let (code, out, err) = gateway(&["check", "--config", &good], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("a, b (era modern), c (era legacy)"), "{out}");
    let bad = write(
        &dir,
        "bad.toml",
        "[plugins.a]\ncommand = \"x\"\nera = \"2026\"\n",
    );
    let (code, _, err) = gateway(&["check", "--config", &bad], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("era") && err.contains("modern"), "{err}");
}

/// `check` says when a config turns cluster mode on (scripts/check-deploy relies on it to
/// see that the deployment files' settings are read) and never shows the secrets.
#[test]
fn check_reports_cluster_mode_without_its_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(&dir, "c.toml", "[plugins.a]\ncommand = \"x\"\n");
    let (code, out, _) = gateway(&["check", "--config", &config], &[]);
    assert_eq!(code, 0);
    assert!(!out.contains("cluster mode"), "{out}");

    let env = [
        (
            "MCP_GATEWAY_REDIS_URL",
            "redis://:hunter2hunter2@redis:6379/0",
        ),
        ("MCP_GATEWAY_CLUSTER_SECRET", "sixteen-chars-or-more"),
        ("MCP_GATEWAY_REDIS_KEY_PREFIX", "gw-a:"),
        ("MCP_GATEWAY_ADVERTISE_URL", "http://10.1.2.3:8080"),
    ];
    let (code, out, err) = gateway(&["check", "--config", &config], &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "cluster mode: Redis redis://:***@redis:6379/0, key prefix gw-a:, advertised as http://10.1.2.3:8080"
        ),
        "{out}"
    );
    assert!(
        !out.contains("hunter2") && !out.contains("sixteen-chars"),
        "{out}"
    );

    // Without the advertise URL, the listen address (not a wildcard) is the default.
    let (code, out, err) = gateway(
        &["check", "--config", &config],
        &[env[0], env[1], ("MCP_GATEWAY_LISTEN", "127.0.0.1:9001")],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("advertised as http://127.0.0.1:9001"), "{out}");

    // A short secret is refused, naming the key and not the value.
    let (code, _, err) = gateway(
        &["check", "--config", &config],
        &[env[0], ("MCP_GATEWAY_CLUSTER_SECRET", "short")],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("cluster_secret") && !err.contains("short"),
        "{err}"
    );
}

#[test]
fn check_reads_client_json_configs() {
    let dir = tempfile::tempdir().unwrap();
    let claude = write(
        &dir,
        "claude_desktop_config.json",
        r#"{"mcpServers": {"fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]}, "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}}}}"#,
    );
    let (code, out, err) = gateway(&["check", "--config", &claude], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2 plugin(s)"), "{out}");
    // A remote server is a remote plugin; its URL must be https (or loopback).
    let vscode = write(
        &dir,
        "mcp.json",
        r#"{"servers": {"remote": {"type": "http", "url": "https://mcp.example.com/mcp"}}}"#,
    );
    let (code, out, err) = gateway(&["check", "--config", &vscode], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 plugin(s)"), "{out}");
    let insecure = write(
        &dir,
        "insecure.json",
        r#"{"servers": {"remote": {"type": "http", "url": "http://mcp.example.com/mcp"}}}"#,
    );
    let (code, _, err) = gateway(&["check", "--config", &insecure], &[]);
    assert_ne!(code, 0);
    assert!(
        err.contains("plugins.remote.url") && err.contains("https"),
        "{err}"
    );
}

#[test]
fn flags_have_environment_forms_and_help_documents_them() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(&dir, "gw.toml", "[plugins.a]\ncommand = \"x\"\n");
    let (code, _, err) = gateway(
        &["check"],
        &[
            ("MCP_GATEWAY_CONFIG", &cfg),
            ("MCP_GATEWAY_MAX_SESSIONS", "0"),
        ],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("session.max_sessions"),
        "the env var was read: {err}"
    );
    let (code, _, err) = gateway(
        &["check", "--config", &cfg],
        &[("MCP_GATEWAY_LISTEN", "not-an-address")],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("MCP_GATEWAY_LISTEN") || err.contains("listen"),
        "{err}"
    );

    let (code, help, _) = gateway(&["--help"], &[]);
    assert_eq!(code, 0);
    for flag in [
        "--config",
        "--listen",
        "--allowed-origins",
        "--allowed-hosts",
        "--max-body-bytes",
        "--session-idle-timeout-secs",
        "--max-sessions",
        "--sse-keep-alive-secs",
        "--separator",
        "--plugin-name",
        "--response-mode",
        "--log-format",
        "MCP_GATEWAY_LISTEN",
        "MCP_GATEWAY_CONFIG",
        "127.0.0.1:8080",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn port_in_use_fails_fast() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, _, err) = gateway(&["--listen", &addr, "--", "x"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains(&addr), "{err}");
}

#[tokio::test]
async fn quick_mode_and_config_mode_combine() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        &dir,
        "gw.toml",
        &format!("[plugins.cfg]\ncommand = \"{FIXTURE}\"\nargs = [\"--name\", \"from-config\"]\n"),
    );
    let gw = Gateway::start(&[
        "--config",
        &cfg,
        "--plugin-name",
        "quick",
        "--",
        FIXTURE,
        "--name",
        "from-cli",
    ]);
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(c.tool_text(1, "cfg__echo", json!({"text": "a"})).await, "a");
    assert_eq!(
        c.tool_text(2, "quick__echo", json!({"text": "b"})).await,
        "b"
    );
}

#[tokio::test]
async fn json_logs_on_request() {
    let gw = Gateway::fixture(&["--log-format", "json"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    c.tool_text(1, "stderr", json!({"text": "json-log-probe"}))
        .await;
    gw.wait_log("json-log-probe").await;
    let line = gw
        .log()
        .lines()
        .find(|l| l.contains("json-log-probe"))
        .unwrap()
        .to_owned();
    let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
    assert_eq!(v["fields"]["plugin"], "stdio");
}

#[test]
fn binding_beyond_loopback_needs_allowed_hosts() {
    let (code, _, err) = gateway(&["--listen", "0.0.0.0:0", "--", "x"], &[]);
    assert_ne!(code, 0);
    assert!(
        err.contains("allowed_hosts") && err.contains("DNS rebinding"),
        "{err}"
    );
}

/// Every config example in README.md (each fenced `toml` block, and each `json` block that
/// holds `mcpServers` or `servers`) passes `mcp-gateway check` as written.
#[test]
fn regression_readme_config_examples_pass_check() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let ext = match line.trim() {
            "```toml" => "toml",
            "```json" => "json",
            _ => continue,
        };
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        let text = block.join("\n") + "\n";
        if ext == "json" && !text.contains("\"mcpServers\"") && !text.contains("\"servers\"") {
            continue;
        }
        checked += 1;
        let path = write(&dir, &format!("example-{checked}.{ext}"), &text);
        // The credentials' storage key, as a deployment gives it.
        let key = "00".repeat(32);
        let env = [
            ("MCP_GATEWAY_CREDENTIALS_KEY", key.as_str()),
            ("GITHUB_CLIENT_SECRET", "github-client-secret"),
            ("TICKETS_CLIENT_SECRET", "tickets-client-secret"),
            ("EXCHANGE_CLIENT_SECRET", "exchange-client-secret"),
        ];
        let (code, out, err) = gateway(&["check", "--config", &path], &env);
        assert_eq!(
            code, 0,
            "README example {checked} fails `check`:\n{text}\nstdout: {out}\nstderr: {err}"
        );
    }
    assert!(checked >= 2, "README's config examples were not found");
}

/// Quick mode with no admin API and no built-in authorization server keeps nothing across
/// restarts, so it writes no database file into its working directory; with the admin API on,
/// the default SQLite file is there, where the README says.
#[tokio::test]
async fn regression_quick_mode_writes_no_database_file() {
    let files = |d: &tempfile::TempDir| -> Vec<String> {
        std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let bare = tempfile::tempdir().unwrap();
    {
        let gw = Gateway::start_in(bare.path(), &["--", FIXTURE]);
        let mut c = gw.client();
        c.initialize().await;
        assert_eq!(c.tool_text(1, "echo", json!({"text": "a"})).await, "a");
        assert!(files(&bare).is_empty(), "{:?}", files(&bare));
    }
    assert!(files(&bare).is_empty(), "{:?}", files(&bare));

    let admin = tempfile::tempdir().unwrap();
    let gw = Gateway::start_in(
        admin.path(),
        &["--admin-token", "t-admin-token-0123456789", "--", FIXTURE],
    );
    gw.client().initialize().await;
    assert!(
        files(&admin).iter().any(|f| f == "mcp-gateway.db"),
        "{:?}",
        files(&admin)
    );
}
