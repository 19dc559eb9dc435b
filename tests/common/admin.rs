//! The admin listener as tests use it: unauthenticated GETs (probes, `/metrics`), a reader for
//! the Prometheus text format, and [`Admin`], the admin API with its bearer token. It works
//! against either harness; it never changes what a request carries behind the test's back.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Endpoints, FIXTURE};

/// The admin token of the admin API's tests.
pub const ADMIN_TOKEN: &str = "admin-s3cret-token-0001";

/// Flags for a gateway with the admin API on and one plugin, `main`, from the command line.
pub const WITH_MAIN_PLUGIN: [&str; 6] = [
    "--admin-token",
    ADMIN_TOKEN,
    "--plugin-name",
    "main",
    "--",
    FIXTURE,
];

/// The admin API's definition of a fixture plugin called `name` (and naming itself so).
pub fn fixture_plugin(name: &str) -> Value {
    json!({"name": name, "command": FIXTURE, "args": ["--name", name]})
}

/// GET on the admin listener, with no token: status and body.
pub async fn admin_get(gw: &impl Endpoints, path: &str) -> (u16, String) {
    let admin = gw.admin_addr().expect("admin listener announced");
    let r = reqwest::get(format!("http://{admin}{path}")).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The value of the sample `name{labels}` in a Prometheus text exposition.
pub fn metric_in(text: &str, sample: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(sample)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The admin API of one gateway, called with its token.
pub struct Admin {
    /// `http://ADDR` of the admin listener.
    pub base: String,
    http: reqwest::Client,
    /// The bearer token `get`, `post`, `put` and `delete` send.
    token: String,
}

impl Admin {
    /// The admin API of `gw`, whose admin token is `token`.
    pub fn of(gw: &impl Endpoints, token: &str) -> Admin {
        Admin {
            base: format!("http://{}", gw.admin_addr().expect("admin API on")),
            http: reqwest::Client::new(),
            token: token.to_owned(),
        }
    }

    /// A request with the token of the test's choosing (or none) and an optional JSON body:
    /// the status and the body as JSON (`Null` when it is not JSON).
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        token: Option<&str>,
    ) -> (u16, Value) {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None, Some(&self.token))
            .await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body), Some(&self.token))
            .await
    }

    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::PUT, path, Some(body), Some(&self.token))
            .await
    }

    pub async fn delete(&self, path: &str) -> u16 {
        self.send(reqwest::Method::DELETE, path, None, Some(&self.token))
            .await
            .0
    }

    /// Waits until a plugin reports `state`.
    pub async fn wait_state(&self, name: &str, state: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (_, p) = self.get(&format!("/admin/plugins/{name}")).await;
            if p["state"] == state {
                return p;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} never became {state}: {p}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A browser for the console: no redirects followed.
pub fn console_browser() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Signs in to the console at `ui` (`http://ADMIN/ui`) with [`ADMIN_TOKEN`]; the cookie header to send and the page's CSRF token.
pub async fn console_sign_in(ui: &str) -> (String, String) {
    console_sign_in_with(ui, ADMIN_TOKEN).await
}

/// [`console_sign_in`] with another admin token.
pub async fn console_sign_in_with(ui: &str, token: &str) -> (String, String) {
    let http = console_browser();
    let r = http
        .post(format!("{ui}/login"))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/ui");
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age="] {
        assert!(set.contains(attribute), "{attribute} in {set}");
    }
    let cookie = set.split(';').next().unwrap().to_owned();
    let page = http
        .get(ui)
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = page
        .split(r#"name="csrf-token" content=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page carries its CSRF token")
        .to_owned();
    assert_eq!(csrf.len(), 64);
    (cookie, csrf)
}

/// A change as the signed-in page makes it: the cookie and the CSRF token, a JSON body if
/// one is given.
pub async fn console_change(
    http: &reqwest::Client,
    (cookie, csrf): (&str, &str),
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
) -> reqwest::Response {
    let mut r = http
        .request(method, url)
        .header("cookie", cookie)
        .header("x-csrf-token", csrf);
    if let Some(b) = body {
        r = r.json(b);
    }
    r.send().await.unwrap()
}
