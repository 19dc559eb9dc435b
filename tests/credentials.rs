//! People's credentials (issue 41): kept sealed in the real databases (a SQLite file and
//! PostgreSQL), opened only for the person and the credential they were connected for, with
//! the storage key rotated; a database dump reveals no value.

mod common;

use std::sync::Arc;

use mcp_gateway::config::{CredentialKeys, CredentialSpec, CredentialsConfig, credential_config};
use mcp_gateway::credentials::{Broker, CredentialError, CredentialStore};
use mcp_gateway::database::Database;

const TOKEN: &str = "ghp_k33pTh1sS3cretAbCdEfGhIjKlMnOpQrSt";

fn config(current: u8, previous: &[u8]) -> CredentialsConfig {
    let spec = |text: &str| toml::from_str::<CredentialSpec>(text).unwrap();
    let env = |_: &str| None;
    CredentialsConfig {
        keys: CredentialKeys {
            current: Some([current; 32]),
            previous: previous.iter().map(|p| [*p; 32]).collect(),
        },
        credentials: vec![
            credential_config(
                "github",
                spec("kind = \"secret\"\nlabel = \"GitHub token\"\npattern = \"ghp_[A-Za-z0-9]{20,}\""),
                env,
            )
            .unwrap(),
            credential_config("jira", spec("kind = \"secret\""), env).unwrap(),
        ],
        secret_files: Vec::new(),
    }
}

async fn exercise(store: Arc<dyn CredentialStore>) {
    let broker = Broker::new(config(1, &[]), store.clone());
    assert!(broker.value("alice", "github").await.unwrap().is_none());
    // A value not of the credential's form is refused, and nothing is kept.
    assert!(matches!(
        broker
            .connect_secret("alice", "github", "not-a-token")
            .await,
        Err(CredentialError::Pattern(_))
    ));
    assert!(matches!(
        broker.connect_secret("alice", "github", "ghp_a\nb").await,
        Err(CredentialError::Malformed)
    ));
    assert!(store.get("alice", "github").await.unwrap().is_none());
    assert!(matches!(
        broker.connect_secret("alice", "nope", TOKEN).await,
        Err(CredentialError::Undefined(_))
    ));

    let c = broker
        .connect_secret("alice", "github", TOKEN)
        .await
        .unwrap();
    assert_eq!(
        (c.credential.as_str(), c.label.as_str()),
        ("github", "GitHub token")
    );
    broker
        .connect_secret("bob", "jira", "bobs-jira")
        .await
        .unwrap();
    assert_eq!(
        broker
            .value("alice", "github")
            .await
            .unwrap()
            .unwrap()
            .value,
        TOKEN
    );
    // Each person has only their own.
    assert!(broker.value("bob", "github").await.unwrap().is_none());
    assert!(broker.value("alice", "jira").await.unwrap().is_none());

    // A row moved to another person does not open for them.
    let mut stolen = store.get("alice", "github").await.unwrap().unwrap();
    assert!(!stolen.sealed.contains(TOKEN));
    stolen.subject = "mallory".into();
    store.put(&stolen).await.unwrap();
    assert!(matches!(
        broker.value("mallory", "github").await,
        Err(CredentialError::Sealed { .. })
    ));

    // What may be shown: names, subjects, times; never a value.
    let shown = serde_json::to_string(&broker.connections("alice").await.unwrap()).unwrap();
    assert!(
        shown.contains("\"github\"") && !shown.contains(TOKEN),
        "{shown}"
    );
    let who = broker.connected("github").await.unwrap();
    let subjects: Vec<&str> = who.iter().map(|c| c.subject.as_str()).collect();
    assert_eq!(subjects, ["alice", "mallory"]);

    // The key rotated: the old one still opens, and the value is sealed again under the new.
    let old = store.get("alice", "github").await.unwrap().unwrap().sealed;
    let rotated = Broker::new(config(2, &[1]), store.clone());
    assert_eq!(
        rotated
            .value("alice", "github")
            .await
            .unwrap()
            .unwrap()
            .value,
        TOKEN
    );
    let new = store.get("alice", "github").await.unwrap().unwrap().sealed;
    assert_ne!(old, new);
    // Now the old key is not needed for it; bob's, never used since, still needs it.
    let only_new = Broker::new(config(2, &[]), store.clone());
    assert_eq!(
        only_new
            .value("alice", "github")
            .await
            .unwrap()
            .unwrap()
            .value,
        TOKEN
    );
    assert!(matches!(
        only_new.value("bob", "jira").await,
        Err(CredentialError::Sealed { .. })
    ));

    assert_eq!(broker.disconnect(Some("alice"), "github").await.unwrap(), 1);
    assert!(broker.value("alice", "github").await.unwrap().is_none());
    assert_eq!(broker.disconnect(None, "github").await.unwrap(), 1);
    assert!(broker.connected("github").await.unwrap().is_empty());
}

#[tokio::test]
async fn credentials_are_sealed_in_a_sqlite_file_and_the_file_holds_no_value() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db?mode=rwc", dir.path().display());
    let db = Database::connect(&url).await.unwrap();
    exercise(db.credential_store()).await;
    // Alice's token was stored, read, sealed again and deleted; bob's is still there. No
    // file of the database holds either in the clear.
    let broker = Broker::new(config(1, &[]), db.credential_store());
    broker
        .connect_secret("carol", "github", TOKEN)
        .await
        .unwrap();
    drop(db);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        for secret in [TOKEN.as_bytes(), b"bobs-jira"] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret),
                "a value in the clear in the database's files"
            );
        }
    }
}

#[tokio::test]
async fn credentials_are_sealed_in_postgres() {
    let pg = common::Postgres::create("credentials");
    let db = Database::connect(&pg.url).await.unwrap();
    exercise(db.credential_store()).await;
}
