//! Tests of `config/plugin.rs`: plugin definitions, their wire forms and checks.
use super::*;
use crate::config::tests::cli;
use crate::config::{Config, FileConfig};

#[test]
fn prefixes_must_differ() {
    let mut b = PluginConfig::new("b", "y", vec![]);
    b.prefix = Some("a".into());
    let file = FileConfig {
        plugins: vec![PluginConfig::new("a", "x", vec![]), b],
        ..FileConfig::default()
    };
    let e = Config::merge(&cli(&[]), file).unwrap_err();
    assert!(e.to_string().contains("plugins.b.prefix"), "{e}");
}

#[test]
fn a_person_s_credential_needs_to_know_the_person() {
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), "01".repeat(32)).unwrap();
    let text = format!(
        "[credentials]\nkey_file = \"{}\"\n[credentials.gh]\nkind = \"secret\"\n\
         [plugins.a]\ncommand = \"x\"\nenv = {{ T = \"${{credential:gh}}\" }}\n",
        key.path().display()
    );
    let file = FileConfig::parse(&text).unwrap();
    let e = Config::merge(&cli(&[]), file).unwrap_err().to_string();
    assert!(e.contains("plugins.a") && e.contains("auth.mode"), "{e}");
}

#[test]
fn tool_filters() {
    let mut p = PluginConfig::new("a", "x", vec![]);
    assert!(p.allows_tool("any") && !p.filters_tools());
    p.tools_deny = vec!["rm".into()];
    assert!(!p.allows_tool("rm") && p.allows_tool("ls"));
    p.tools_allow = Some(vec!["ls".into(), "rm".into()]);
    assert!(p.allows_tool("ls") && !p.allows_tool("rm") && !p.allows_tool("cat"));
}

#[test]
fn access_rules() {
    let mut p = PluginConfig::new("a", "x", vec![]);
    let set = |g: &[&str]| g.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
    let none = set(&[]);
    assert!(!p.restricts_callers() && p.access.admits("anyone", &none));
    p.access.allow_groups = vec!["eng".into()];
    p.access.allow_subjects = vec!["carol".into()];
    assert!(p.access.admits("bob", &set(&["ops", "eng"])));
    assert!(p.access.admits("carol", &none));
    assert!(!p.access.admits("bob", &set(&["ops"])));
    p.tool_access = vec![
        ToolAccess {
            tools: vec!["delete_*".into(), "drop".into()],
            allow_groups: vec!["admins".into()],
            allow_subjects: vec![],
        },
        ToolAccess {
            tools: vec!["*".into()],
            allow_groups: vec!["eng".into()],
            allow_subjects: vec![],
        },
    ];
    assert_eq!(
        p.tools_denied_to("bob", &set(&["eng"])),
        ["delete_*", "drop"]
    );
    assert!(
        p.tools_denied_to("root", &set(&["eng", "admins"]))
            .is_empty()
    );
    let check = |p: &PluginConfig| validate_plugin(p, "__", &[]);
    assert!(check(&p).is_ok());
    let mut q = p.clone();
    q.tool_access[0].allow_groups.clear();
    assert!(
        check(&q)
            .unwrap_err()
            .to_string()
            .contains("tool_access[0]")
    );
    let mut q = p.clone();
    q.tool_access[1].tools = vec!["a b".into()];
    assert!(
        check(&q)
            .unwrap_err()
            .to_string()
            .contains("tool name pattern")
    );
    let mut q = p.clone();
    q.access.allow_groups = vec![String::new()];
    assert!(check(&q).unwrap_err().to_string().contains("allow_groups"));
    // Stored and shown as written.
    let spec = PluginSpec::from_config(&p);
    let back = serde_json::from_value::<PluginSpec>(serde_json::to_value(&spec).unwrap())
        .unwrap()
        .into_config("a".into());
    assert_eq!(back.access, p.access);
    assert_eq!(back.tool_access, p.tool_access);
    let toml_spec: PluginSpec = toml::from_str(
        "command = \"x\"\nallow_groups = [\"eng\"]\n[[tool_access]]\ntools = [\"rm\"]\nallow_subjects = [\"root\"]\n",
    )
    .unwrap();
    let c = toml_spec.into_config("t".into());
    assert_eq!(c.access.allow_groups, ["eng"]);
    assert_eq!(c.tool_access[0].allow_subjects, ["root"]);
}

#[test]
fn the_era_is_probed_unless_pinned() {
    let spec = |text: &str| toml::from_str::<PluginSpec>(text);
    let pinned = spec("command = \"x\"\nera = \"modern\"").unwrap();
    assert_eq!(pinned.into_config("p".into()).era, PluginEra::Modern);
    assert_eq!(spec("command = \"x\"").unwrap().era, PluginEra::Auto);
    assert!(spec("command = \"x\"\nera = \"ancient\"").is_err());
    // Written only when pinned: definitions stored before it existed read the same.
    let mut c = PluginConfig::new("p", "x", vec![]);
    let stored = serde_json::to_value(PluginSpec::from_config(&c)).unwrap();
    assert!(stored.get("era").is_none(), "{stored}");
    c.era = PluginEra::Legacy;
    let stored = serde_json::to_value(PluginSpec::from_config(&c)).unwrap();
    assert_eq!(stored["era"], "legacy");
}

#[test]
fn env_references_expand() {
    let lookup = |n: &str| (n == "TOKEN").then(|| "s3cret".to_owned());
    assert_eq!(expand_env("${TOKEN}", lookup).unwrap(), "s3cret");
    assert_eq!(
        expand_env("Bearer ${TOKEN}!", lookup).unwrap(),
        "Bearer s3cret!"
    );
    assert_eq!(expand_env("plain", lookup).unwrap(), "plain");
    assert!(
        expand_env("${MISSING}", lookup)
            .unwrap_err()
            .contains("MISSING")
    );
    assert!(expand_env("${TOKEN", lookup).is_err());
    assert!(expand_env("${A-B}", lookup).is_err());
    // A person's credential is never expanded where there is no person.
    assert!(
        expand_env("${credential:gh}", lookup)
            .unwrap_err()
            .contains("serves no one person")
    );
}
