//! What a modern request says about itself in `params._meta` ([`RequestMeta`]): its version,
//! the capabilities and extensions it declares, its log level and client, read with the
//! fields its headers mirror (`name`, `uri`, `taskId`), whether a task hint (`task`) is
//! there, and where its `arguments` are, in one pass over the params. The era
//! decision ([`crate::protocol::era`]) calls [`read_declared`]; what is wrong with a `_meta`
//! becomes [`ModernError::InvalidMeta`].
//!
//! A client sends the same `_meta` with every request, and what a `_meta` declares depends on
//! its text alone, so what was read from a text is kept ([`Declared`], a bounded table of
//! recent texts) and a request that repeats it is not read for it again.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, LazyLock, RwLock};

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::{ModernError, TASKS_EXTENSION};
use crate::jsonrpc::{Object, scan};

/// What a `_meta` declares: read from its text alone, so the same text always reads the same.
#[derive(Debug, Default)]
pub struct Declared {
    pub version: String,
    /// The capabilities the client declared, raw: a plugin's request is checked against it.
    pub capabilities_raw: Option<Box<RawValue>>,
    /// The level at or above which this request's log messages are wanted; none without.
    pub log_level: Option<String>,
    /// The extensions the client declared (`clientCapabilities.extensions`), by identifier.
    pub extensions: Vec<String>,
    /// The client's `clientInfo` as a label ([`crate::protocol::client_label`]), when it sent one.
    pub client: Option<String>,
}

/// What a modern request says about itself in `_meta`, and the members of its params that
/// the gateway reads before it is routed.
#[derive(Debug, Clone, Default)]
pub struct RequestMeta {
    /// What its `_meta` declares (shared by the requests that sent the same `_meta`).
    pub declared: Arc<Declared>,
    /// The params' `name`, `uri` and `taskId`, where they are strings (what `Mcp-Name`
    /// mirrors, by method).
    pub name: Option<String>,
    pub uri: Option<String>,
    pub task_id: Option<String>,
    /// The params carry `task` (a 2025-11-25 task hint; the routing of a `tools/call` reads
    /// this instead of the params again).
    pub task_hint: bool,
    /// Where the params' `arguments` are in the params' text, when they have them (the audit
    /// log reads them there instead of reading the params again).
    pub arguments: Option<Range<usize>>,
    /// The params may carry `requestState` or `inputResponses` (a multi round-trip request's
    /// retry, or answers given ahead): false only where the reading found neither.
    pub retry_members: bool,
}

impl RequestMeta {
    /// Whether the request declares the tasks extension.
    pub fn tasks(&self) -> bool {
        self.declared
            .extensions
            .iter()
            .any(|e| e == TASKS_EXTENSION)
    }

    /// The params' `arguments`, raw, out of `params` (the params this was read from).
    pub fn arguments<'p>(&self, params: Option<&'p RawValue>) -> Option<&'p str> {
        params?.get().get(self.arguments.clone()?)
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
fn string_value(text: &str) -> Option<String> {
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

/// A request's params read by serde: `_meta` as it is, the fields the headers mirror, and
/// the arguments (where [`Members::scanned`] gives up).
#[derive(Deserialize)]
struct WithMeta<'a> {
    #[serde(borrow, rename = "_meta")]
    meta: Option<&'a RawValue>,
    #[serde(borrow)]
    name: Option<&'a RawValue>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow)]
    uri: Option<&'a RawValue>,
    #[serde(borrow, rename = "taskId")]
    task_id: Option<&'a RawValue>,
    task: Option<IgnoredAny>,
}

/// The members of a request's params that [`read_declared`] reads, as their JSON text (a
/// slice of the params').
#[derive(Default)]
struct Members<'a> {
    meta: Option<&'a str>,
    name: Option<&'a str>,
    arguments: Option<&'a str>,
    uri: Option<&'a str>,
    task_id: Option<&'a str>,
    task: bool,
    /// `requestState` or `inputResponses` may be there.
    retry_members: bool,
}

