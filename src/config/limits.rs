//! `[limits]`: rate limits on the calls that reach plugins (`tools/call`, `prompts/get`,
//! `resources/read`), each a token bucket per caller (the token's subject, or the client
//! address when authorization is off). `per_subject` counts every such call of a caller;
//! each `[[limits.rules]]` entry counts the calls to the plugins, or of the tools, its pattern
//! names. Checked here at load: rates are `N/s`, `N/min` or `N/h` with N ≥ 1, bursts ≥ 1,
//! a rule names exactly one of `plugin` and `tool`, and no two rules share a name.

use std::time::Duration;

use serde::Deserialize;

use super::access::pattern_matches;
use super::{ConfigError, invalid};

/// Most callers each limit keeps a bucket for, by default (see [`LimitsConfig::max_keys`]).
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// `[limits]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub per_subject: Option<RateSpec>,
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    pub max_keys: Option<usize>,
}

/// `{ rate = "100/min", burst = 20 }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSpec {
    pub rate: String,
    pub burst: Option<u32>,
}

/// One `[[limits.rules]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub plugin: Option<String>,
    pub tool: Option<String>,
    pub rate: String,
    pub burst: Option<u32>,
}

/// The limits in force.
#[derive(Debug, Clone, Default)]
pub struct LimitsConfig {
    pub rules: Vec<LimitRule>,
    /// Most callers one limit keeps a bucket for: when full, idle callers' buckets are
    /// dropped, and callers beyond that share one bucket.
    pub max_keys: usize,
}

/// What a limit counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    /// Every counted call.
    All,
    /// Calls routed to a plugin whose name matches the pattern (`*` matches any run).
    Plugin(String),
    /// `tools/call`s of a tool whose name (as clients see it) matches the pattern.
    Tool(String),
}

/// One limit: a token bucket per caller.
#[derive(Debug, Clone)]
pub struct LimitRule {
    /// `subject`, `plugin:<pattern>` or `tool:<pattern>`: in errors, metrics and the admin API.
    pub name: String,
    pub matcher: Matcher,
    /// `count` calls per `per`, in bursts of at most `burst`.
    pub count: u32,
    pub per: Per,
    pub burst: u32,
}

/// The period of a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Per {
    Second,
    Minute,
    Hour,
}

impl Per {
    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Per::Second => 1,
            Per::Minute => 60,
            Per::Hour => 3600,
        })
    }

    pub fn word(self) -> &'static str {
        match self {
            Per::Second => "second",
            Per::Minute => "minute",
            Per::Hour => "hour",
        }
    }
}

impl LimitRule {
    /// The time one token takes to come back.
    pub fn interval(&self) -> Duration {
        self.per.duration() / self.count
    }

    /// `10 calls per minute`.
    pub fn describe(&self) -> String {
        let calls = if self.count == 1 { "call" } else { "calls" };
        format!("{} {calls} per {}", self.count, self.per.word())
    }

    /// Whether this limit counts a call of `method` routed to `plugin` (`tool`: the name
    /// of a `tools/call`'s tool).
    pub fn applies(&self, plugin: Option<&str>, tool: Option<&str>) -> bool {
        match &self.matcher {
            Matcher::All => true,
            Matcher::Plugin(p) => plugin.is_some_and(|n| pattern_matches(p, n)),
            Matcher::Tool(p) => tool.is_some_and(|n| pattern_matches(p, n)),
        }
    }
}

/// `100/min` → (100, minute).
fn parse_rate(key: &str, rate: &str) -> Result<(u32, Per), ConfigError> {
    let bad = || {
        invalid(
            key,
            format!(
                "`{rate}` is not a rate: write N/s, N/min or N/h with N at least 1, e.g. \"100/min\""
            ),
        )
    };
    let (n, per) = rate.split_once('/').ok_or_else(bad)?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    let per = match per.trim() {
        "s" | "sec" | "second" => Per::Second,
        "m" | "min" | "minute" => Per::Minute,
        "h" | "hour" => Per::Hour,
        _ => return Err(bad()),
    };
    Ok((n, per))
}

fn rule(
    key: &str,
    name: String,
    matcher: Matcher,
    rate: &str,
    burst: Option<u32>,
) -> Result<LimitRule, ConfigError> {
    let (count, per) = parse_rate(&format!("{key}.rate"), rate)?;
    let burst = match burst {
        Some(0) => return Err(invalid(format!("{key}.burst"), "must be at least 1")),
        Some(b) => b,
        None => count,
    };
    Ok(LimitRule {
        name,
        matcher,
        count,
        per,
        burst,
    })
}

