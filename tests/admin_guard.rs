//! The admin listener against an attacker: failed authentications throttled per address (the
//! API and the console together) and recorded, short tokens refused, Host and Origin checked
//! against DNS rebinding on every route, and a flood of half-sent heads that leaves the
//! probes answering. Other addresses are the loopback range's (127.0.0.2, …): Linux routes
//! all of 127.0.0.0/8 to the loopback interface.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::admin::{ADMIN_TOKEN, WITH_MAIN_PLUGIN};
use common::{Admin, FIXTURE, InProcess};
use mcp_gateway::config::{Cli, Config};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn from(last: u8) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

#[tokio::test]
async fn wrong_tokens_are_throttled_per_address_and_recorded() {
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    let base = format!("http://{}", gw.admin.clone().unwrap());
    let attacker = from(2);
    let api = |http: &reqwest::Client, token: &str| {
        http.get(format!("{base}/admin/plugins"))
            .bearer_auth(token)
            .send()
    };
    for i in 0..10 {
        let r = api(&attacker, &format!("guess-{i}")).await.unwrap();
        assert_eq!(r.status(), 401, "guess {i}");
    }
    let r = api(&attacker, "guess-10").await.unwrap();
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=61).contains(&wait), "{wait}");
    // The right token from the same address waits too: a lucky guess looks like the others.
    assert_eq!(api(&attacker, ADMIN_TOKEN).await.unwrap().status(), 429);
    // The console's sign-in counts with the API's.
    let r = attacker
        .post(format!("{base}/ui/login"))
        .form(&[("token", ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    // The operator, at another address, is served.
    let operator = from(1);
    assert_eq!(api(&operator, ADMIN_TOKEN).await.unwrap().status(), 200);
    // Each counted failure is in the audit log, with the address it came from; the
    // throttled ones are not (an address adds at most its ten a minute).
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    let (status, body) = admin.get("/admin/audit?kind=admin&limit=100").await;
    assert_eq!(status, 200, "{body}");
    let failed: Vec<&Value> = body["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["target"] == "admin.authenticate")
        .collect();
    assert_eq!(failed.len(), 10, "{body:#}");
    for r in failed {
        assert_eq!(r["client"], "address 127.0.0.2", "{r}");
        assert_eq!(r["error_code"], 401, "{r}");
        assert!(r["subject"].is_null(), "{r}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn failed_sign_ins_elsewhere_never_lock_the_operator_out_of_the_console() {
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    let ui = format!("http://{}/ui", gw.admin.clone().unwrap());
    let attacker = from(3);
    for _ in 0..20 {
        let r = attacker
            .post(format!("{ui}/login"))
            .form(&[("token", "guess")])
            .send()
            .await
            .unwrap();
        assert!([401, 429].contains(&r.status().as_u16()));
    }
    let r = from(1)
        .post(format!("{ui}/login"))
        .form(&[("token", ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        303,
        "the right token from the operator's address signs in"
    );
    gw.stop().await;
}

#[test]
fn admin_tokens_shorter_than_sixteen_characters_are_refused() {
    let load = |token: &str| {
        let cli = <Cli as clap::Parser>::try_parse_from([
            "mcp-gateway",
            "--admin-listen",
            "0.0.0.0:9090",
            "--admin-token",
            token,
            "--",
            FIXTURE,
        ])
        .unwrap();
        Config::load(&cli)
    };
    let e = load("x").unwrap_err().to_string();
    assert!(e.contains("admin.token") && e.contains("16"), "{e}");
    assert!(load("fifteen-chars-x").is_err());
    if let Err(e) = load("sixteen-chars-xx") {
        panic!("{e}");
    }
}

#[tokio::test]
async fn the_check_command_refuses_a_short_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_config(
        &dir,
        "[admin]\nlisten = \"0.0.0.0:9090\"\ntoken = \"a\"\n[plugins.a]\ncommand = \"x\"\n",
    );
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-gateway"))
        .args(["check", "--config", &config])
        .env_remove("MCP_GATEWAY_ADMIN_TOKEN")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("admin.token"), "{err}");
}

#[tokio::test]
async fn a_rebinding_host_or_another_sites_origin_is_refused_on_every_route() {
    let gw = InProcess::start(&[
        "--admin-token",
        ADMIN_TOKEN,
        "--admin-allowed-hosts",
        "gateway-admin.internal",
        "--",
        FIXTURE,
    ])
    .await;
    let addr = gw.admin.clone().unwrap();
    let port = addr.rsplit_once(':').unwrap().1.to_owned();
    let http = from(1);
    let send = |method: reqwest::Method, path: &str, host: &str, origin: Option<&str>| {
        let mut r = http
            .request(method, format!("http://{addr}{path}"))
            .header("host", host)
            .bearer_auth(ADMIN_TOKEN);
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        if path == "/ui/login" {
            r = r.form(&[("token", ADMIN_TOKEN)]);
        }
        r.send()
    };
    let rebound = format!("rebind.attacker.example:{port}");
    let rebound_origin = format!("http://{rebound}");
    let routes = [
        (reqwest::Method::GET, "/healthz"),
        (reqwest::Method::GET, "/readyz"),
        (reqwest::Method::GET, "/metrics"),
        (reqwest::Method::GET, "/admin/plugins"),
        (reqwest::Method::POST, "/admin/reload"),
        (reqwest::Method::GET, "/ui"),
        (reqwest::Method::POST, "/ui/login"),
    ];
    for (method, path) in &routes {
        let r = send(method.clone(), path, &rebound, Some(&rebound_origin))
            .await
            .unwrap();
        assert_eq!(r.status(), 421, "{method} {path}");
        let body: Value = r.json().await.unwrap();
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("admin.allowed_hosts")
        );
        // Another site's page, even at the right Host.
        let r = send(
            method.clone(),
            path,
            &addr,
            Some("http://rebind.attacker.example"),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), 403, "{method} {path}");
    }
    // The listener's own address, localhost, and a listed name are served.
    for host in [
        addr.clone(),
        format!("localhost:{port}"),
        format!("gateway-admin.internal:{port}"),
    ] {
        let r = send(reqwest::Method::GET, "/admin/plugins", &host, None)
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{host}");
        let origin = format!("http://{host}");
        let r = send(reqwest::Method::GET, "/healthz", &host, Some(&origin))
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{host} with its own origin");
    }
    gw.stop().await;
}

/// Opens a connection from 127.0.0.`last` to `addr` and sends half a request head.
async fn half_open(last: u8, addr: std::net::SocketAddr) -> Option<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind((Ipv4Addr::new(127, 0, 0, last), 0).into())
        .unwrap();
    let mut tcp = socket.connect(addr).await.ok()?;
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0")
        .await
        .ok()?;
    Some(tcp)
}

#[tokio::test]
async fn half_sent_heads_from_many_addresses_leave_the_probes_answering() {
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    let addr: std::net::SocketAddr = gw.admin.clone().unwrap().parse().unwrap();
    // More than the listener's 256 connections, from ten addresses.
    let mut held = Vec::new();
    for last in 10..20u8 {
        for _ in 0..40 {
            if let Some(tcp) = half_open(last, addr).await {
                held.push(tcp);
            }
        }
    }
    // The probes answer while all of those are open (or were closed by the listener).
    let probe = reqwest::Client::builder()
        .timeout(Duration::from_secs(4))
        .build()
        .unwrap();
    for path in ["/healthz", "/readyz", "/metrics"] {
        let r = probe
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path} did not answer: {e}"));
        assert_eq!(r.status(), 200, "{path}");
    }
    // A head that never ends is not waited for long: the listener closes the connection.
    let mut slow = half_open(30, addr).await.expect("connected");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "a half-sent head held its connection for 20 s"
    );
    drop(held);
    gw.stop().await;
}
