//! The house's layers: each top-level module of `src` imports only modules in layers below
//! its own, so there is no import loop between them and a reader can learn the gateway from
//! the bottom up. The test reads every `crate::` path in the code of `src` (comments and doc
//! links aside) and fails on an import that points up or sideways, and on any loop.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// From the bottom up. A module may import any module of a lower layer, none of its own or a
/// higher one. Keep `lib.rs`'s map and README's layout in step with this picture.
const LAYERS: &[&[&str]] = &[
    // Leaves: the JSON-RPC envelope, the counters, the validated configuration.
    &["jsonrpc", "metrics", "config"],
    // The audit log's records (read by the log set-up above it).
    &["audit"],
    // Protocol versions and eras; log set-up.
    &["protocol", "logs"],
    // Streams towards a client and their event store.
    &["stream"],
    // Plugins: the stdio child and its JSON-RPC multiplexing.
    &["backend"],
    // Which plugins exist, and OAuth (both persisted through store traits); rate limits.
    &["registry", "auth", "limits"],
    // People's own credentials (the gateway as their OAuth client, through `auth`'s fetcher).
    &["credentials"],
    // The database: connects, migrates, lends the stores above.
    &["database"],
    // Supervision of plugin instances: start, restart, breaker, pools, limits.
    &["supervisor"],
    // Legacy-era sessions.
    &["session"],
    // Which plugin serves a request; cluster mode's shared state and forwarding.
    &["router", "cluster"],
    // The shared state the listeners serve.
    &["gateway"],
    // The edges: the public endpoint, and the admin listener.
    &["http"],
    &["admin"],
    // Start-up and the listeners' lifetime.
    &["server"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`src/http/mcp/post.rs` is `http`), or `None` for
/// the crate root and the binary.
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// The code of a line, without its comment (doc links are not imports).
fn code(line: &str) -> &str {
    let trimmed = line.trim_start();
    if trimmed.starts_with("//") {
        return "";
    }
    match line.find("//") {
        // A `//` inside a string (a URL) is rare in paths; cutting there only loses text
        // after it on that line.
        Some(i) => &line[..i],
        None => line,
    }
}

/// The top-level modules a piece of code names through `crate::`, including grouped
/// imports such as `use crate::{a, b::c};`.
fn named_modules(text: &str, out: &mut BTreeSet<String>) {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = matching_brace(group);
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group[..end].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(group[start..j].trim()));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            out.insert(ident(group[start..end].trim()));
        } else {
            out.insert(ident(after));
        }
        rest = after;
    }
    out.remove("");
}

fn matching_brace(s: &str) -> usize {
    let mut depth = 1;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// Top-level module → the top-level modules it imports.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut paths = Vec::new();
    files(&src(), &mut paths);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in paths {
        let Some(module) = module_of(&path) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("readable source");
        // Statements span lines (`use crate::{\n a,\n b\n};`): join the code first.
        let joined: String = text.lines().map(code).collect::<Vec<_>>().join(" ");
        let mut named = BTreeSet::new();
        named_modules(&joined, &mut named);
        named.remove(&module);
        graph.entry(module).or_default().extend(named);
    }
    graph
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

#[test]
fn every_top_level_module_has_a_layer() {
    let unplaced: Vec<_> = graph()
        .into_keys()
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules missing from LAYERS in tests/layers.rs: {unplaced:?}"
    );
}

#[test]
fn modules_import_only_lower_layers() {
    let mut wrong = Vec::new();
    for (module, imports) in graph() {
        let Some(own) = layer_of(&module) else {
            continue;
        };
        for import in imports {
            match layer_of(&import) {
                Some(l) if l < own => {}
                _ => wrong.push(format!("{module} imports {import}")),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that point up or sideways (see LAYERS in tests/layers.rs):\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn no_import_loop_between_top_level_modules() {
    let graph = graph();
    // Depth-first search with colours: reaching a grey module again closes a loop.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        colour: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        colour.insert(m.to_owned(), 1);
        path.push(m.to_owned());
        for next in graph.get(m).into_iter().flatten() {
            match colour.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let start = path.iter().position(|p| p == next).expect("on the path");
                    let mut cycle = path[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(next, graph, colour, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        colour.insert(m.to_owned(), 2);
        None
    }
    let mut colour = BTreeMap::new();
    for m in graph.keys() {
        if colour.get(m.as_str()).copied().unwrap_or(0) == 0
            && let Some(cycle) = visit(m, &graph, &mut colour, &mut Vec::new())
        {
            panic!("import loop: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_reader_finds_grouped_and_inline_paths() {
    let mut named = BTreeSet::new();
    named_modules(
        "use crate::{a, b::{c, d}, e::f}; let x = crate::g::h(); use crate::i;",
        &mut named,
    );
    let want: BTreeSet<String> = ["a", "b", "e", "g", "i"].map(String::from).into();
    assert_eq!(named, want);
    assert_eq!(code("    /// see [`crate::http`]"), "");
    assert_eq!(
        code("let a = crate::b::c(); // crate::d"),
        "let a = crate::b::c(); "
    );
}
