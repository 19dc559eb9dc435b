//! The log subscriber: `RUST_LOG` directives, text or JSON lines on stderr; the audit log's
//! records always as JSON lines.
//!
//! Every request runs in a span whose fields (method, route, session, plugin) are formatted
//! when set, whether or not a line is ever written in it, so both parts here are built for a
//! span per request at tens of thousands a second. Directives that only name targets and
//! levels (the usual `RUST_LOG=info,mcp_gateway::access=debug`) go to a static filter, which
//! does no work per span; ones that filter on spans or fields need `EnvFilter`, which takes a
//! lock on every span entered, and get it. Text fields are written by [`TextFields`]: the same
//! output as `tracing-subscriber`'s default, without its general path for values that need
//! no escaping.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::LogFormat;

/// Directives when `RUST_LOG` is unset or empty.
const DEFAULT_DIRECTIVES: &str = "info";

/// Installs the global subscriber: lines on stderr, filtered by `RUST_LOG`, coloured only
/// on a terminal. Invalid directives fall back to `info`.
pub fn init(format: LogFormat) {
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_DIRECTIVES.to_owned());
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let lines = match format {
        LogFormat::Text => lines.fmt_fields(TextFields).boxed(),
        LogFormat::Json => lines.json().boxed(),
    };
    TEXT.store(
        matches!(format, LogFormat::Text),
        std::sync::atomic::Ordering::Relaxed,
    );
    // The audit log's records are JSON lines whatever the format, on at `info` unless
    // `RUST_LOG` names their target itself.
    let directives = if directives.contains(AUDIT_TARGET) {
        directives
    } else {
        format!("{directives},{AUDIT_TARGET}=info")
    };
    // The records' lines are written by the audit writer itself, in the JSON lines' shape
    // (`audit::writer`); this layer only says whether they are wanted (`tracing::enabled!`).
    let audit = tracing_subscriber::layer::Identity::new().with_filter(
        tracing_subscriber::filter::filter_fn(|m| m.target() == AUDIT_TARGET),
    );
    let lines = lines.with_filter(tracing_subscriber::filter::filter_fn(|m| {
        m.target() != AUDIT_TARGET
    }));
    tracing_subscriber::registry()
        .with(filter(&directives))
        .with(lines)
        .with(audit)
        .init();
}

/// Whether log lines are text (until [`init`] says JSON).
static TEXT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Text someone else wrote (a plugin's stderr), as a log line's message shows it: in text
/// lines quoted, with quotes, backslashes and control and invisible characters escaped, so it
/// cannot pass for a line of the gateway's own (an audit record's JSON line, say); in JSON
/// lines as it is (the JSON escapes it).
pub fn untrusted(text: &str) -> Untrusted<'_> {
    Untrusted(text)
}

/// See [`untrusted`].
pub struct Untrusted<'a>(&'a str);

impl fmt::Display for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if TEXT.load(std::sync::atomic::Ordering::Relaxed) {
            write!(f, "{:?}", self.0)
        } else {
            f.write_str(self.0)
        }
    }
}

/// The target of the audit log's records.
const AUDIT_TARGET: &str = crate::audit::TARGET;

/// A static filter when every directive is a plain `target=level`, `target` or `level`, else
/// `EnvFilter`. `Targets` would take span and field filters (`[...]`) for odd target names,
/// and an empty or padded directive for a target, so those go to `EnvFilter`, which knows
/// them.
fn filter(directives: &str) -> Box<dyn Layer<Registry> + Send + Sync> {
    let plain = directives
        .split(',')
        .all(|d| !d.is_empty() && !d.contains(|c: char| c.is_whitespace() || "[]{}".contains(c)));
    match directives.parse::<Targets>() {
        Ok(targets) if plain => Box::new(targets),
        _ => Box::new(
            EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new(DEFAULT_DIRECTIVES)),
        ),
    }
}

/// Text fields as `name="value" other=value`, byte for byte what
/// [`DefaultFields`](tracing_subscriber::fmt::format::DefaultFields) writes without colours.
/// A string of printable ASCII needing no escape is written as it is, in quotes; everything
/// else (messages, values needing escapes, colours on a terminal) goes through the default
/// visitor, which also neutralises escape sequences in messages. What one call formats goes
/// to the writer in one piece where it can: a span keeps its fields in a `String` that would
/// otherwise grow, and reallocate, at each of a dozen small writes.
#[derive(Debug, Default)]
pub struct TextFields;

impl<'w> FormatFields<'w> for TextFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = TextVisitor {
            writer,
            empty: true,
            result: Ok(()),
            staged: [0; STAGED],
            staged_len: 0,
        };
        fields.record(&mut visitor);
        visitor.result.and_then(|()| visitor.flush())
    }
}

/// Bytes of text gathered before they go to the writer.
const STAGED: usize = 256;

struct TextVisitor<'w> {
    writer: Writer<'w>,
    empty: bool,
    result: fmt::Result,
    staged: [u8; STAGED],
    staged_len: usize,
}

impl fmt::Write for TextVisitor<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.staged_len + s.len() > STAGED {
            self.flush()?;
            if s.len() > STAGED {
                return self.writer.write_str(s);
            }
        }
        self.staged[self.staged_len..self.staged_len + s.len()].copy_from_slice(s.as_bytes());
        self.staged_len += s.len();
        Ok(())
    }
}

