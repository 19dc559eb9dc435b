//! A session's GET stream, read by a task of its own, and the resumes: the GET stream cut and
//! resumed with `Last-Event-ID` (a log sent meanwhile must come in the replay), and a POST
//! stream cut in the middle of a burst and resumed on a fresh connection.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::requests::{Posted, answer, background, get, post, result_text};
use super::sse::EventStream;
use super::stats::Stats;
use super::track::{SessionState, Via};
use super::{Ctx, RESUMED_BURST};

/// How a GET reader ended.
pub(super) enum GetEnd {
    /// Asked to stop (for a resume).
    Stopped,
    /// The stream ended (after DELETE, this is expected).
    Ended,
    Failed(String),
}

pub(super) struct GetReader {
    stop: watch::Sender<bool>,
    pub(super) task: JoinHandle<GetEnd>,
}

fn spawn_reader(
    ctx: &Arc<Ctx>,
    st: &Arc<SessionState>,
    mut es: EventStream,
    resumed: bool,
) -> GetReader {
    let (stop, mut stopped) = watch::channel(false);
    let (ctx, st) = (ctx.clone(), st.clone());
    let task = tokio::spawn(async move {
        let via = Via::Get { resumed };
        loop {
            tokio::select! {
                biased;
                _ = stopped.changed() => return GetEnd::Stopped,
                ev = es.next() => match ev {
                    Ok(Some(ev)) => {
                        if let Some(v) = st.absorb(&ev, via, &ctx.stats)
                            && (v.get("result").is_some() || v.get("error").is_some())
                        {
                            ctx.stats.error("an answer on the GET stream", ev.data.clone());
                        }
                    }
                    Ok(None) => return GetEnd::Ended,
                    Err(e) => return GetEnd::Failed(e),
                },
            }
        }
    });
    GetReader { stop, task }
}

impl GetReader {
    pub(super) async fn stop(self) -> GetEnd {
        let _ = self.stop.send(true);
        self.task
            .await
            .unwrap_or_else(|e| GetEnd::Failed(e.to_string()))
    }
}

/// Cuts the GET connection; while none listens, a background log comes (so it waits in the
/// GET stream's buffer); then resumes with `Last-Event-ID`: the replay must bring it.
pub(super) async fn resume_get(
    ctx: &Arc<Ctx>,
    st: &Arc<SessionState>,
    reader: GetReader,
) -> Option<GetReader> {
    match reader.stop().await {
        GetEnd::Stopped => {}
        GetEnd::Ended => ctx
            .stats
            .error("the GET stream ended on its own", st.sid.clone()),
        GetEnd::Failed(e) => ctx.stats.error("the GET stream failed", e),
    }
    background(ctx, st, 20).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let last = st.track.lock().expect("track lock").get_last_id.clone();
    match get(ctx, &ctx.streams, st, last.as_deref()).await {
        Ok(es) => {
            Stats::add(&ctx.stats.get_resumes, 1);
            Some(spawn_reader(ctx, st, es, last.is_some()))
        }
        Err(e) => {
            ctx.stats.error("GET resume refused", e);
            reopen_get(ctx, st).await
        }
    }
}

/// A plain GET after a failed resume.
pub(super) async fn reopen_get(ctx: &Arc<Ctx>, st: &Arc<SessionState>) -> Option<GetReader> {
    match get(ctx, &ctx.streams, st, None).await {
        Ok(es) => Some(spawn_reader(ctx, st, es, false)),
        Err(e) => {
            ctx.stats.error("GET stream refused", e);
            None
        }
    }
}

/// A burst whose POST stream is cut after a few notifications and resumed on a fresh
/// connection with `Last-Event-ID`: the rest of the burst and the answer must come there.
pub(super) async fn resume_post(ctx: &Ctx, st: &SessionState) {
    let tag = st.unique("rb");
    st.expect_burst(&tag, RESUMED_BURST);
    let id = st.id();
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "burst",
        "arguments": {"count": RESUMED_BURST, "pause_us": 20_000, "tag": tag}}});
    let mut es = match post(ctx, Some(st), &body).await {
        Ok(Posted::Stream(es)) => es,
        Ok(_) => {
            st.excuse(&tag);
            return ctx.stats.error("resume: a burst not answered as SSE", tag);
        }
        Err(e) => {
            st.excuse(&tag);
            return ctx.stats.error("resume: request failed", e);
        }
    };
    st.started.store(true, Ordering::Relaxed);
    let prefix = format!("{tag}:");
    let mut seen = 0;
    let mut answered = None;
    while seen < 3 {
        match es.next().await {
            Ok(Some(ev)) => {
                let Some(v) = st.absorb(&ev, Via::Post, &ctx.stats) else {
                    continue;
                };
                if v["params"]["data"]
                    .as_str()
                    .is_some_and(|d| d.starts_with(&prefix))
                {
                    seen += 1;
                } else if v["id"] == id {
                    answered = Some(v);
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => {
                st.excuse(&tag);
                return ctx.stats.error("resume: the POST stream failed", e);
            }
        }
    }
    if answered.is_some() || seen < 3 {
        // The burst was over before the cut (the client was slow to read, or the call
        // failed): read it out.
        let rest = answer(ctx, st, &mut es, id, Via::Post).await;
        st.forget_stream(es.last_id.as_deref());
        Stats::add(&ctx.stats.resumes_skipped, 1);
        return finish_burst(ctx, st, &tag, answered.map_or(rest, Ok));
    }
    let last = es.last_id.clone();
    drop(es);
    // The burst goes on into the stream's buffer meanwhile.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut resumed = match get(ctx, &ctx.http, st, last.as_deref()).await {
        Ok(es) => es,
        Err(e) => {
            st.excuse(&tag);
            return ctx.stats.error("POST stream resume refused", e);
        }
    };
    Stats::add(&ctx.stats.post_resumes, 1);
    let via = Via::Get { resumed: true };
    let a = answer(ctx, st, &mut resumed, id, via).await;
    st.forget_stream(last.as_deref());
    finish_burst(ctx, st, &tag, a);
}

/// Checks the answer to a resumed burst.
fn finish_burst(ctx: &Ctx, st: &SessionState, tag: &str, answer: Result<Value, String>) {
    match answer {
        Ok(v) if result_text(&v["result"]) == format!("burst of {RESUMED_BURST} done") => {
            Stats::add(&ctx.stats.bursts_ok, 1);
        }
        Ok(v) if v.get("error").is_some() => {
            st.excuse(tag);
            ctx.stats.error(
                "resumed burst: JSON-RPC error",
                v["error"]["message"].as_str().unwrap_or_default(),
            );
        }
        Ok(v) => ctx
            .stats
            .lost("resumed burst: a wrong answer", 1, v.to_string()),
        Err(e) => ctx.stats.lost("resumed burst: no answer", 1, e),
    }
}