/// The `[limits]` section, checked.
pub fn limits_config(section: LimitsSection) -> Result<LimitsConfig, ConfigError> {
    let mut rules = Vec::new();
    if let Some(s) = section.per_subject {
        rules.push(rule(
            "limits.per_subject",
            "subject".into(),
            Matcher::All,
            &s.rate,
            s.burst,
        )?);
    }
    for (i, r) in section.rules.into_iter().enumerate() {
        let key = format!("limits.rules[{i}]");
        let (name, matcher) = match (r.plugin, r.tool) {
            (Some(p), None) if !p.is_empty() => (format!("plugin:{p}"), Matcher::Plugin(p)),
            (None, Some(t)) if !t.is_empty() => (format!("tool:{t}"), Matcher::Tool(t)),
            (Some(_), Some(_)) => {
                return Err(invalid(
                    key,
                    "a rule limits either `plugin` or `tool`, not both: write two rules",
                ));
            }
            _ => {
                return Err(invalid(
                    key,
                    "a rule needs a non-empty `plugin` or `tool` pattern (`*` matches any run)",
                ));
            }
        };
        if rules.iter().any(|x: &LimitRule| x.name == name) {
            return Err(invalid(key, format!("`{name}` is limited twice")));
        }
        rules.push(rule(&key, name, matcher, &r.rate, r.burst)?);
    }
    let max_keys = section.max_keys.unwrap_or(DEFAULT_MAX_KEYS);
    if max_keys == 0 {
        return Err(invalid("limits.max_keys", "must be at least 1"));
    }
    Ok(LimitsConfig { rules, max_keys })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(pattern_matches("fs", "fs"));
        assert!(!pattern_matches("fs", "fsx"));
        assert!(pattern_matches("fs*", "fsx"));
        assert!(pattern_matches("*__write*", "fs__write_file"));
        assert!(!pattern_matches("*__write*", "fs__read"));
        assert!(pattern_matches("*", ""));
        assert!(pattern_matches("a*a", "aa"));
        assert!(!pattern_matches("a*a", "a"));
    }

    fn section(text: &str) -> Result<LimitsConfig, String> {
        let s: LimitsSection = toml::from_str(text).map_err(|e| e.to_string())?;
        limits_config(s).map_err(|e| e.to_string())
    }

    #[test]
    fn rules_parse_and_are_checked() {
        let c = section(
            "per_subject = { rate = \"100/min\", burst = 20 }\n\
             [[rules]]\nplugin = \"fs\"\nrate = \"10/min\"\n\
             [[rules]]\ntool = \"*__write*\"\nrate = \"2/s\"\n",
        )
        .unwrap();
        let names: Vec<_> = c.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["subject", "plugin:fs", "tool:*__write*"]);
        assert_eq!(c.rules[0].burst, 20);
        assert_eq!(c.rules[1].burst, 10);
        assert_eq!(c.rules[1].describe(), "10 calls per minute");
        assert_eq!(c.rules[2].interval(), Duration::from_millis(500));

        let e = section("per_subject = { rate = \"0/min\" }").unwrap_err();
        assert!(e.contains("limits.per_subject.rate"), "{e}");
        let e = section("per_subject = { rate = \"5 per minute\" }").unwrap_err();
        assert!(e.contains("not a rate"), "{e}");
        let e = section("[[rules]]\nrate = \"1/s\"\n").unwrap_err();
        assert!(e.contains("limits.rules[0]"), "{e}");
        let e = section("[[rules]]\nplugin = \"a\"\ntool = \"b\"\nrate = \"1/s\"\n").unwrap_err();
        assert!(e.contains("not both"), "{e}");
        let e = section("[[rules]]\nplugin = \"a\"\nrate = \"1/s\"\n[[rules]]\nplugin = \"a\"\nrate = \"2/s\"\n")
            .unwrap_err();
        assert!(e.contains("limited twice"), "{e}");
        let e = section("per_subject = { rate = \"1/s\", burst = 0 }").unwrap_err();
        assert!(e.contains("burst"), "{e}");
        let e = section("per_subjects = { rate = \"1/s\" }").unwrap_err();
        assert!(e.contains("per_subjects"), "{e}");
    }
}
