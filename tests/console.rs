//! The console's server side, served in the test's process: off without an admin token and
//! never on the public listener; sign-in with the admin token for an `HttpOnly`,
//! `SameSite=Strict` cookie; CSRF tokens and cross-site refusals on every change; throttled
//! failed sign-ins; the JSON its views poll; and the admin API's restart and session
//! endpoints it drives. The browser itself is in `console_browser.rs`.

mod common;

use std::time::Duration;

use common::admin::{
    ADMIN_TOKEN, WITH_MAIN_PLUGIN, console_browser as browser, console_change as change,
    console_sign_in as sign_in,
};
use common::{Admin, FIXTURE, InProcess};
use serde_json::{Value, json};

#[tokio::test]
async fn the_console_is_off_without_a_token_and_never_public() {
    let gw = InProcess::start(&["--", FIXTURE]).await;
    let admin = gw.admin.clone().unwrap();
    let r = reqwest::get(format!("http://{admin}/ui")).await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("admin.token"));
    gw.stop().await;
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    for path in ["/ui", "/ui/assets/console.js", "/ui/api/overview"] {
        let r = reqwest::get(format!("http://{}{path}", gw.addr))
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path} on the public listener");
    }
    gw.stop().await;
}

#[tokio::test]
async fn sign_in_gives_a_strict_cookie_and_changes_need_the_csrf_token() {
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    let ui = format!("http://{}/ui", gw.admin.clone().unwrap());
    let http = browser();
    // Signed out: the sign-in page, with the console's security headers.
    let r = http.get(&ui).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"));
    assert_eq!(r.headers()["x-frame-options"], "DENY");
    assert!(r.text().await.unwrap().contains("Admin token"));
    // A wrong token: 401, no cookie; a form from another site: 403, no cookie.
    let r = http
        .post(format!("{ui}/login"))
        .form(&[("token", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("set-cookie").is_none());
    assert!(r.text().await.unwrap().contains("Wrong token"));
    let r = http
        .post(format!("{ui}/login"))
        .header("origin", "http://evil.example")
        .form(&[("token", ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("set-cookie").is_none());

    let (cookie, csrf) = sign_in(&ui).await;
    // Reading needs the cookie; the admin API's bearer token is not a console sign-in.
    let sessions = format!("{ui}/api/sessions");
    assert_eq!(http.get(&sessions).send().await.unwrap().status(), 401);
    let bearer = http
        .get(&sessions)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 401);
    let r = http
        .get(&sessions)
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A change: refused without the CSRF token, with a wrong one, or from another site.
    let disable = format!("{ui}/api/plugins/main/disable");
    let post = |token: Option<&str>, origin: Option<&str>| {
        let mut r = http.post(&disable).header("cookie", &cookie);
        if let Some(t) = token {
            r = r.header("x-csrf-token", t);
        }
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        r.send()
    };
    assert_eq!(post(None, None).await.unwrap().status(), 403);
    assert_eq!(
        post(Some("0".repeat(64).as_str()), None)
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        post(Some(&csrf), Some("http://evil.example"))
            .await
            .unwrap()
            .status(),
        403
    );
    let admin = Admin::of(&gw, ADMIN_TOKEN);
    assert_eq!(admin.get("/admin/plugins/main").await.1["enabled"], true);
    let r = post(Some(&csrf), None).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(admin.get("/admin/plugins/main").await.1["enabled"], false);
    // The console's actions are audited as the console's; so are its sign-ins.
    let (_, audit) = admin.get("/admin/audit?kind=admin").await;
    let actions: Vec<(&str, &str, &str)> = audit["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["target"].as_str().unwrap(),
                // A failed sign-in has no subject: nobody was let in.
                r["subject"].as_str().unwrap_or("-"),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("plugin.disable", "console", "ok"),
            ("console.sign_in", "console", "ok"),
            ("console.sign_in", "-", "error"),
        ]
    );
    // Edit: the definition is replaced as the admin API's PUT does. A secret shown masked
    // and given back masked (as the edit form does) keeps its value; a mask for a value the
    // plugin never had is refused.
    let signed = (cookie.as_str(), csrf.as_str());
    let main = format!("{ui}/api/plugins/main");
    let put = |definition: Value| {
        let (http, main) = (&http, &main);
        async move { change(http, signed, reqwest::Method::PUT, main, Some(&definition)).await }
    };
    let masked = json!({"command": FIXTURE, "env": {"API_KEY": "***"}, "enabled": true});
    let r = put(masked.clone()).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("env.API_KEY"),
        "{body}"
    );
    let secret = json!({"command": FIXTURE, "env": {"API_KEY": "k-123"}});
    assert_eq!(put(secret).await.status(), 200);
    let shown = admin.get("/admin/plugins/main").await.1;
    assert_eq!(shown["env"]["API_KEY"], "***");
    let mut edited = json!({"command": FIXTURE, "request_timeout_secs": 7});
    edited["env"] = shown["env"].clone();
    edited["scheduling"] = shown["scheduling"].clone();
    assert_eq!(put(edited).await.status(), 200);
    assert_eq!(
        admin.get("/admin/plugins/main").await.1["request_timeout_secs"],
        7
    );
    assert_eq!(
        admin.post("/admin/plugins/main/enable", json!({})).await.0,
        200
    );
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(
        c.tool_text(1, "getenv", json!({"name": "API_KEY"})).await,
        "k-123"
    );
    assert_eq!(
        admin.post("/admin/plugins/main/disable", json!({})).await.0,
        200
    );
    // Validation is the admin API's: a bad definition gets its message.
    let bad = json!({"name": "bad name!", "command": "x"});
    let plugins = format!("{ui}/api/plugins");
    let r = change(&http, signed, reqwest::Method::POST, &plugins, Some(&bad)).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("name"), "{body}");
    // Signed out: the cookie no longer works.
    let logout = format!("{ui}/logout");
    let r = change(&http, signed, reqwest::Method::POST, &logout, None).await;
    assert_eq!(r.status(), 204);
    let r = http
        .get(&sessions)
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    gw.stop().await;
}

