//! What the fuzz targets share: the built-in authorization server, set up once per fuzzing
//! process on an in-memory SQLite database, with a fixed signing key (so tokens in the seed
//! corpus stay valid across runs) and a few registered clients with known ids and secrets.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use mcp_gateway::auth::store::StoredKey;
use mcp_gateway::auth::{Auth, hash_secret};
use mcp_gateway::config::{AuthConfig, AuthMode};
use mcp_gateway::database::Database;

/// The public URL of `/mcp`: the tokens' audience; their issuer is its origin.
pub const PUBLIC_URL: &str = "https://gw.example.com/mcp";
pub const ISSUER: &str = "https://gw.example.com";
/// The signing key's id.
pub const KID: &str = "fuzz-key-1";
/// A P-256 key (PKCS#8 DER, base64url) made for the fuzz targets alone; it signs nothing else.
pub const PRIVATE_DER: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgGvMUw6HcIuasZQRsCTjtw9wcPxX1zdOEgg49l-hDUy6hRANCAARboj9MW_4pZTOVlpCap9liEXU02A8FF1oeL4w4z0wJWqceF4pvmYJs73qWwQkAADXGYcM3IhXxNR5BlXFZlRiq";

/// Registered clients: a public one, and confidential ones for HTTP Basic and for the form.
pub const PUBLIC_CLIENT: &str = "fuzz-public";
pub const BASIC_CLIENT: &str = "fuzz-basic";
pub const POST_CLIENT: &str = "fuzz-post";
/// The confidential clients' secret.
pub const SECRET: &str = "fuzz-secret";

pub struct Setup {
    pub runtime: tokio::runtime::Runtime,
    pub auth: Arc<Auth>,
}

/// The authorization server, made on first use.
pub fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let auth = runtime.block_on(async {
            let database = Database::connect("sqlite::memory:")
                .await
                .expect("in-memory SQLite");
            let store = database.auth_store();
            store
                .add_key(&StoredKey {
                    kid: KID.into(),
                    private_der: PRIVATE_DER.into(),
                    created_at: 0,
                    retired_at: None,
                })
                .await
                .expect("the key is stored");
            // As rows, so the targets do not depend on the shape of the store's `Client`.
            let grants = r#"["authorization_code","refresh_token","client_credentials"]"#;
            for (id, method, secret) in [
                (PUBLIC_CLIENT, "none", None),
                (BASIC_CLIENT, "client_secret_basic", Some(hash_secret(SECRET))),
                (POST_CLIENT, "client_secret_post", Some(hash_secret(SECRET))),
            ] {
                sqlx::query(
                    "INSERT INTO oauth_clients (client_id, secret_hash, name, redirect_uris, \
                     auth_method, grant_types, application_type, scope, created_at) \
                     VALUES ($1, $2, 'fuzz', '[\"https://client.example/cb\"]', $3, $4, 'web', NULL, 0)",
                )
                .bind(id)
                .bind(secret)
                .bind(method)
                .bind(grants)
                .execute(database.pool())
                .await
                .expect("a client is stored");
            }
            let config = AuthConfig {
                mode: AuthMode::Builtin,
                public_url: Some(PUBLIC_URL.parse().expect("a URL")),
                // Registrations are checked, then refused for the limit: the database does
                // not grow, and every run sees the same answers.
                registrations_per_minute: 0,
                access_ttl: Duration::from_secs(600),
                ..AuthConfig::default()
            };
            Auth::new(config, store).await.expect("the authorization server")
        });
        Setup {
            runtime,
            auth: Arc::new(auth),
        }
    })
}
