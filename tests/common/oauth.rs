//! A gateway in `builtin` auth mode and the OAuth 2.1 flows against it, as a client and a
//! person's browser would go through them: dynamic registration, PKCE, the authorize page,
//! sign-in and consent forms (cookie and CSRF field), the token endpoint (codes, refresh,
//! client credentials), revocation, key rotation, and tokens forged with the gateway's own key.
//! Helpers return what the server answered; the few checks inside them (the sign-in page's
//! frame and cookie attributes, a redirect's state and issuer, `no-store` on token answers)
//! hold for every flow that passes through them. Everything else is the tests' to assert.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::{ACCEPT_BOTH, Admin, FIXTURE, Gateway, free_port, write_config};

pub const REDIRECT: &str = "http://127.0.0.1:9/callback";

/// A gateway in `builtin` mode on a port chosen first (the public URL names it), with users
/// alice and bob, the provisioned client `robot` (client credentials, scope `mcp` only), the
/// fixture as plugin `fix`, and the fixture again as `vault`, whose tools need the `vault`
/// scope.
pub struct AuthGateway {
    pub gw: Gateway,
    /// `http://127.0.0.1:PORT`, the issuer: the port the public URL names (a replica listens
    /// on another).
    pub base: String,
    /// The database's URL.
    pub db: String,
    /// Holds the config file and the SQLite database.
    pub dir: tempfile::TempDir,
}

/// The admin API's token on every [`AuthGateway`].
pub const ADMIN_TOKEN: &str = "admin-secret-token-0001";

/// The provisioned client's id and secret.
pub const ROBOT: (&str, &str) = ("robot", "robot-secret");

/// The argon2 hashes of alice's, bob's and the robot's secrets, made once (argon2 is slow in a
/// debug build).
pub fn hashes() -> &'static [String; 3] {
    static HASHES: std::sync::OnceLock<[String; 3]> = std::sync::OnceLock::new();
    HASHES.get_or_init(|| {
        ["alice-pw", "bob-pw", ROBOT.1].map(mcp_gateway::auth::server::hash_password)
    })
}

impl AuthGateway {
    pub fn start(extra_auth: &str, database_url: Option<&str>) -> AuthGateway {
        AuthGateway::start_on(free_port(), extra_auth, database_url)
    }

    pub fn start_on(port: u16, extra_auth: &str, database_url: Option<&str>) -> AuthGateway {
        AuthGateway::replica(port, port, extra_auth, database_url)
    }

    /// A gateway listening on `listen_port` whose public URL names `public_port`: with the
    /// same database, a replica of the gateway there (the same issuer and resource).
    pub fn replica(
        public_port: u16,
        listen_port: u16,
        extra_auth: &str,
        database_url: Option<&str>,
    ) -> AuthGateway {
        AuthGateway::with_flags(public_port, listen_port, extra_auth, database_url, &[])
    }

