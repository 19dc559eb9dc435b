//! `[credentials]`'s checks: references, kinds, keys, and what plugins may refer to.
use super::*;
use crate::config::validate_plugin;

fn section(text: &str) -> CredentialsSection {
    toml::from_str(text).unwrap()
}

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

#[test]
fn references_are_read() {
    assert_eq!(
        references("Bearer ${credential:github} ${HOME} ${credential_file:a-b}").unwrap(),
        vec![
            Reference::Credential("github"),
            Reference::Env("HOME"),
            Reference::CredentialFile("a-b")
        ]
    );
    for bad in [
        "${credential:}",
        "${cred:x}",
        "${credential:a b}",
        "${x",
        "${}",
    ] {
        assert!(references(bad).is_err(), "{bad}");
    }
    let got = expand("t=${credential:gh};h=${HOME}", |r| {
        Ok(match r {
            Reference::Credential(n) => format!("<{n}>"),
            Reference::Env(n) => format!("[{n}]"),
            Reference::CredentialFile(_) => unreachable!(),
        })
    });
    assert_eq!(got.unwrap(), "t=<gh>;h=[HOME]");
}

#[test]
fn kinds_are_checked() {
    let env = |n: &str| (n == CREDENTIALS_KEY_ENV).then(|| KEY.to_owned());
    let c = credentials_config(
        section(
            r#"
            [github]
            kind = "oauth2"
            authorization_endpoint = "https://github.com/login/oauth/authorize"
            token_endpoint = "https://github.com/login/oauth/access_token"
            client_id = "Iv1.abc"
            scopes = ["repo"]

            [jira]
            kind = "secret"
            label = "Jira API token"
            pattern = "[A-Za-z0-9]{24}"

            [internal]
            kind = "token_exchange"
            issuer = "http://127.0.0.1:9000"
            client_id = "gateway"
            audience = "internal-api"
            "#,
        ),
        env,
    )
    .unwrap();
    assert_eq!(c.credentials.len(), 3);
    assert_eq!(c.keys.current.unwrap()[31], 0x1f);
    let CredentialKind::Secret { pattern: Some(p) } = &c.get("jira").unwrap().kind else {
        panic!("a secret with a pattern")
    };
    assert!(p.is_match("abcdefghijklmnopqrstuvwx"));
    assert!(!p.is_match("abcdefghijklmnopqrstuvwx-and-more"));
    assert!(matches!(
        c.get("github").unwrap().kind,
        CredentialKind::OAuth2 { pkce: true, .. }
    ));

    for (text, key) in [
        (
            "[a]\nkind = \"secret\"\nclient_id = \"x\"",
            "credentials.a.client_id",
        ),
        (
            "[a]\nkind = \"oauth2\"\nclient_id = \"x\"",
            "credentials.a.issuer",
        ),
        (
            "[a]\nkind = \"oauth2\"\nissuer = \"http://example.com\"\nclient_id = \"x\"",
            "credentials.a.issuer",
        ),
        (
            "[a]\nkind = \"oauth2\"\nissuer = \"https://x\"",
            "credentials.a.client_id",
        ),
        (
            "[a]\nkind = \"secret\"\npattern = \"(\"",
            "credentials.a.pattern",
        ),
        (
            "[a]\nkind = \"secret\"\naudience = \"x\"",
            "credentials.a.audience",
        ),
    ] {
        let e = credentials_config(section(text), env).unwrap_err();
        assert!(e.to_string().contains(key), "{text}: {e}");
    }
    assert!(
        toml::from_str::<CredentialsSection>("[a]\nkind = \"secret\"\nsecret = \"x\"").is_err()
    );
    // A setting's name is no credential's.
    assert!(toml::from_str::<CredentialsSection>("[key_env]\nkind = \"secret\"").is_err());
    let e = credential_config(
        "key_file",
        section("[a]\nkind = \"secret\"").credentials["a"].clone(),
        env,
    )
    .unwrap_err();
    assert!(e.to_string().contains("credentials.key_file"), "{e}");
}

#[test]
fn credentials_need_a_key() {
    let e = credentials_config(section("[a]\nkind = \"secret\""), |_| None).unwrap_err();
    assert!(e.to_string().contains("credentials.key_file"), "{e}");
    // No credential, no key needed.
    assert!(credentials_config(section(""), |_| None).is_ok());
    let e = credentials_config(section("key_env = \"K\""), |_| None).unwrap_err();
    assert!(e.to_string().contains("`K` is not set"), "{e}");
    let e = credentials_config(section(""), |_| Some("short".into())).unwrap_err();
    assert!(e.to_string().contains("32 bytes"), "{e}");
}

#[test]
fn keys_are_hex_or_base64() {
    let hex = parse_key(KEY).unwrap();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(hex);
    assert_eq!(parse_key(&format!("{b64}\n")).unwrap(), hex);
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xfb; 32]);
    assert_eq!(parse_key(&url).unwrap(), [0xfb; 32]);
    assert!(parse_key(&KEY[..62]).is_err());
    assert!(
        format!(
            "{:?}",
            CredentialKeys {
                current: Some(hex),
                previous: vec![]
            }
        )
        .contains("set")
    );
    assert!(
        !format!(
            "{:?}",
            CredentialKeys {
                current: Some(hex),
                previous: vec![]
            }
        )
        .contains("1f")
    );
}

#[test]
fn credentials_are_defined_and_used_by_one_person_s_process() {
    let defined = ["gh".to_owned()];
    let mut p = PluginConfig::new("a", "x", vec!["--token=${credential:gh}".into()]);
    p.env.insert("FILE".into(), "${credential_file:gh}".into());
    assert!(validate_plugin(&p, "__", &defined).is_ok());
    assert_eq!(
        crate::config::credentials_used(&p)
            .into_iter()
            .collect::<Vec<_>>(),
        ["gh"]
    );

    let e = validate_plugin(&p, "__", &[]).unwrap_err().to_string();
    assert!(
        e.contains("plugins.a.env.FILE") && e.contains("[credentials.gh]"),
        "{e}"
    );
    p.env.clear();
    let e = validate_plugin(&p, "__", &[]).unwrap_err().to_string();
    assert!(e.contains("plugins.a.args[0]"), "{e}");
    p.env.insert("FILE".into(), "${credential_file:gh}".into());

    let mut shared = p.clone();
    shared.process_model = ProcessModel::Shared;
    let e = validate_plugin(&shared, "__", &defined)
        .unwrap_err()
        .to_string();
    assert!(e.contains("plugins.a.process_model"), "{e}");

    let mut warm = p.clone();
    warm.warm = 2;
    let e = validate_plugin(&warm, "__", &defined)
        .unwrap_err()
        .to_string();
    assert!(e.contains("plugins.a.warm"), "{e}");

    let mut unsandboxed = p.clone();
    unsandboxed.sandbox = None;
    let e = validate_plugin(&unsandboxed, "__", &defined)
        .unwrap_err()
        .to_string();
    assert!(e.contains("plugins.a.sandbox"), "{e}");

    let mut bad = PluginConfig::new("a", "x", vec![]);
    bad.env.insert("T".into(), "${credential:}".into());
    let e = validate_plugin(&bad, "__", &defined)
        .unwrap_err()
        .to_string();
    assert!(e.contains("plugins.a.env.T"), "{e}");
}
