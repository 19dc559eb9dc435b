//! What a modern request says about itself in `params._meta` ([`RequestMeta`]): its version,
//! the capabilities and extensions it declares, its log level and client, read with the
//! fields its headers mirror (`name`, `uri`, `taskId`) and whether a task hint (`task`) is
//! there, in one pass over the params. The era
//! decision ([`crate::protocol::era`]) calls [`read_declared`]; what is wrong with a `_meta`
//! becomes [`ModernError::InvalidMeta`].

use std::collections::HashMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::{ModernError, TASKS_EXTENSION};
use crate::jsonrpc::Object;

/// What a modern request says about itself in `_meta`.
#[derive(Debug, Clone, Default)]
pub struct RequestMeta {
    pub version: String,
    /// The capabilities the client declared, raw: a plugin's request is checked against it.
    pub capabilities_raw: Option<Box<RawValue>>,
    /// The params' `name`, `uri` and `taskId`, where they are strings (what `Mcp-Name`
    /// mirrors, by method).
    pub name: Option<String>,
    pub uri: Option<String>,
    pub task_id: Option<String>,
    /// The params carry `task` (a 2025-11-25 task hint; the routing of a `tools/call` reads
    /// this instead of the params again).
    pub task_hint: bool,
    /// The level at or above which this request's log messages are wanted; none without.
    pub log_level: Option<String>,
    /// The extensions the client declared (`clientCapabilities.extensions`), by identifier.
    pub extensions: Vec<String>,
    /// The client's `clientInfo` as a label ([`crate::protocol::client_label`]), when it sent one.
    pub client: Option<String>,
}

impl RequestMeta {
    /// Whether the request declares the tasks extension.
    pub fn tasks(&self) -> bool {
        self.extensions.iter().any(|e| e == TASKS_EXTENSION)
    }
}

/// A request's params, for what its `_meta` is when it is no object.
#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow, rename = "_meta")]
    meta: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(borrow, rename = "io.modelcontextprotocol/protocolVersion")]
    version: Option<&'a RawValue>,
    #[serde(borrow, rename = "io.modelcontextprotocol/clientCapabilities")]
    capabilities: Option<&'a RawValue>,
    #[serde(borrow, rename = "io.modelcontextprotocol/logLevel")]
    log_level: Option<&'a RawValue>,
    #[serde(borrow, rename = "io.modelcontextprotocol/clientInfo")]
    client_info: Option<&'a RawValue>,
}

/// A JSON string's value, or `None` for any other JSON value. Most strings have no escape
/// and are copied as they are; the others are decoded.
fn string_value(raw: &RawValue) -> Option<String> {
    let text = raw.get();
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(plain) if !plain.contains('\\') => Some(plain.to_owned()),
        _ => serde_json::from_str(text).ok(),
    }
}

/// The modern version a request's params declare, if they declare one (the era test: a
/// request carrying it is modern, whatever its method).
pub fn declared_version(params: Option<&RawValue>) -> Option<String> {
    // One pass over the params: `_meta` read as it is met, only its version kept.
    #[derive(Deserialize)]
    struct Version<'a> {
        #[serde(borrow, rename = "io.modelcontextprotocol/protocolVersion")]
        version: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct WithMeta<'a> {
        #[serde(borrow, rename = "_meta")]
        meta: Option<Object<Version<'a>>>,
    }
    let Object(params) = serde_json::from_str::<Object<WithMeta>>(params?.get()).ok()?;
    serde_json::from_str::<String>(params.meta?.0.version?.get()).ok()
}

/// A request's params read in one pass: `_meta`'s members and the fields the headers mirror.
#[derive(Deserialize)]
struct WithMeta<'a> {
    #[serde(borrow, rename = "_meta")]
    meta: Option<Object<Meta<'a>>>,
    #[serde(borrow)]
    name: Option<&'a RawValue>,
    #[serde(borrow)]
    uri: Option<&'a RawValue>,
    #[serde(borrow, rename = "taskId")]
    task_id: Option<&'a RawValue>,
    task: Option<IgnoredAny>,
}