impl TextVisitor<'_> {
    fn flush(&mut self) -> fmt::Result {
        let len = std::mem::take(&mut self.staged_len);
        if len == 0 {
            return Ok(());
        }
        // Only whole `str`s are staged.
        let text = std::str::from_utf8(&self.staged[..len]).expect("staged text is UTF-8");
        self.writer.write_str(text)
    }

    /// A field the plain path may write: not the message, not log metadata, not a raw
    /// identifier, and no colours to apply.
    fn plain_field(&self, name: &str) -> bool {
        !self.writer.has_ansi_escapes()
            && name != "message"
            && !name.starts_with("log.")
            && !name.starts_with("r#")
    }

    fn write_name(&mut self, name: &str) -> fmt::Result {
        if !std::mem::take(&mut self.empty) {
            self.write_str(" ")?;
        }
        self.write_str(name)?;
        self.write_str("=")
    }

    /// The default visitor, for one field, on this visitor's writer.
    fn fallback(&mut self, name: &str, record: impl FnOnce(&mut dyn Visit)) {
        if let Err(e) = self.flush() {
            self.result = Err(e);
            return;
        }
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.empty);
        record(&mut visitor);
        self.result = visitor.finish();
        // Log metadata is skipped, not written.
        if !name.starts_with("log.") {
            self.empty = false;
        }
    }
}

/// Whether `<str as Debug>` would write `value` unchanged between its quotes.
fn needs_no_escape(value: &str) -> bool {
    value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        if self.plain_field(name) && needs_no_escape(value) {
            self.result = self.write_name(name).and_then(|()| {
                self.write_str("\"")?;
                self.write_str(value)?;
                self.write_str("\"")
            });
        } else {
            self.fallback(name, |v| v.record_str(field, value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        if self.plain_field(name) {
            self.result = self
                .write_name(name)
                .and_then(|()| write!(self, "{value:?}"));
        } else {
            self.fallback(name, |v| v.record_debug(field, value));
        }
    }

    /// With its sources, as the default visitor writes errors.
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.result.is_ok() {
            self.fallback(field.name(), |v| v.record_error(field, value));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::format::DefaultFields;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// Spans and events with every kind of field the gateway logs.
    fn log_samples() {
        let span = tracing::info_span!(
            "request",
            method = "POST",
            route = "/mcp",
            session = tracing::field::Empty,
            plugin = tracing::field::Empty,
        );
        let _entered = span.enter();
        span.record("session", "1b4e28ba-2fa1-11d2-883f-0016d3cca427");
        span.record("plugin", "echo");
        // Past the staging buffer, alone and after others.
        let (long, longer) = ("x".repeat(200), "y".repeat(300));
        tracing::info!(a = long.as_str(), b = long.as_str(), c = longer.as_str(), d = ?longer);
        let err = std::io::Error::other("pipe closed");
        tracing::info!(
            plain = "abc-1.2_3:4/5",
            spaced = "two words",
            quoted = "say \"hi\"",
            newline = "a\nb",
            unicode = "caf\u{e9}",
            empty = "",
            number = 42,
            flag = true,
            shown = %"display text",
            debugged = ?vec![1, 2],
            error = &err as &(dyn std::error::Error + 'static),
            r#type = "raw",
            "a message with \"quotes\" and \u{1b}[31m escapes"
        );
        tracing::warn!("message only");
    }

    fn lines_with<N>(fields: N) -> String
    where
        N: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .fmt_fields(fields)
            .finish();
        tracing::subscriber::with_default(subscriber, log_samples);
        out.text()
    }

    #[test]
    fn text_fields_write_what_the_default_writes() {
        let ours = lines_with(TextFields);
        assert_eq!(ours, lines_with(DefaultFields::new()));
        assert!(
            ours.contains(r#"plain="abc-1.2_3:4/5" spaced="two words""#),
            "{ours}"
        );
        assert!(ours.contains(r#"session="1b4e28ba-"#), "{ours}");
        assert!(
            !ours.contains('\u{1b}'),
            "an escape sequence got through: {ours}"
        );
    }

    #[test]
    fn target_directives_get_the_static_filter_and_span_ones_env_filter() {
        let count = |directives: &str| {
            let out = Captured::default();
            let writer = out.clone();
            let subscriber = tracing_subscriber::registry()
                .with(filter(directives))
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(move || writer.clone())
                        .with_ansi(false),
                );
            tracing::subscriber::with_default(subscriber, || {
                tracing::debug!(target: "mcp_gateway::access", "access line");
                tracing::debug!(target: "mcp_gateway::other", "other line");
                tracing::info_span!("request").in_scope(|| {
                    tracing::debug!(target: "elsewhere", "in a request");
                });
            });
            let text = out.text();
            ["access line", "other line", "in a request"].map(|l| text.contains(l))
        };
        assert_eq!(
            count("info,mcp_gateway::access=debug"),
            [true, false, false]
        );
        // A span directive: only EnvFilter understands it.
        assert_eq!(count("info,[request]=debug"), [false, false, true]);
        // An empty directive is no target.
        assert_eq!(
            count("info,,mcp_gateway::access=debug,"),
            [true, false, false]
        );
        // Nonsense falls back to info.
        assert_eq!(count("=[=="), [false, false, false]);
    }
}
