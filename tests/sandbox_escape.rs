//! The plugin sandbox against a plugin that tries to get out: `mcp-fixture-hostile` run by the
//! real gateway binary, asked to read, write, signal and ptrace what is not its own (the
//! gateway, another session's instance, the gateway's database and config file), to reach the
//! network past its rules, to fork, allocate and write past its limits. Every attempt must be
//! refused by the kernel with the errno the rule gives (EACCES or EPERM, EAGAIN for processes,
//! EFBIG for file size, ENETUNREACH too with `network = "none"`), what is allowed must still
//! work, and the gateway must go on serving. The fixture reports each attempt's errno, so a
//! failure here names the escape that succeeded.
//!
//! The tests run as root (the gateway then may give plugins a uid of their own); the one that
//! needs an unprivileged gateway runs it as uid 65534 through `setpriv`.
//! Run: `cargo test --test sandbox_escape`.

mod common;

use std::fs;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use common::admin::ADMIN_TOKEN;
use common::{Admin, Client, Gateway, free_port};
use serde_json::{Value, json};

const HOSTILE: &str = env!("CARGO_BIN_EXE_mcp-fixture-hostile");
/// The user an unprivileged gateway runs as.
const NOBODY: u32 = 65534;
const UID_RANGE: (u32, u32) = (200_000, 265_535);

/// A gateway's files: its config and SQLite database in one directory, and `[sandbox] dir` in
/// another (the database's directory is hidden from plugins, their homes must not be in it).
struct Files {
    dir: tempfile::TempDir,
    sandbox: tempfile::TempDir,
    /// Copies of the gateway and the hostile fixture where every user reaches them: a plugin
    /// under a uid of its own, or a gateway run as nobody, must reach its program wherever
    /// the checkout is (a home of mode 0700 would stop them).
    bins: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        let sandbox = tempfile::tempdir().unwrap();
        let bins = tempfile::tempdir().unwrap();
        // A plugin given a uid of its own must reach its home below it.
        for d in [sandbox.path(), bins.path()] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
        }
        for program in [HOSTILE, common::GATEWAY] {
            let name = Path::new(program).file_name().unwrap();
            fs::copy(program, bins.path().join(name)).unwrap();
        }
        Files {
            dir: tempfile::tempdir().unwrap(),
            sandbox,
            bins,
        }
    }

    fn hostile(&self) -> String {
        let name = Path::new(HOSTILE).file_name().unwrap();
        self.bins.path().join(name).to_str().unwrap().to_owned()
    }

    /// The wrapper that runs the gateway's copy as uid and gid `id` (the harness appends the
    /// gateway's own path, which the shell drops).
    fn as_user(&self, id: u32) -> Vec<String> {
        let name = Path::new(common::GATEWAY).file_name().unwrap();
        let copy = self.bins.path().join(name).to_str().unwrap().to_owned();
        vec![
            "setpriv".into(),
            format!("--reuid={id}"),
            format!("--regid={id}"),
            "--clear-groups".into(),
            "--".into(),
            "/bin/sh".into(),
            "-c".into(),
            "shift; exec \"$0\" \"$@\"".into(),
            copy,
        ]
    }

    /// A hostile plugin `name`: `keys` in its table, `sandbox` in `[plugins.NAME.sandbox]`
    /// (left out when empty: the sandbox is on by default).
    fn plugin(&self, name: &str, keys: &str, sandbox: &str) -> String {
        let hostile = self.hostile();
        let mut t = format!("[plugins.{name}]\ncommand = {hostile:?}\n{keys}\n");
        if !sandbox.is_empty() {
            t += &format!("[plugins.{name}.sandbox]\n{sandbox}\n");
        }
        t
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("gw.db")
    }

    fn db_url(&self) -> String {
        format!("sqlite://{}?mode=rwc", self.db().display())
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("gw.toml")
    }

    /// Writes the config file (`[sandbox]` with `dir` and `sandbox_keys`, then `rest`): the
    /// flags that name it and the database.
    fn flags(&self, sandbox_keys: &str, rest: &str) -> Vec<String> {
        let dir = self.sandbox.path().to_str().unwrap();
        fs::write(
            self.config(),
            format!("[sandbox]\ndir = {dir:?}\n{sandbox_keys}\n{rest}"),
        )
        .unwrap();
        let config = self.config().to_str().unwrap().to_owned();
        vec![
            "--config".into(),
            config,
            "--database-url".into(),
            self.db_url(),
        ]
    }
}