/// The era test and the reading of `_meta` in one pass over the params: `None` when they
/// declare no modern version (their `_meta` is no object, or has no version string); else
/// the request's `_meta` read, or what is wrong with it. The era decision
/// ([`super::era::classify`]) calls this, and the modern handler uses what it read.
pub fn read_declared(params: Option<&RawValue>) -> Option<Result<RequestMeta, ModernError>> {
    let text = params?.get();
    match serde_json::from_str::<Object<WithMeta>>(text) {
        Ok(Object(mut p)) => {
            let meta = p.meta.take()?.0;
            let version = string_value(meta.version?)?;
            Some(finish_meta(meta, version, &p))
        }
        // Params that do not read as a whole (a member given twice, say) whose `_meta` still
        // declares a version: modern, and refused for them.
        Err(_) => declared_version(params).map(|_| Err(why_not_read(text))),
    }
}

/// Reads `_meta` of a modern request, whatever told its era: what [`read_declared`] read, or
/// what is wrong with it.
pub fn read_meta(params: Option<&RawValue>) -> Result<RequestMeta, ModernError> {
    read_declared(params).unwrap_or_else(|| Err(undeclared(params)))
}

/// Why the `_meta` of a request that [`read_declared`] found declaring no version is refused
/// (its era was told by other signs).
pub fn undeclared(params: Option<&RawValue>) -> ModernError {
    params.map_or_else(
        || ModernError::InvalidMeta("params._meta is required".into()),
        |p| why_not_read(p.get()),
    )
}

/// What is wrong with params whose `_meta` could not be read.
fn why_not_read(params: &str) -> ModernError {
    let bad = |what: &str| ModernError::InvalidMeta(what.to_owned());
    match serde_json::from_str::<Object<WithMeta>>(params) {
        Ok(Object(p)) => match p.meta {
            None => bad("params._meta is required"),
            Some(_) => bad("_meta[\"io.modelcontextprotocol/protocolVersion\"] must be a string"),
        },
        Err(e) => match serde_json::from_str::<Object<Params>>(params) {
            Err(_) => bad("params must be an object"),
            Ok(Object(p)) => match p.meta {
                None => bad("params._meta is required"),
                // An object `_meta` in params that do not read: a member given twice, say.
                Some(m) if m.get().starts_with('{') => {
                    ModernError::InvalidMeta(format!("params could not be read: {e}"))
                }
                Some(_) => bad("params._meta must be an object"),
            },
        },
    }
}

/// The rest of `_meta` read, once its version is.
fn finish_meta(
    meta: Meta<'_>,
    version: String,
    p: &WithMeta<'_>,
) -> Result<RequestMeta, ModernError> {
    let bad = |what: &str| ModernError::InvalidMeta(what.to_owned());
    let string = |v: Option<&RawValue>| v.and_then(string_value);
    // Required on every request, `{}` when the client declares nothing.
    #[derive(Deserialize)]
    struct Declared<'a> {
        #[serde(borrow)]
        extensions: Option<&'a RawValue>,
    }
    let declared = meta
        .capabilities
        .filter(|raw| raw.get().starts_with('{'))
        .and_then(|raw| serde_json::from_str::<Declared>(raw.get()).ok())
        .ok_or_else(|| {
            bad("_meta[\"io.modelcontextprotocol/clientCapabilities\"] must be an object")
        })?;
    let extensions = match declared.extensions {
        None => Vec::new(),
        Some(e) => serde_json::from_str::<HashMap<String, IgnoredAny>>(e.get())
            .map_err(|_| bad("clientCapabilities.extensions must be an object"))?
            .into_keys()
            .collect(),
    };
    let log_level = match meta.log_level {
        None => None,
        Some(l) => {
            let l = string_value(l).ok_or_else(|| {
                bad("_meta[\"io.modelcontextprotocol/logLevel\"] must be a string")
            })?;
            if !crate::protocol::LOG_LEVELS.contains(&l.as_str()) {
                return Err(bad(
                    "_meta[\"io.modelcontextprotocol/logLevel\"] is not a log level",
                ));
            }
            Some(l)
        }
    };
    Ok(RequestMeta {
        version,
        capabilities_raw: meta.capabilities.map(RawValue::to_owned),
        name: string(p.name),
        uri: string(p.uri),
        task_id: string(p.task_id),
        task_hint: p.task.is_some(),
        log_level,
        extensions,
        client: meta.client_info.and_then(crate::protocol::client_label),
    })
}
