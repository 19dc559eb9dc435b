//! What the tests of people's credentials share: a gateway in built-in mode with credentials
//! and plugins of the test's own, a person's token there, and the connect page as a browser
//! holds it.

use super::oauth::{ADMIN_TOKEN, AuthGateway, authorize, exchange, hashes, pkce, public_client};
use super::{Gateway, free_port, write_config};

/// A gateway in built-in mode (alice and bob), its credential `tok` (a secret, key
/// `[key; 32]`), and `plugins` (TOML tables); its admin API on with [`ADMIN_TOKEN`].
pub fn gateway_with(key: u8, plugins: &str) -> AuthGateway {
    gateway_with_credentials(
        key,
        free_port(),
        "[credentials.tok]\nkind = \"secret\"\nlabel = \"Service token\"\n",
        plugins,
    )
}

/// A gateway in built-in mode (alice and bob) on `port`, the credentials `credentials`
/// (TOML tables, storage key `[key; 32]`) and `plugins`; its admin API on with
/// [`ADMIN_TOKEN`].
pub fn gateway_with_credentials(
    key: u8,
    port: u16,
    credentials: &str,
    plugins: &str,
) -> AuthGateway {
    replica_with_credentials(key, port, port, credentials, plugins, None, &[])
}

/// [`gateway_with_credentials`] as one replica of several: its public URL on `public_port`,
/// listening on `listen_port`, on the database `database_url` (else a SQLite file of its
/// own), with more flags (a cluster's).
pub fn replica_with_credentials(
    key: u8,
    public_port: u16,
    listen_port: u16,
    credentials: &str,
    plugins: &str,
    database_url: Option<&str>,
    flags: &[&str],
) -> AuthGateway {
    let dir = tempfile::tempdir().unwrap();
    let base = format!("http://127.0.0.1:{public_port}");
    let [alice, bob, _] = hashes();
    let key_file = dir.path().join("credentials.key");
    std::fs::write(&key_file, format!("{key:02x}").repeat(32)).unwrap();
    let config = format!(
        "[auth]\nmode = \"builtin\"\npublic_url = \"{base}/mcp\"\n\
         [[auth.users]]\nname = \"alice\"\npassword_hash = \"{alice}\"\n\
         [[auth.users]]\nname = \"bob\"\npassword_hash = \"{bob}\"\n\
         [credentials]\nkey_file = \"{}\"\n{credentials}{plugins}",
        key_file.display()
    );
    let path = write_config(&dir, &config);
    let db = database_url
        .map(str::to_owned)
        .unwrap_or_else(|| format!("sqlite://{}/gw.db?mode=rwc", dir.path().display()));
    let listen = format!("127.0.0.1:{listen_port}");
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

/// `user`'s access token at `a`.
pub async fn token(a: &AuthGateway, user: &str) -> String {
    let client = public_client(a).await;
    let (verifier, challenge) = pkce();
    let code = authorize(a, &client, &challenge, user, "mcp").await;
    let (status, t) = exchange(a, &client, &code, &verifier).await;
    assert_eq!(status, 200, "{t}");
    t["access_token"].as_str().unwrap().to_owned()
}

/// The connect page as a browser holds it: its cookie and its form's token.
pub struct Page {
    pub link: String,
    pub cookie: String,
    pub csrf: String,
}

impl Page {
    pub async fn open(http: &reqwest::Client, link: &str) -> Page {
        let r = http.get(link).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict"),
            "{set}"
        );
        let cookie = set.split(';').next().unwrap().to_owned();
        let html = r.text().await.unwrap();
        let needle = "name=\"csrf\" value=\"";
        let at = html.find(needle).unwrap() + needle.len();
        let csrf = html[at..at + html[at..].find('"').unwrap()].to_owned();
        Page {
            link: link.to_owned(),
            cookie,
            csrf,
        }
    }

    pub fn post(
        &self,
        http: &reqwest::Client,
        user: &str,
        pw: &str,
        value: &str,
    ) -> reqwest::RequestBuilder {
        http.post(&self.link)
            .header("cookie", &self.cookie)
            .form(&form(&self.csrf, user, pw, value))
    }
}

/// Signs in as `user` (password `{user}-pw`) on the connect page at `link` of an `oauth2`
/// credential: where the gateway sends the person on (the service's authorization URL) and the
/// cookie that binds the flow to this browser. `http` follows no redirects.
pub async fn connect_at_service(
    http: &reqwest::Client,
    link: &str,
    user: &str,
) -> (String, String) {
    let page = Page::open(http, link).await;
    let r = page
        .post(http, user, &format!("{user}-pw"), "")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let to_service = r.headers()["location"].to_str().unwrap().to_owned();
    let flow = r.headers()["set-cookie"].to_str().unwrap();
    (to_service, flow.split(';').next().unwrap().to_owned())
}

pub fn form<'a>(
    csrf: &'a str,
    user: &'a str,
    pw: &'a str,
    value: &'a str,
) -> [(&'static str, &'a str); 4] {
    [
        ("csrf", csrf),
        ("username", user),
        ("password", pw),
        ("value", value),
    ]
}

pub fn json_call(var: &str) -> serde_json::Value {
    serde_json::json!({"name": "getenv", "arguments": {"name": var}})
}

/// The value of the hidden field `name` in a page.
pub fn hidden(html: &str, name: &str) -> String {
    let needle = format!("name=\"{name}\" value=\"");
    let at = html
        .find(&needle)
        .unwrap_or_else(|| panic!("no {name} in {html}"))
        + needle.len();
    html[at..at + html[at..].find('"').unwrap()].to_owned()
}

/// A broker on `db` (links under `base`) with credential `tok` (a secret, "Service token")
/// and the storage key `[key; 32]`, for a test to connect values as the page would.
pub async fn secret_broker(
    db: &str,
    base: &str,
    key: u8,
) -> (
    std::sync::Arc<mcp_gateway::credentials::Broker>,
    mcp_gateway::database::Database,
) {
    use mcp_gateway::config::{
        CredentialKeys, CredentialSpec, CredentialsConfig, credential_config,
    };
    let defs = CredentialsConfig {
        keys: CredentialKeys {
            current: Some([key; 32]),
            previous: Vec::new(),
        },
        credentials: vec![
            credential_config(
                "tok",
                toml::from_str::<CredentialSpec>("kind = \"secret\"\nlabel = \"Service token\"")
                    .unwrap(),
                |_| None,
            )
            .unwrap(),
        ],
        secret_files: Vec::new(),
        remote_networks: Vec::new(),
    };
    let database = mcp_gateway::database::Database::connect(db).await.unwrap();
    (
        mcp_gateway::credentials::Broker::new(defs, database.credential_store(), base),
        database,
    )
}

/// [`secret_broker`] on `a`'s database.
pub async fn broker_of(
    a: &AuthGateway,
    key: u8,
) -> (
    std::sync::Arc<mcp_gateway::credentials::Broker>,
    mcp_gateway::database::Database,
) {
    secret_broker(&a.db, &a.base, key).await
}