fn with_admin(mut flags: Vec<String>) -> Vec<String> {
    flags.extend(["--admin-token".into(), ADMIN_TOKEN.into()]);
    flags
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Files an escape may have written outside the test's directories when it was not refused:
/// removed at the end, whatever happened.
struct Strays(Vec<PathBuf>);

impl Strays {
    fn add(&mut self, p: impl Into<PathBuf>) -> String {
        let p = p.into();
        self.0.push(p.clone());
        p.to_str().unwrap().to_owned()
    }
}

impl Drop for Strays {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_file(p);
        }
    }
}

static NEXT_ID: AtomicI64 = AtomicI64::new(1);

/// A session (with a bearer token, if given).
async fn session(gw: &Gateway, token: Option<&str>) -> Client {
    let mut c = gw.client();
    if let Some(t) = token {
        c = c.with_token(t);
    }
    c.initialize().await;
    c
}

/// A hostile tool's report: the JSON in the text of its result.
async fn call(c: &Client, tool: &str, args: Value) -> Value {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let text = c.tool_text(id, tool, args).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{tool}: no JSON ({e}): {text}"))
}

/// What an instance's `whoami` said: its pid and its HOME.
fn pid_home(who: &Value) -> (u64, String) {
    let home = who["env"]["HOME"].as_str().unwrap_or("/nonexistent");
    (who["pid"].as_u64().unwrap(), home.to_owned())
}

/// One line per attempt of an `escape` report that was not refused with its kind's errno
/// (EAGAIN for `fork`, EFBIG for `write_file`, else EACCES or EPERM) or one of `also`.
fn not_refused(who: &str, report: &Value, also: &[&str]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (kind, attempts) in report.as_object().expect("a report") {
        let expected: Vec<&str> = match kind.as_str() {
            "fork" => vec!["EAGAIN"],
            "write_file" => vec!["EFBIG"],
            _ => [&["EACCES", "EPERM"], also].concat(),
        };
        for a in attempts.as_array().unwrap() {
            let errno = a["error"].as_str().unwrap_or_default();
            let errno = errno.split(' ').next().unwrap_or_default();
            if a["ok"] != false || !expected.contains(&errno) {
                let target = &a["target"];
                wrong.push(format!(
                    "{who}: {kind} {target} not refused with {expected:?}: {a}"
                ));
            }
        }
    }
    wrong
}

/// One line per attempt of an `escape` report that failed.
fn not_allowed(who: &str, report: &Value) -> Vec<String> {
    let mut wrong = Vec::new();
    for (kind, attempts) in report.as_object().expect("a report") {
        for a in attempts.as_array().unwrap() {
            if a["ok"] != true {
                wrong.push(format!("{who}: {kind} {} must work: {a}", a["target"]));
            }
        }
    }
    wrong
}

