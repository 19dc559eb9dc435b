//! (d): a new session's latency, one session after another: until `initialize` is answered,
//! until the handshake is over, until the first call is answered.

use std::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::json;

use crate::mcp::{client, initialize, initialize_request, initialized, post};

/// (d): p50 latencies of a new session, each timed from the `initialize` request's start.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Latency {
    /// Until the `initialize` result is in: one round trip, what the targets call initialize.
    pub(crate) initialize_p50_ms: f64,
    /// Until `notifications/initialized` is acknowledged as well: the client's whole handshake.
    pub(crate) handshake_p50_ms: f64,
    /// Until the answer to the first `tools/call` is in.
    pub(crate) first_call_p50_ms: f64,
    pub(crate) rounds: usize,
}

/// (d): new sessions one after another, each timed from its `initialize` request. First
/// `rounds` sessions that only open and close, then `rounds` that also make a first call: a
/// first call starts a plugin (or takes one from the warm pool, which then starts another),
/// and the next session's `initialize` would otherwise be timed against that start and the
/// previous session's plugin stopping.
pub(crate) async fn first_call_latency(url: &str, rounds: usize) -> Latency {
    let http = client();
    let new = || Histogram::<u64>::new(3).expect("histogram");
    let (mut init, mut handshake, mut first) = (new(), new(), new());
    let micros = |t: Instant| t.elapsed().as_micros() as u64;
    let close = |sid: Option<String>| {
        let http = http.clone();
        async move {
            if let Some(sid) = sid {
                let _ = http.delete(url).header("mcp-session-id", sid).send().await;
            }
        }
    };
    for _ in 0..rounds {
        let t = Instant::now();
        let Ok((sid, version)) = initialize_request(&http, url).await else {
            continue;
        };
        init.record(micros(t)).expect("in range");
        if initialized(&http, url, sid.as_deref(), &version)
            .await
            .is_ok()
        {
            handshake.record(micros(t)).expect("in range");
        }
        close(sid).await;
    }
    for i in 0..rounds {
        let t = Instant::now();
        let Ok((sid, version)) = initialize(&http, url).await else {
            continue;
        };
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": format!("first-{i}")}}});
        if post(&http, url, sid.as_deref(), Some(&version), &body)
            .await
            .is_ok()
        {
            first.record(micros(t)).expect("in range");
        }
        close(sid).await;
    }
    let p50 = |h: &Histogram<u64>| h.value_at_quantile(0.5) as f64 / 1000.0;
    Latency {
        initialize_p50_ms: p50(&init),
        handshake_p50_ms: p50(&handshake),
        first_call_p50_ms: p50(&first),
        rounds,
    }
}
