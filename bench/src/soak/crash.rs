//! The injected crash: a session crashes its plugin instance while a call of its own is in
//! flight there; both must fail naming the plugin's exit.

use std::time::Duration;

use serde_json::json;

use super::requests::{CallError, Posted, answer, call, count_failure, post};
use super::stats::Stats;
use super::track::{SessionState, Via};
use super::{Ctx, PLUGIN};

/// The injected crash: a `slow` call in flight on the session's instance (its progress
/// notification shows the plugin has it), then `crash`. Both must fail naming the plugin's
/// exit; those two errors are the injected ones.
pub(super) async fn crash(ctx: &Ctx, st: &SessionState) {
    let victim_id = st.id();
    let token = st.unique("victim");
    let body = json!({"jsonrpc": "2.0", "id": victim_id, "method": "tools/call", "params": {"name": "slow",
        "arguments": {"ms": 60_000}, "_meta": {"progressToken": token}}});
    let mut es = match post(ctx, Some(st), &body).await {
        Ok(Posted::Stream(es)) => es,
        Ok(_) => {
            return ctx
                .stats
                .error("crash: the victim not answered as SSE", token);
        }
        Err(e) => return ctx.stats.error("crash: the victim's request failed", e),
    };
    let in_flight = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(ev)) = es.next().await {
            if let Some(v) = st.absorb(&ev, Via::Post, &ctx.stats)
                && v["method"] == "notifications/progress"
                && v["params"]["progressToken"] == token.as_str()
            {
                return true;
            }
        }
        false
    })
    .await;
    if in_flight != Ok(true) {
        return ctx
            .stats
            .error("crash: the victim's progress did not come", token);
    }
    let exited = format!("plugin '{PLUGIN}' exited");
    let (victim, crashed) = tokio::join!(
        answer(ctx, st, &mut es, victim_id, Via::Post),
        call(ctx, st, "crash", json!({}))
    );
    st.forget_stream(es.last_id.as_deref());
    match crashed {
        Err(CallError::Rpc(m)) if m.starts_with(&exited) => {
            Stats::add(&ctx.stats.injected_crashes, 1);
        }
        Err(e) => count_failure(ctx, "crash (not as injected)", e),
        Ok(r) => ctx.stats.error("crash: answered", r.to_string()),
    }
    match victim {
        Ok(v)
            if v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(&exited)) =>
        {
            Stats::add(&ctx.stats.victims, 1);
        }
        Ok(v) => ctx.stats.error(
            "crash: the victim's answer (not as injected)",
            v.to_string(),
        ),
        Err(e) => ctx.stats.lost("crash: the victim's answer", 1, e),
    }
}
