//! The "Modern era (2026-07-28)" section of BENCHMARKS.md, from a [`Report`], followed by the
//! hand-kept reading in `bench/NOTES-modern.md`.

use super::{Comparison, LEGACY, Report, SECTION};
use crate::numbers::{list, median};

pub fn markdown(r: &Report) -> String {
    let binary = r
        .gateway
        .as_ref()
        .map_or(String::new(), |g| format!(" (gateway binary `{g}`)"));
    let mut out = format!(
        "{SECTION}\n\nMeasured by `mcp-bench modern` (bench/src/modern.rs) on {}, commit `{}`{binary}, \
         {} cores, {} s per run; the load average was {} before and {} after. A modern client \
         (no session; `_meta` with the protocol version 2026-07-28, client info and capabilities \
         on every request; `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers) against \
         a legacy one (one session opened with `initialize`) on the same gateway build, in \
         alternating pairs of runs, every run on a fresh gateway with the echo plugin behind it \
         (a plugin process per session; the modern client's calls go through the hidden \
         session of its caller, one process too). Every answer is checked. Raw numbers: \
         `bench/results/modern.json`. Reproduce: `target/release/mcp-bench --duration 6 modern` \
         (or `scripts/bench`, which runs it too).\n\n\
         - (a) echo: 16 calls of `echo` in flight, 64-byte texts; the answer must be the call's \
         text (and for the modern client a `complete` result, with no session minted). The \
         target: modern ≥ legacy in calls/s.\n\
         - Input round trip: the echo plugin's `ask` tool asks its client with \
         `elicitation/create` (the call's text as the message) and answers with what the client \
         accepted. Modern: the call gets an `InputRequiredResult`, the client retries at once \
         with `inputResponses` and `requestState` and gets the result. Legacy (session at {LEGACY}): \
         the call's POST answers with an SSE stream, the question comes on it, the answer goes \
         in a POST of its own, and the result comes on the stream. A figure is a call from its \
         first request to its result (one at a time: two POSTs either way); calls/s here are \
         such calls per second. The client answers a question with `re:` and the question's \
         text, and a call's result must be `re:` and its own text. Stdio carries no link from \
         a plugin's request to the call that caused it, so with 16 calls in flight on one \
         plugin instance the gateway puts a question on the newest call's stream (legacy) or \
         into its `InputRequiredResult` (modern); the clients answer what they are given, as \
         real ones would, and such questions are counted below.\n\
         - Sampling round trip: the same, one at a time, with the echo plugin's `sample` tool, \
         which asks with `sampling/createMessage` (the call's text as the prompt) and answers \
         with the text of the client's sample; the client samples `re:` and the prompt's \
         text.\n\n\
         Before its first call the modern client waits until `tools/list` lists the tool: \
         16 modern calls at once into a gateway that has just started can be refused (-32602, \
         unknown tool; see the notes below), and the legacy client opens its session first.\n\n\
         Modern/legacy: the median of each pair's own ratio of calls/s. p50 and p99: medians \
         over runs. CPU: time per call or exchange (`/proc/PID/stat`, medians over runs) of the \
         gateway process, and of the load generator, which shares the cores with it.\n\n\
         | scenario | runs | modern, calls/s | legacy, calls/s | modern/legacy per pair | \
         modern/legacy | modern p50 / p99 | legacy p50 / p99 | gateway CPU µs, modern / legacy | \
         load generator CPU µs, modern / legacy | wrong, modern / legacy |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        r.date, r.commit, r.cores, r.seconds_per_run, r.load_before, r.load_after,
    );
    for c in &r.comparisons {
        let target = if c.scenario.starts_with("(a)") {
            if c.ratio_percent >= 100.0 {
                " ✓"
            } else {
                " ✗"
            }
        } else {
            ""
        };
        out.push_str(&format!(
            "| {} | {} × {} s | {} | {} | {} | **{:.1}%**{target} | {:.2} / {:.2} ms | {:.2} / {:.2} ms | {:.1} / {:.1} | {:.1} / {:.1} | {} / {} |\n",
            c.scenario,
            c.modern_calls_per_sec.len() + c.legacy_calls_per_sec.len(),
            c.seconds_per_run,
            list(&c.modern_calls_per_sec, 0),
            list(&c.legacy_calls_per_sec, 0),
            list(&c.pair_ratio_percent, 1),
            c.ratio_percent,
            c.median_modern_p50_ms,
            c.median_modern_p99_ms,
            c.median_legacy_p50_ms,
            c.median_legacy_p99_ms,
            median(&c.modern_cpu_us_per_call),
            median(&c.legacy_cpu_us_per_call),
            median(&c.modern_client_cpu_us_per_call),
            median(&c.legacy_client_cpu_us_per_call),
            c.modern_wrong,
            c.legacy_wrong,
        ));
    }
    let trips: Vec<&Comparison> = r
        .comparisons
        .iter()
        .filter(|c| c.modern_calls + c.legacy_calls > 0)
        .collect();
    if !trips.is_empty() {
        out.push_str(
            "\nThe round trips in detail, over all runs. Legs (p50): of the calls that were asked \
             their own question and nothing else, the time until the question (modern: the \
             `InputRequiredResult`; legacy: the request on the call's stream) and from there to \
             the result (modern: the retry; legacy: the answer's POST and the result on the \
             stream). Requests: HTTP requests per call (modern: the call and its retries; \
             legacy: the call and the answers' POSTs). Another call's: the questions a call was \
             given that another call had caused.\n\n\
             | scenario | client | legs p50, to the question / after it | requests per call | \
             questions | another call's |\n|---|---|---|---|---|---|\n",
        );
        for c in trips {
            for (client, legs, calls, requests, questions, foreign) in [
                (
                    "modern",
                    c.modern_legs_p50_ms,
                    c.modern_calls,
                    c.modern_requests,
                    c.modern_questions,
                    c.modern_foreign_questions,
                ),
                (
                    "legacy",
                    c.legacy_legs_p50_ms,
                    c.legacy_calls,
                    c.legacy_requests,
                    c.legacy_questions,
                    c.legacy_foreign_questions,
                ),
            ] {
                out.push_str(&format!(
                    "| {} | {client} | {:.2} / {:.2} ms | {:.2} | {questions} | {foreign} ({:.1}%) |\n",
                    c.scenario,
                    legs[0],
                    legs[1],
                    requests as f64 / calls.max(1) as f64,
                    100.0 * foreign as f64 / questions.max(1) as f64,
                ));
            }
        }
    }
    let wrong: Vec<String> = r
        .comparisons
        .iter()
        .filter(|c| !c.wrong_causes.is_empty())
        .map(|c| {
            let causes = c
                .wrong_causes
                .iter()
                .map(|(k, n)| format!("{k} ({n})"))
                .collect::<Vec<_>>()
                .join("; ");
            format!("{}: {causes}", c.scenario)
        })
        .collect();
    if !wrong.is_empty() {
        out.push_str(&format!(
            "\nWrong answers, by cause: {}.\n",
            wrong.join(". ")
        ));
    }
    // The hand-kept reading of the numbers.
    if let Ok(notes) = std::fs::read_to_string("bench/NOTES-modern.md") {
        out.push('\n');
        out.push_str(&notes);
    }
    out
}