#[tokio::test]
async fn failed_sign_ins_are_throttled() {
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    let ui = format!("http://{}/ui", gw.admin.clone().unwrap());
    let http = browser();
    let attempt = |token: &'static str| {
        http.post(format!("{ui}/login"))
            .form(&[("token", token)])
            .send()
    };
    for _ in 0..10 {
        assert_eq!(attempt("guess").await.unwrap().status(), 401);
    }
    let r = attempt("guess").await.unwrap();
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=61).contains(&wait), "{wait}");
    // Meanwhile even the right token waits: guessing is not made cheaper by luck.
    assert_eq!(attempt(ADMIN_TOKEN).await.unwrap().status(), 429);
    gw.stop().await;
}

#[tokio::test]
async fn the_views_json_sessions_restarts_and_plots() {
    let gw = InProcess::start(&WITH_MAIN_PLUGIN).await;
    let ui = format!("http://{}/ui", gw.admin.clone().unwrap());
    let (cookie, csrf) = sign_in(&ui).await;
    let http = browser();
    let get = |path: &str| {
        let r = http
            .get(format!("{ui}/api/{path}"))
            .header("cookie", &cookie)
            .send();
        async move { r.await.unwrap().json::<Value>().await.unwrap() }
    };
    let mut c = gw.client();
    c.initialize().await;
    let pid = c.tool_text(1, "pid", json!({})).await;
    // The session, as the console and the admin API list it.
    let sessions = get("sessions").await;
    let s = &sessions["sessions"][0];
    assert_eq!(s["id_prefix"], &c.session.as_deref().unwrap()[..8]);
    assert_eq!(s["client"], "gateway-tests 1");
    assert_eq!(s["protocol_version"], "2025-11-25");
    assert_eq!(s["instances"][0]["plugin"], "main");
    assert_eq!(s["instances"][0]["pid"].to_string(), pid);
    assert!(!sessions.to_string().contains(c.session.as_deref().unwrap()));
    // A modern client's caller is listed beside it.
    let m = common::modern::Modern::new(gw.client(), json!({}));
    assert_eq!(m.call(2, "echo", json!({"text": "x"})).await.text(), "x");
    let both = get("sessions").await;
    let modern = &both["sessions"][1];
    assert_eq!(modern["era"], "2026-07-28");
    assert_eq!(modern["id_prefix"], "caller");
    assert_eq!(modern["instances"][0]["plugin"], "main");
    // Restart: the session's instance is a new process.
    let signed = (cookie.as_str(), csrf.as_str());
    let restart = format!("{ui}/api/plugins/main/restart");
    let restart = change(&http, signed, reqwest::Method::POST, &restart, None).await;
    assert_eq!(restart.status(), 200);
    let mut new_pid = pid.clone();
    for i in 0..100 {
        let r = c
            .call(
                10 + i,
                "tools/call",
                json!({"name": "pid", "arguments": {}}),
            )
            .await;
        if let Some(t) = r.last()["result"]["content"][0]["text"].as_str() {
            new_pid = t.to_owned();
            if new_pid != pid {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ne!(new_pid, pid, "restarted");
    // The overview plots the calls within a few samples.
    let mut plotted = false;
    for _ in 0..100 {
        c.tool_text(200, "echo", json!({"text": "x"})).await;
        let o = get("overview").await;
        assert_eq!(o["now"]["sessions"], 1);
        assert_eq!(o["now"]["callers"], 1);
        let calls = o["series"]["calls_per_s"].as_array().unwrap();
        if calls.iter().any(|v| v.as_f64().unwrap_or(0.0) > 0.0) {
            assert!(
                o["series"]["p50_ms"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(Value::is_number)
            );
            plotted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(plotted, "calls plotted on the overview");
    let plugins = get("plugins").await;
    assert_eq!(plugins["plugins"][0]["name"], "main");
    assert!(plugins["plugins"][0]["series"]["calls_per_s"].is_array());
    // End the session from the console: the client's next request is refused.
    let key = s["key"].as_str().unwrap();
    let session = format!("{ui}/api/sessions/{key}");
    let end = change(&http, signed, reqwest::Method::DELETE, &session, None).await;
    assert_eq!(end.status(), 204);
    assert_eq!(c.call(300, "ping", json!({})).await.status, 404);
    let left = get("sessions").await;
    assert_eq!(
        left["sessions"].as_array().unwrap().len(),
        1,
        "the caller's"
    );
    assert_eq!(left["sessions"][0]["era"], "2026-07-28");
    let again = change(&http, signed, reqwest::Method::DELETE, &session, None).await;
    assert_eq!(again.status(), 404);
    gw.stop().await;
}

/// The overview shows the rate limits in force with the calls each refused.
#[tokio::test]
async fn the_overview_shows_the_rate_limits() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_config(&dir, "[limits]\nper_subject = { rate = \"1/min\" }\n");
    let gw = InProcess::start(&[
        "--admin-token",
        ADMIN_TOKEN,
        "--config",
        &config,
        "--",
        FIXTURE,
    ])
    .await;
    let ui = format!("http://{}/ui", gw.admin.clone().unwrap());
    let (cookie, _) = sign_in(&ui).await;
    let mut c = gw.client();
    c.initialize().await;
    c.tool_text(1, "echo", json!({"text": "x"})).await;
    assert_eq!(
        c.call(2, "tools/call", json!({"name": "echo", "arguments": {}}))
            .await
            .status,
        429
    );
    let o: Value = browser()
        .get(format!("{ui}/api/overview"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let limit = &o["limits"]["limits"][0];
    assert_eq!(limit["name"], "subject");
    assert_eq!(limit["rate"], "1 call per minute");
    assert!(limit["refused"].as_u64().unwrap() >= 1, "{limit}");
    gw.stop().await;
}