fn assert_none(wrong: &[String]) {
    assert!(
        wrong.is_empty(),
        "{} escape(s) not stopped, or allowed things refused:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Waits until plugin `name`'s `last_error` in `GET /admin/plugins`, lowercased, satisfies
/// `about`; returns it.
async fn wait_last_error(gw: &Gateway, name: &str, about: impl Fn(&str) -> bool) -> String {
    let admin = Admin::of(gw, ADMIN_TOKEN);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, list) = admin.get("/admin/plugins").await;
        assert_eq!(status, 200, "{list}");
        let p = list["plugins"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .cloned()
            .unwrap_or_default();
        if let Some(e) = p["last_error"].as_str()
            && about(&e.to_lowercase())
        {
            return e.to_owned();
        }
        assert!(Instant::now() < deadline, "{name}: no such last_error: {p}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a reply is an error: a JSON-RPC error, or a tool result marked `isError`.
fn failed(reply: &common::Reply) -> bool {
    let last = reply.last();
    last.get("error").is_some() || last["result"]["isError"] == true
}

#[tokio::test]
async fn a_plugin_cannot_reach_the_gateway_other_sessions_or_the_network_past_its_rules() {
    let files = Files::new();
    let mut strays = Strays(Vec::new());
    // Listeners of the test's own: one port the plugin may connect to, one it may not.
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let abstract_name = format!("mcp-gateway-escape-{}", std::process::id());
    let _abstract =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap())
            .unwrap();
    let unix_dir = tempfile::tempdir().unwrap();
    let unix_path = unix_dir.path().join("s.sock");
    let _unix = UnixListener::bind(&unix_path).unwrap();
    let unix_path = unix_path.to_str().unwrap().to_owned();
    let [allowed, other, udp] = [
        allowed.local_addr().unwrap(),
        other.local_addr().unwrap(),
        udp.local_addr().unwrap(),
    ]
    .map(|a| a.to_string());
    let (bind_ok, bind_refused) = (free_port(), free_port());
    let allowed_port = allowed.rsplit(':').next().unwrap();
    let hostile = format!(
        "connect_ports = [{allowed_port}]\nbind_ports = [{bind_ok}]\n\
         max_processes = 16\nmax_file_mb = 1"
    );
    let plugins =
        files.plugin("hostile", "", &hostile) + &files.plugin("offline", "", "network = \"none\"");
    let gw = Gateway::start(&strs(&with_admin(files.flags("", &plugins))));
    let gw_pid = gw.pid();
    let admin_addr = gw.admin.clone().expect("admin listener");

    let a = session(&gw, None).await;
    let b = session(&gw, None).await;
    let (a_pid, a_home) = pid_home(&call(&a, "hostile__whoami", json!({})).await);
    let (b_pid, b_home) = pid_home(&call(&b, "hostile__whoami", json!({})).await);
    assert_ne!(a_pid, b_pid, "each session has its own instance");
    let sleeper = call(&b, "hostile__spawn_sleeper", json!({})).await["pid"].clone();
    assert!(sleeper.is_u64(), "{sleeper}");

    let tag = format!("escape-{}", std::process::id());
    let (db, config) = (files.db(), files.config());
    let report = call(
        &a,
        "hostile__escape",
        json!({
            "read": [format!("/proc/{gw_pid}/environ"), format!("/proc/{gw_pid}/cmdline"),
                     format!("/proc/{b_pid}/environ"), format!("/proc/{b_pid}/cmdline"),
                     &db, format!("{}-wal", db.display()), config, b_home, "/etc/shadow"],
            "write": [strays.add(files.dir.path().join(&tag)),
                      strays.add(Path::new("/tmp").join(&tag)),
                      strays.add(Path::new(&b_home).join(&tag))],
            "kill": [gw_pid, b_pid, sleeper],
            "ptrace": [gw_pid, b_pid, sleeper],
            "connect": [admin_addr, "127.0.0.1:6379", "127.0.0.1:5432", other],
            "bind": [bind_refused],
            "abstract_connect": [abstract_name],
            // What Landlock does not cover (a seccomp filter does): another process's
            // priority and limits, a named Unix socket, a set-user-id file of its own.
            "renice": [gw_pid, b_pid],
            "prlimit": [gw_pid, b_pid],
            "unix_connect": [unix_path],
            "setuid_bit": [strays.add(Path::new(&a_home).join(format!("{tag}-suid")))],
            "fork": 64,
            "write_file": {"path": strays.add(Path::new(&a_home).join(format!("{tag}-big"))), "mb": 4},
        }),
    )
    .await;
    let mut wrong = not_refused("session A", &report, &[]);
    let mine = call(
        &a,
        "hostile__escape",
        json!({
            "write": [strays.add(Path::new(&a_home).join(&tag))],
            "read": [a_home],
            "connect": [allowed],
            "bind": [bind_ok],
        }),
    )
    .await;
    wrong.extend(not_allowed("session A, its own", &mine));
    let offline = call(
        &a,
        "offline__escape",
        json!({
            "connect": [admin_addr, "127.0.0.1:6379", "127.0.0.1:5432", allowed],
            "udp": [udp],
        }),
    )
    .await;
    wrong.extend(not_refused(
        "session A, network none",
        &offline,
        &["ENETUNREACH"],
    ));
    assert_none(&wrong);

    // The gateway still serves both sessions, B on the instance it had.
    assert_eq!(
        call(&b, "hostile__whoami", json!({})).await["pid"],
        b_pid,
        "B's instance survived"
    );
    assert_eq!(call(&a, "hostile__whoami", json!({})).await["pid"], a_pid);
    assert!(common::alive(gw_pid));
}

#[tokio::test]
async fn a_plugin_past_its_memory_bound_is_killed_and_the_gateway_says_why() {
    let files = Files::new();
    let plugins = files.plugin("hog", "", "memory_mb = 64");
    let gw = Gateway::start(&strs(&with_admin(files.flags("", &plugins))));
    let a = session(&gw, None).await;
    call(&a, "whoami", json!({})).await;
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let args = json!({"name": "escape", "arguments": {"alloc_mb": 512}});
    let reply = a.call(id, "tools/call", args).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(
        failed(&reply),
        "512 MiB in a plugin bound to 64: {}",
        reply.last()
    );

    let b = session(&gw, None).await;
    assert!(call(&b, "whoami", json!({})).await["pid"].is_u64());
    let e = wait_last_error(&gw, "hog", |e| e.contains("memory")).await;
    println!("last_error after the memory kill: {e}");
}

#[tokio::test]
async fn a_plugin_gets_a_clean_environment_no_capabilities_and_no_core_dumps() {
    let files = Files::new();
    let plugins = files.plugin("plain", "env = { GREETING = \"hello\" }", "");
    let flags = files.flags("", &plugins);
    let db_url = files.db_url();
    let env = [
        ("MCP_GATEWAY_ADMIN_TOKEN", ADMIN_TOKEN),
        ("MCP_GATEWAY_DATABASE_URL", db_url.as_str()),
        ("ESCAPE_TEST_CANARY", "from-the-gateway-environment"),
    ];
    let gw = Gateway::start_with_env(&strs(&flags), &env);
    let c = session(&gw, None).await;
    let who = call(&c, "whoami", json!({})).await;
    let sandbox_dir = files.sandbox.path().to_str().unwrap();

    let mut wrong = Vec::new();
    let vars = who["env"].as_object().expect("env");
    for (k, v) in vars {
        let v = v.as_str().unwrap_or_default();
        // Package caches and the like point into the sandbox's directory.
        let allowed = matches!(
            k.as_str(),
            "PATH" | "LANG" | "TZ" | "GREETING" | "MCP_GATEWAY_PLUGIN_INSTANCE"
        ) || v.starts_with(sandbox_dir);
        if !allowed {
            wrong.push(format!("{k}={v} leaked into the plugin's environment"));
        }
    }
    for k in ["HOME", "TMPDIR"] {
        let v = vars.get(k).and_then(Value::as_str).unwrap_or_default();
        if !v.starts_with(sandbox_dir) {
            wrong.push(format!(
                "{k}={v:?} is not the instance's own (in {sandbox_dir})"
            ));
        }
    }
    for k in ["PATH", "MCP_GATEWAY_PLUGIN_INSTANCE"] {
        if !vars.contains_key(k) {
            wrong.push(format!("{k} missing"));
        }
    }
    if vars.get("GREETING") != Some(&json!("hello")) {
        wrong.push("the plugin's own env entry GREETING missing".into());
    }
    let status = &who["status"];
    let cap_eff = u64::from_str_radix(status["CapEff"].as_str().unwrap_or("?"), 16);
    if cap_eff != Ok(0) {
        wrong.push(format!("CapEff is {}", status["CapEff"]));
    }
    if status["NoNewPrivs"] != "1" {
        wrong.push(format!("NoNewPrivs is {}", status["NoNewPrivs"]));
    }
    if who["rlimits"]["CORE"][0] != 0 {
        wrong.push(format!("RLIMIT_CORE is {}", who["rlimits"]["CORE"]));
    }
    assert_none(&wrong);
}

#[tokio::test]
async fn two_subjects_instances_cannot_see_each_other() {
    let files = Files::new();
    let base = "http://127.0.0.1:9";
    let rest = format!(
        "[auth]\nmode = \"builtin\"\npublic_url = \"{base}/mcp\"\n{}",
        files.plugin("hostile", "", "")
    );
    let range = format!("uid_range = [{}, {}]", UID_RANGE.0, UID_RANGE.1);
    let gw = Gateway::start(&strs(&with_admin(files.flags(&range, &rest))));
    let now = mcp_gateway::auth::now_secs();
    let mut clients = Vec::new();
    for sub in ["alice", "bob"] {
        let claims = json!({"iss": base, "sub": sub, "aud": format!("{base}/mcp"),
            "scope": "mcp", "client_id": "c", "exp": now + 300, "iat": now, "nbf": now, "jti": sub});
        let token = common::oauth::forge(&files.db_url(), claims).await;
        clients.push(session(&gw, Some(&token)).await);
    }
    let mut wrong = Vec::new();
    let mut seen = Vec::new();
    for c in &clients {
        let who = call(c, "whoami", json!({})).await;
        let uid = who["uid"].as_u64().unwrap_or_default();
        if !(u64::from(UID_RANGE.0)..=u64::from(UID_RANGE.1)).contains(&uid) {
            wrong.push(format!(
                "as root with uid_range, an instance runs as uid {uid}"
            ));
        }
        let sleeper = call(c, "spawn_sleeper", json!({})).await["pid"].clone();
        seen.push((pid_home(&who), sleeper));
    }
    assert_ne!(seen[0].0.0, seen[1].0.0, "an instance each");
    if seen[0].0.1 == seen[1].0.1 {
        wrong.push(format!("both instances have the home {}", seen[0].0.1));
    }

    let mut strays = Strays(Vec::new());
    for (me, other) in [(0, 1), (1, 0)] {
        let name = ["alice", "bob"][me];
        let ((pid, home), sleeper) = &seen[other];
        let tag = format!("escape-{name}-{}", std::process::id());
        let report = call(
            &clients[me],
            "escape",
            json!({
                "read": [format!("/proc/{pid}/environ"), format!("/proc/{pid}/cmdline"),
                         format!("/proc/{sleeper}/environ"), home],
                "write": [strays.add(Path::new(home).join(&tag))],
                "kill": [pid, sleeper],
                "ptrace": [pid, sleeper],
            }),
        )
        .await;
        wrong.extend(not_refused(name, &report, &[]));
        let own = Path::new(&seen[me].0.1).join(&tag);
        let mine = call(&clients[me], "escape", json!({"write": [strays.add(own)]})).await;
        wrong.extend(not_allowed(name, &mine));
    }
    assert_none(&wrong);
}

#[tokio::test]
async fn a_required_uid_range_without_privilege_keeps_the_plugin_from_starting() {
    let files = Files::new();
    for dir in [files.dir.path(), files.sandbox.path()] {
        std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let range = format!("uid_range = [{}, {}]", UID_RANGE.0, UID_RANGE.1);
    let flags = with_admin(files.flags(&range, &files.plugin("hostile", "", "required = true")));
    let gw = Gateway::start_wrapped(&strs(&files.as_user(NOBODY)), &strs(&flags));
    let status = fs::read_to_string(format!("/proc/{}/status", gw.pid())).unwrap();
    let real_uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
    assert_eq!(
        real_uid.split_whitespace().next(),
        Some("65534"),
        "the gateway runs unprivileged"
    );

    let c = session(&gw, None).await;
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let reply = c
        .call(id, "tools/call", json!({"name": "whoami", "arguments": {}}))
        .await;
    assert!(
        failed(&reply),
        "a plugin that requires uid_range ran under an unprivileged gateway: {}",
        reply.last()
    );
    let e = wait_last_error(&gw, "hostile", |e| {
        ["uid", "privilege", "cap_setuid"]
            .iter()
            .any(|w| e.contains(w))
    })
    .await;
    println!("last_error without privilege: {e}");
}

/// The deployment files' case: an unprivileged gateway (no cgroup it may write, no other
/// user id). Landlock, seccomp, rlimits and no_new_privs still hold; what cannot is said.
#[tokio::test]
async fn an_unprivileged_gateway_still_walls_its_plugins_in() {
    let files = Files::new();
    for dir in [files.dir.path(), files.sandbox.path()] {
        std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let plugins = files.plugin("hostile", "", "memory_mb = 512")
        + &files.plugin("offline", "", "network = \"none\"");
    let flags = with_admin(files.flags("", &plugins));
    let gw = Gateway::start_wrapped(&strs(&files.as_user(NOBODY)), &strs(&flags));
    let gw_pid = gw.pid();
    let c = session(&gw, None).await;
    let who = call(&c, "hostile__whoami", json!({})).await;
    assert_eq!(who["uid"], NOBODY, "{who}");
    assert_eq!(who["status"]["NoNewPrivs"], "1", "{who}");
    // Without a cgroup, the memory bound is each process's data limit.
    assert_eq!(who["rlimits"]["DATA"][0], 512u64 << 20, "{who}");
    let (_, home) = pid_home(&who);
    let (db, config) = (files.db(), files.config());
    let report = call(
        &c,
        "hostile__escape",
        json!({
            "read": [format!("/proc/{gw_pid}/environ"), format!("/proc/{gw_pid}/cmdline"),
                     &db, format!("{}-wal", db.display()), config],
            "kill": [gw_pid],
            "ptrace": [gw_pid],
            "renice": [gw_pid],
            "prlimit": [gw_pid],
        }),
    )
    .await;
    let mut wrong = not_refused("unprivileged", &report, &[]);
    // network = "none" without privilege: Landlock for TCP, a network namespace of a user
    // namespace's (or seccomp) for UDP.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let offline = call(
        &c,
        "offline__escape",
        json!({"connect": ["127.0.0.1:6379"], "udp": [udp.local_addr().unwrap().to_string()]}),
    )
    .await;
    wrong.extend(not_refused(
        "unprivileged, network none",
        &offline,
        &["ENETUNREACH"],
    ));
    let mine = call(
        &c,
        "hostile__escape",
        json!({"write": [format!("{home}/mine")]}),
    )
    .await;
    wrong.extend(not_allowed("unprivileged, its own", &mine));
    assert_none(&wrong);
    // What it could not apply is said per rule.
    let (status, list) = Admin::of(&gw, ADMIN_TOKEN).get("/admin/plugins").await;
    assert_eq!(status, 200);
    let hostile = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "hostile")
        .cloned()
        .unwrap();
    let rules = hostile["isolation"]["rules"].clone();
    let memory = rules
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "memory")
        .cloned()
        .unwrap();
    assert_eq!(memory["enforced"], false, "{rules}");
    assert!(common::alive(gw_pid));
}