    /// [`AuthGateway::replica`] with more command-line flags.
    pub fn with_flags(
        public_port: u16,
        listen_port: u16,
        extra_auth: &str,
        database_url: Option<&str>,
        flags: &[&str],
    ) -> AuthGateway {
        let dir = tempfile::tempdir().unwrap();
        let base = format!("http://127.0.0.1:{public_port}");
        let [alice, bob, robot] = hashes();
        let robot_id = ROBOT.0;
        let config = format!(
            "[auth]\nmode = \"builtin\"\npublic_url = \"{base}/mcp\"\n{extra_auth}\n\
             [[auth.users]]\nname = \"alice\"\npassword_hash = \"{alice}\"\n\
             [[auth.users]]\nname = \"bob\"\npassword_hash = \"{bob}\"\n\
             [[auth.clients]]\nclient_id = \"{robot_id}\"\nsecret_hash = \"{robot}\"\nscopes = [\"mcp\"]\n\
             [plugins.fix]\ncommand = \"{FIXTURE}\"\n\
             [plugins.vault]\ncommand = \"{FIXTURE}\"\nscope = \"vault\"\n"
        );
        let path = write_config(&dir, &config);
        let listen = format!("127.0.0.1:{listen_port}");
        let db = database_url
            .map(str::to_owned)
            .unwrap_or_else(|| format!("sqlite://{}/auth.db?mode=rwc", dir.path().display()));
        let mut args = vec![
            "--listen",
            &listen,
            "--config",
            &path,
            "--database-url",
            &db,
            "--admin-token",
            ADMIN_TOKEN,
        ];
        args.extend_from_slice(flags);
        let gw = Gateway::start(&args);
        AuthGateway { gw, base, db, dir }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

pub async fn get_json(a: &AuthGateway, path: &str) -> Value {
    let r = http().get(a.url(path)).send().await.unwrap();
    assert_eq!(r.status(), 200, "{path}");
    r.json().await.unwrap()
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A client whose connections come from `ip` (on loopback: 127.0.0.1, 127.0.0.2, …), to act
/// as several client addresses.
pub fn http_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(ip.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap()
}

pub async fn register(a: &AuthGateway, meta: Value) -> (u16, Value) {
    let r = http()
        .post(a.url("/register"))
        .json(&meta)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

pub async fn public_client(a: &AuthGateway) -> String {
    let (status, c) = register(
        a,
        json!({"client_name": "Test App", "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none", "application_type": "native"}),
    )
    .await;
    assert_eq!(status, 201, "{c}");
    assert!(
        c.get("client_secret").is_none(),
        "a public client has no secret"
    );
    c["client_id"].as_str().unwrap().to_owned()
}

pub async fn token(a: &AuthGateway, form: &[(&str, &str)]) -> (u16, Value) {
    let r = http()
        .post(a.url("/token"))
        .form(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["cache-control"], "no-store");
    (r.status().as_u16(), r.json().await.unwrap())
}

pub fn pkce() -> (String, String) {
    use sha2::Digest;
    let verifier = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
    let challenge = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

pub fn hidden(html: &str, name: &str) -> String {
    let at = html
        .find(&format!("name=\"{name}\" value=\""))
        .unwrap_or_else(|| panic!("no field {name} in {html}"));
    let rest = &html[at + name.len() + 15..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// What a browser holds between the pages: the CSRF cookie and the form's fields.
pub struct Browser {
    pub cookie: String,
    pub request: String,
    pub csrf: String,
}

pub async fn open_authorize(a: &AuthGateway, query: &[(&str, &str)]) -> reqwest::Response {
    http()
        .get(a.url("/authorize"))
        .query(query)
        .send()
        .await
        .unwrap()
}

pub async fn login_page(
    a: &AuthGateway,
    client_id: &str,
    challenge: &str,
    state: &str,
    scope: &str,
) -> Browser {
    let r = open_authorize(
        a,
        &[
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", REDIRECT),
            ("code_challenge", challenge),
            ("code_challenge_method", "S256"),
            ("state", state),
            ("scope", scope),
            ("resource", &a.url("/mcp")),
        ],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-frame-options"], "DENY");
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"),
        "{cookie}"
    );
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let html = r.text().await.unwrap();
    assert!(
        html.contains("Test App") && html.contains("127.0.0.1"),
        "names the client and its redirect host"
    );
    Browser {
        cookie,
        request: hidden(&html, "request"),
        csrf: hidden(&html, "csrf"),
    }
}

pub async fn post_form(
    a: &AuthGateway,
    b: &Browser,
    path: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let mut form = vec![("request", b.request.as_str()), ("csrf", b.csrf.as_str())];
    form.extend_from_slice(fields);
    http()
        .post(a.url(path))
        .header("cookie", &b.cookie)
        .form(&form)
        .send()
        .await
        .unwrap()
}

pub fn redirect_params(r: &reqwest::Response) -> HashMap<String, String> {
    assert_eq!(r.status(), 303, "a redirect to the client");
    let location = r.headers()["location"].to_str().unwrap();
    assert!(location.starts_with(REDIRECT), "{location}");
    url::Url::parse(location)
        .unwrap()
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Signs in as `user` and approves (or finds consent remembered): the code.
pub async fn authorize(
    a: &AuthGateway,
    client_id: &str,
    challenge: &str,
    user: &str,
    scope: &str,
) -> String {
    let b = login_page(a, client_id, challenge, "st-1", scope).await;
    let r = post_form(
        a,
        &b,
        "/authorize/login",
        &[("username", user), ("password", &format!("{user}-pw"))],
    )
    .await;
    let r = if r.status() == 200 {
        let html = r.text().await.unwrap();
        assert!(html.contains("Allow access") && html.contains(scope.split(' ').next().unwrap()));
        post_form(a, &b, "/authorize/consent", &[("decision", "approve")]).await
    } else {
        r
    };
    let p = redirect_params(&r);
    assert_eq!(p["state"], "st-1");
    assert_eq!(p["iss"], a.base, "RFC 9207 iss");
    p["code"].clone()
}

pub async fn exchange(
    a: &AuthGateway,
    client_id: &str,
    code: &str,
    verifier: &str,
) -> (u16, Value) {
    token(
        a,
        &[
            ("grant_type", "authorization_code"),
            ("client_id", client_id),
            ("code", code),
            ("code_verifier", verifier),
            ("redirect_uri", REDIRECT),
            ("resource", &a.url("/mcp")),
        ],
    )
    .await
}

pub async fn refresh_with(a: &AuthGateway, client: &str, refresh: &str) -> (u16, Value) {
    token(
        a,
        &[
            ("grant_type", "refresh_token"),
            ("client_id", client),
            ("refresh_token", refresh),
        ],
    )
    .await
}

/// An `initialize` at `/mcp` where the gateway listens (a replica's address differs from the
/// public URL): its status and challenge.
pub async fn mcp_status(a: &AuthGateway, token: Option<&str>) -> (u16, String) {
    let mut r = http()
        .post(&a.gw.url)
        .header("content-type", "application/json")
        .header("accept", ACCEPT_BOTH)
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).to_string());
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.unwrap();
    let challenge = r
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (r.status().as_u16(), challenge)
}

/// A token signed with the gateway's own key but with claims of the test's choosing: the
/// key is read from the gateway's database (once the gateway serves: it logs its address
/// before it opens the database).
pub async fn forge(db: &str, claims: Value) -> String {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(db)
        .await
        .unwrap_or_else(|e| panic!("{db}: {e}"));
    let row: (String, String) = sqlx::query_as("SELECT kid, private_der FROM auth_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    let der = URL_SAFE_NO_PAD.decode(row.1).unwrap();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some(row.0);
    jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_ec_der(&der),
    )
    .unwrap()
}

/// Serves a client ID metadata document at `/client.json` on loopback; its URL. `id` may
/// differ from the URL, to test that it must not.
pub async fn serve_document(id: Option<&str>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/client.json", listener.local_addr().unwrap());
    let doc = json!({
        "client_id": id.unwrap_or(&url),
        "client_name": "Document Client",
        "redirect_uris": [REDIRECT],
        "token_endpoint_auth_method": "none",
    });
    let app = axum::Router::new().route(
        "/client.json",
        axum::routing::get(move || {
            let doc = doc.clone();
            async move { axum::Json(doc) }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// The page `/authorize` answers for a metadata-document client id: status and text.
pub async fn authorize_page(a: &AuthGateway, client_id: &str) -> (u16, String) {
    let (_, challenge) = pkce();
    let r = open_authorize(
        a,
        &[
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", REDIRECT),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
        ],
    )
    .await;
    assert!(r.headers().get("location").is_none());
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Revokes an access token of the provisioned client (RFC 7009).
pub async fn revoke_as_robot(a: &AuthGateway, token: &str) {
    let r = http()
        .post(a.url("/revoke"))
        .form(&[
            ("client_id", ROBOT.0),
            ("client_secret", ROBOT.1),
            ("token", token),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Rotates the signing keys through the admin API: the new current key id.
pub async fn rotate(a: &AuthGateway) -> String {
    let admin = Admin::of(&a.gw, ADMIN_TOKEN);
    let (status, v) = admin
        .send(
            reqwest::Method::POST,
            "/admin/auth/rotate-keys",
            None,
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(status, 200);
    v["current_kid"].as_str().unwrap().to_owned()
}

/// A token for the provisioned client, by client credentials (client_secret_post).
pub async fn robot_token(a: &AuthGateway) -> String {
    let (status, t) = token(
        a,
        &[
            ("grant_type", "client_credentials"),
            ("client_id", ROBOT.0),
            ("client_secret", ROBOT.1),
        ],
    )
    .await;
    assert_eq!(status, 200, "{t}");
    t["access_token"].as_str().unwrap().to_owned()
}