impl<'a> Members<'a> {
    /// Found by a scan of the params' text ([`scan`]): `None` where the scan gives up, or a
    /// member read here is given twice (serde's reading then says so).
    fn scanned(text: &'a str) -> Option<Members<'a>> {
        let mut m = Members::default();
        let mut refused = false;
        scan::object_members(text.as_bytes(), |name, value| {
            let (Some(name), Some(value)) = (text.get(name), text.get(value)) else {
                refused = true;
                return;
            };
            let slot = match name {
                "_meta" => &mut m.meta,
                "name" => &mut m.name,
                "arguments" => &mut m.arguments,
                "uri" => &mut m.uri,
                "taskId" => &mut m.task_id,
                "task" => {
                    refused |= std::mem::replace(&mut m.task, true);
                    return;
                }
                "requestState" | "inputResponses" => {
                    m.retry_members = true;
                    return;
                }
                _ => return,
            };
            refused |= slot.replace(value).is_some();
        })?;
        (!refused).then_some(m)
    }

    /// Read by serde: what a scan left; `None` for params that do not read (no object, a
    /// member given twice).
    fn read(text: &'a str) -> Option<Members<'a>> {
        let Object(p) = serde_json::from_str::<Object<WithMeta>>(text).ok()?;
        let get = |v: Option<&'a RawValue>| v.map(RawValue::get);
        Some(Members {
            meta: get(p.meta),
            name: get(p.name),
            arguments: get(p.arguments),
            uri: get(p.uri),
            task_id: get(p.task_id),
            task: p.task.is_some(),
            // Not looked for here.
            retry_members: true,
        })
    }
}

/// The era test and the reading of `_meta` in one pass over the params: `None` when they
/// declare no modern version (their `_meta` is no object, or has no version string); else
/// the request's `_meta` read, or what is wrong with it. The era decision
/// ([`super::era::classify`]) calls this, and the modern handler uses what it read.
pub fn read_declared(params: Option<&RawValue>) -> Option<Result<RequestMeta, ModernError>> {
    let text = params?.get();
    let unreadable = || declared_version(params).map(|_| Err(why_not_read(text)));
    // Params that do not read as a whole (a member given twice, say) whose `_meta` still
    // declares a version: modern, and refused for them.
    let Some(p) = Members::scanned(text).or_else(|| Members::read(text)) else {
        return unreadable();
    };
    let meta = p.meta?;
    if !meta.starts_with('{') {
        return None;
    }
    let declared = match known(meta) {
        Some(d) => d,
        None => {
            let Ok(Object(m)) = serde_json::from_str::<Object<Meta>>(meta) else {
                return unreadable();
            };
            let version = string_value(m.version?.get())?;
            match declare(m, version) {
                Ok(d) => remember(meta, d),
                Err(e) => return Some(Err(e)),
            }
        }
    };
    let string = |v: Option<&str>| v.and_then(string_value);
    Some(Ok(RequestMeta {
        declared,
        name: string(p.name),
        uri: string(p.uri),
        task_id: string(p.task_id),
        task_hint: p.task,
        // A slice of `text`.
        arguments: p.arguments.map(|a| {
            let start = a.as_ptr() as usize - text.as_ptr() as usize;
            start..start + a.len()
        }),
        retry_members: p.retry_members,
    }))
}

/// The `_meta` texts read lately, and what each declares. Bounded in count and in the length
/// of a text kept; emptied when full (a client repeats its own `_meta`, so the texts in use
/// come back at their next request).
static DECLARED: LazyLock<RwLock<Kept>> = LazyLock::new(Default::default);

/// `_meta` texts and what each declares.
type Kept = HashMap<Box<str>, Arc<Declared>, foldhash::fast::RandomState>;

/// How many `_meta` texts [`DECLARED`] keeps, and the longest it keeps.
const KEPT_METAS: usize = 256;
const KEPT_META_BYTES: usize = 2048;

/// What `meta` declares, if its text was read lately.
fn known(meta: &str) -> Option<Arc<Declared>> {
    if meta.len() > KEPT_META_BYTES {
        return None;
    }
    DECLARED.read().ok()?.get(meta).cloned()
}

/// Keeps what `meta` declares for its next request.
fn remember(meta: &str, declared: Declared) -> Arc<Declared> {
    let declared = Arc::new(declared);
    if meta.len() <= KEPT_META_BYTES
        && let Ok(mut kept) = DECLARED.write()
    {
        if kept.len() >= KEPT_METAS {
            kept.clear();
        }
        kept.insert(meta.into(), declared.clone());
    }
    declared
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
    let unreadable =
        |e: serde_json::Error| ModernError::InvalidMeta(format!("params could not be read: {e}"));
    match serde_json::from_str::<Object<WithMeta>>(params) {
        Ok(Object(p)) => match p.meta {
            None => bad("params._meta is required"),
            Some(m) if !m.get().starts_with('{') => bad("params._meta must be an object"),
            // An object `_meta` that does not read: a member given twice, say.
            Some(m) => match serde_json::from_str::<Object<Meta>>(m.get()) {
                Ok(_) => bad("_meta[\"io.modelcontextprotocol/protocolVersion\"] must be a string"),
                Err(e) => unreadable(e),
            },
        },
        Err(e) => match serde_json::from_str::<Object<Params>>(params) {
            Err(_) => bad("params must be an object"),
            Ok(Object(p)) => match p.meta {
                None => bad("params._meta is required"),
                // An object `_meta` in params that do not read: a member given twice, say.
                Some(m) if m.get().starts_with('{') => unreadable(e),
                Some(_) => bad("params._meta must be an object"),
            },
        },
    }
}

/// The rest of `_meta` read, once its version is.
fn declare(meta: Meta<'_>, version: String) -> Result<Declared, ModernError> {
    let bad = |what: &str| ModernError::InvalidMeta(what.to_owned());
    // Required on every request, `{}` when the client declares nothing.
    #[derive(Deserialize)]
    struct Capabilities<'a> {
        #[serde(borrow)]
        extensions: Option<&'a RawValue>,
    }
    let declared = meta
        .capabilities
        .filter(|raw| raw.get().starts_with('{'))
        .and_then(|raw| serde_json::from_str::<Capabilities>(raw.get()).ok())
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
            let l = string_value(l.get()).ok_or_else(|| {
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
    Ok(Declared {
        version,
        capabilities_raw: meta.capabilities.map(RawValue::to_owned),
        log_level,
        extensions,
        client: meta.client_info.and_then(crate::protocol::client_label),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"},"io.modelcontextprotocol/clientCapabilities":{"elicitation":{},"extensions":{"io.modelcontextprotocol/tasks":{}}}}"#;

    fn read(params: &str) -> Result<RequestMeta, ModernError> {
        read_meta(Some(&RawValue::from_string(params.to_owned()).unwrap()))
    }

    #[test]
    fn what_the_params_carry_is_read_with_the_meta() {
        let params = format!(
            r#"{{"name":"echo","arguments":{{"text":"a \"}}\" b","n":[1,{{}}]}},"_meta":{META}}}"#
        );
        let m = read(&params).unwrap();
        assert_eq!(m.name.as_deref(), Some("echo"));
        assert_eq!(
            &params[m.arguments.clone().unwrap()],
            r#"{"text":"a \"}\" b","n":[1,{}]}"#
        );
        assert!(!m.retry_members);
        assert!(m.tasks());
        assert_eq!(m.declared.client.as_deref(), Some("c 1"));
        assert!(
            read(&format!(r#"{{"_meta":{META}}}"#))
                .unwrap()
                .arguments
                .is_none()
        );
        for retry in [
            r#","requestState":"s""#,
            r#","inputResponses":{}"#,
            // A name with an escape is read by serde, which does not look for these.
            r#","n\u0061me":"x""#,
        ] {
            let m = read(&format!(r#"{{"_meta":{META}{retry}}}"#)).unwrap();
            assert!(m.retry_members, "{retry}");
        }
    }

    #[test]
    fn a_scan_and_serde_read_the_same() {
        // The escaped member name sends the second to serde.
        let scanned = read(&format!(
            r#"{{"name":"a","uri":"u","taskId":"t","task":{{}},"arguments":{{}},"_meta":{META}}}"#
        ))
        .unwrap();
        let text = format!(
            r#"{{"name":"a","uri":"u","taskId":"t","task":{{}},"arguments":{{}},"_meta":{META},"x\u0079":1}}"#
        );
        let read_by_serde = read(&text).unwrap();
        assert_eq!(
            (
                &scanned.name,
                &scanned.uri,
                &scanned.task_id,
                scanned.task_hint
            ),
            (
                &read_by_serde.name,
                &read_by_serde.uri,
                &read_by_serde.task_id,
                read_by_serde.task_hint
            )
        );
        assert_eq!(&text[read_by_serde.arguments.unwrap()], "{}");
        // Given twice, refused by either.
        for twice in [
            format!(r#"{{"name":"a","name":"b","_meta":{META}}}"#),
            format!(r#"{{"arguments":{{}},"arguments":{{}},"_meta":{META}}}"#),
            format!(r#"{{"n\u0061me":"a","name":"b","_meta":{META}}}"#),
        ] {
            match read(&twice) {
                Err(ModernError::InvalidMeta(m)) => assert!(m.contains("duplicate field"), "{m}"),
                other => panic!("{twice}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_meta_read_once_is_not_read_again() {
        let meta = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"kept-test","version":"1"}}"#;
        let params = format!(r#"{{"_meta":{meta}}}"#);
        let (a, b) = (read(&params).unwrap(), read(&params).unwrap());
        assert!(Arc::ptr_eq(&a.declared, &b.declared));
        assert_eq!(b.declared.client.as_deref(), Some("kept-test 1"));
        // Another text is another reading, even one that declares the same.
        let spaced = format!(r#"{{"_meta": {meta} }}"#);
        let c = read(&spaced).unwrap();
        assert_eq!(c.declared.client, a.declared.client);
        // A `_meta` that is wrong is wrong every time (nothing is kept of it).
        let bad = r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/logLevel":"loud","kept":"bad"}}"#;
        for _ in 0..2 {
            assert!(
                matches!(read(bad), Err(ModernError::InvalidMeta(m)) if m.contains("logLevel"))
            );
        }
        // One too long to keep is read each time, the same.
        let long = format!(
            r#"{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{"x":"{}"}}}}}}"#,
            "y".repeat(KEPT_META_BYTES)
        );
        let (d, e) = (read(&long).unwrap(), read(&long).unwrap());
        assert!(!Arc::ptr_eq(&d.declared, &e.declared));
        assert_eq!(
            d.declared.capabilities_raw.as_ref().map(|c| c.get().len()),
            Some(KEPT_META_BYTES + 8)
        );
        // Past the table's bound it starts over, and every text still reads right.
        for n in 0..KEPT_METAS + 10 {
            let meta = format!(
                r#"{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}},"io.modelcontextprotocol/clientInfo":{{"name":"n{n}"}}}}"#
            );
            let m = read(&format!(r#"{{"_meta":{meta}}}"#)).unwrap();
            assert_eq!(m.declared.client, Some(format!("n{n}")));
        }
        assert!(DECLARED.read().unwrap().len() <= KEPT_METAS);
    }
}
