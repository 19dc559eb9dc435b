//! `[audit]`: the audit log, one record per `tools/call`, `prompts/get`, `resources/read` and
//! admin action. On by default; `include_arguments` keeps a call's arguments in the record
//! (otherwise only their keyed hash), `retention_days` says how long the database keeps
//! records. Checked here at load: the retention is at least a day and at most ten years.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// How long records are kept unless `retention_days` says otherwise.
pub const DEFAULT_RETENTION_DAYS: u64 = 30;

/// `[audit]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    pub enabled: Option<bool>,
    pub include_arguments: Option<bool>,
    pub retention_days: Option<u64>,
}

/// The audit log's settings.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// Off: no record is made, written or kept.
    pub enabled: bool,
    /// A call's arguments go into its record as sent; without it, only an HMAC of them (with
    /// a key the replicas share), so equal arguments can be matched but not read.
    pub include_arguments: bool,
    /// Records older than this are deleted from the database.
    pub retention: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            enabled: true,
            include_arguments: false,
            retention: Duration::from_secs(DEFAULT_RETENTION_DAYS * 86_400),
        }
    }
}

pub fn audit_config(section: AuditSection) -> Result<AuditConfig, ConfigError> {
    let days = section.retention_days.unwrap_or(DEFAULT_RETENTION_DAYS);
    if !(1..=3650).contains(&days) {
        return Err(invalid(
            "audit.retention_days",
            "must be between 1 and 3650 days",
        ));
    }
    Ok(AuditConfig {
        enabled: section.enabled.unwrap_or(true),
        include_arguments: section.include_arguments.unwrap_or(false),
        retention: Duration::from_secs(days * 86_400),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_is_bounded_and_defaults_hold() {
        let d = audit_config(AuditSection::default()).unwrap();
        assert!(d.enabled && !d.include_arguments);
        assert_eq!(d.retention, Duration::from_secs(30 * 86_400));
        for bad in [0, 3651] {
            let e = audit_config(AuditSection {
                retention_days: Some(bad),
                ..Default::default()
            })
            .unwrap_err();
            assert!(e.to_string().contains("audit.retention_days"), "{e}");
        }
    }
}
