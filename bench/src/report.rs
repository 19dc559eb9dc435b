//! What every command writes: the date and commit a run was measured on, its report as JSON
//! in `bench/results/`, and its section of BENCHMARKS.md (a section replaced, the rest of the
//! file kept). A leaf: it imports no other module.

use std::path::Path;

/// The date and time now, in UTC, as the reports give it.
pub(crate) fn date() -> String {
    std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The short hash of HEAD, marked when files other than those under `ours` (what a run
/// writes) have uncommitted changes.
pub(crate) fn commit_excluding(ours: &[&str]) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            // Only the end trimmed: a status line starts with a space for a change not staged.
            .map(|o| String::from_utf8_lossy(&o.stdout).trim_end().to_owned())
    };
    let hash = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // Changes beyond the results this run writes make the commit an approximation.
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|s| changed_beyond(&s, ours));
    if dirty {
        format!("{hash} (with uncommitted changes)")
    } else {
        hash
    }
}

/// Whether `git status --porcelain` output `status` names a file not under `ours`.
fn changed_beyond(status: &str, ours: &[&str]) -> bool {
    status.lines().any(|l| {
        let path = l.get(3..).unwrap_or(l);
        !ours.iter().any(|o| path.starts_with(o))
    })
}

/// A report written by [`write_report`] before (to write its section again).
pub(crate) fn read_report<T: serde::de::DeserializeOwned>(file: &Path) -> T {
    let json = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{}: not a report: {e}", file.display()))
}

/// Writes report `r` as JSON to `file` (its directory made) and `section` under `heading` in
/// BENCHMARKS.md.
pub(crate) fn write_report(r: &impl serde::Serialize, file: &Path, heading: &str, section: &str) {
    let json = serde_json::to_string_pretty(r).expect("serializable");
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).expect("results directory");
    }
    std::fs::write(file, &json).expect("write results");
    let old = std::fs::read_to_string("BENCHMARKS.md").unwrap_or_default();
    let text = replace_section(&old, heading, section);
    std::fs::write("BENCHMARKS.md", text).expect("write BENCHMARKS.md");
    eprintln!("wrote the {heading} section of BENCHMARKS.md");
}

/// `text` with the section under `heading` (up to the next `## ` heading) replaced by
/// `section`, or `section` appended when there is none.
pub(crate) fn replace_section(text: &str, heading: &str, section: &str) -> String {
    let section = section.trim_end();
    let starts = |l: &str| l.trim_end() == heading;
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    let mut replaced = false;
    while let Some(line) = lines.next() {
        if !replaced && starts(line) {
            replaced = true;
            out.push_str(section);
            out.push_str("\n\n");
            while lines.peek().is_some_and(|l| !l.starts_with("## ")) {
                lines.next();
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    if !replaced {
        if !out.is_empty() && !out.ends_with("\n\n") {
            out.push('\n');
        }
        out.push_str(section);
        out.push('\n');
    }
    out.trim_end().to_owned() + "\n"
}

/// The sections of `old` under these headings, carried into `new` (which `mcp-bench`
/// rewrites whole): the soak's and the fuzzing's results come from other runs.
pub(crate) fn keep_sections(old: &str, new: String, headings: &[&str]) -> String {
    headings
        .iter()
        .fold(new, |acc, h| match section_of(old, h) {
            Some(s) => replace_section(&acc, h, &s),
            None => acc,
        })
}

fn section_of(text: &str, heading: &str) -> Option<String> {
    let mut lines = text.lines().skip_while(|l| l.trim_end() != heading);
    let first = lines.next()?;
    let rest: Vec<&str> = lines.take_while(|l| !l.starts_with("## ")).collect();
    Some(format!("{first}\n{}", rest.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_beyond_what_a_run_writes_mark_its_commit() {
        let ours = ["BENCHMARKS.md", "bench/results/"];
        // A change not staged starts its line with a space, the first line's too.
        assert!(!changed_beyond(" M BENCHMARKS.md", &ours));
        assert!(!changed_beyond(
            " M BENCHMARKS.md\nM  bench/results/soak.json",
            &ours
        ));
        assert!(changed_beyond(
            " M BENCHMARKS.md\n M bench/src/main.rs",
            &ours
        ));
        assert!(!changed_beyond("", &ours));
    }

    #[test]
    fn a_section_is_replaced_or_appended_and_the_rest_kept() {
        let text = "# B\n\nintro\n\n## Soak\n\nold\n| a |\n\n## Fuzzing\n\nfz\n";
        let out = replace_section(text, "## Soak", "## Soak\n\nnew\n");
        assert_eq!(out, "# B\n\nintro\n\n## Soak\n\nnew\n\n## Fuzzing\n\nfz\n");
        let out = replace_section("# B\n\nintro\n", "## Soak", "## Soak\n\nnew");
        assert_eq!(out, "# B\n\nintro\n\n## Soak\n\nnew\n");
        let kept = keep_sections(
            text,
            "# B\n\nrewritten\n".into(),
            &["## Soak", "## Fuzzing"],
        );
        assert_eq!(
            kept,
            "# B\n\nrewritten\n\n## Soak\n\nold\n| a |\n\n## Fuzzing\n\nfz\n"
        );
    }
}
