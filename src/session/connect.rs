//! A legacy client asked to connect the caller's own credential (issue 41): when a call's
//! plugin cannot start until the person connects one, and the client declared URL mode
//! elicitation (2025-11-25), the gateway itself sends `elicitation/create` with the connect
//! page's link on the call's stream and keeps the call waiting: once the person has
//! connected (seen in the credential store, which every replica shares) the client gets
//! `notifications/elicitation/complete` and the call goes on. A client that declines, or a
//! person who does not connect within the link's lifetime, ends the wait, and the call gets
//! the spec's URLElicitationRequiredError. The gateway's own requests take ids from the
//! counter the plugins' requests to the client use, so the client's answer finds its way
//! back here ([`Session::own_response`]).

use std::time::Duration;

use serde_json::value::RawValue;

use super::Session;
use crate::backend::{BackendError, Related};
use crate::jsonrpc::{self, Id, Outcome};
use crate::stream::Sink;

/// The gateway's own requests to the client, by the id the client sees: where each answer
/// goes (the result, or `None` for an error).
pub(super) type OwnRequests =
    std::collections::HashMap<u64, tokio::sync::oneshot::Sender<Option<Box<RawValue>>>>;

/// How long a session's first request waits for its client's answer to an eager ask.
const EAGER_ANSWER: Duration = Duration::from_secs(30);

/// How often the store is looked at while a person connects.
const POLL: Duration = Duration::from_millis(500);

/// How a wait for a person to connect ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Connected {
    /// They did: the call may go on.
    Yes,
    /// The client declined or cancelled, or could not be asked, or the person did not come
    /// back in time: the call ends with the error.
    No,
}

impl Session {
    /// Keeps the token of a request of this session's owner (mode `external`), for a
    /// `token_exchange` credential.
    pub fn hold_token(&self, principal: Option<&crate::auth::Principal>) {
        if let Some(t) = principal.and_then(|p| p.token.as_ref()) {
            *self.subject_token.lock().expect("token lock") = Some(t.clone());
        }
    }

    /// The owner's latest token, if kept.
    pub(super) fn subject_token(&self) -> Option<crate::auth::Bearer> {
        self.subject_token
            .if_made()?
            .lock()
            .expect("token lock")
            .clone()
    }

    /// Hands the client's answer `n` to the gateway's own request it answers; false when `n`
    /// is none of those.
    pub(super) fn own_response(&self, n: u64, outcome: &Outcome) -> bool {
        let Some(waiting) = self
            .own_requests
            .if_made()
            .and_then(|m| m.lock().expect("own requests lock").remove(&n))
        else {
            return false;
        };
        let _ = waiting.send(match outcome {
            Outcome::Result(r) => Some(r.clone()),
            Outcome::Error(_) => None,
        });
        true
    }

    /// Asks this session's client (a legacy one that declared URL elicitation) to have the
    /// person connect what `needed` names, on the call's stream `client`, and waits until
    /// they did. `None` when this client cannot be asked so (the caller answers with the
    /// error as it is).
    pub async fn ask_to_connect(&self, client: &Sink, needed: &BackendError) -> Option<Connected> {
        let (until, accepted) = self.elicit_connect(client, needed, None).await?;
        let BackendError::CredentialNeeded(n) = needed else {
            return None;
        };
        if !accepted || !self.wait_connected(&n.credential, until).await {
            return Some(Connected::No);
        }
        self.connect_complete(&n.elicitation_id, Related::Exact(client.clone()));
        Some(Connected::Yes)
    }

    /// `connect = "eager"`: at this legacy session's first request, asks its person for the
    /// credentials of eager plugins they have not connected. A client that declared URL
    /// elicitation is asked on `sink` and the request goes on (the person connects in their
    /// own time; the client hears `notifications/elicitation/complete` when they did); any
    /// other gets the request answered with URLElicitationRequiredError (-32042). Once per
    /// session; the answer to send instead of the request's, if any.
    pub async fn ask_eagerly(
        self: &std::sync::Arc<Self>,
        view: &crate::registry::View,
        id: &Id,
        sink: &Sink,
    ) -> Option<bytes::Bytes> {
        if self.for_caller
            || self
                .eager_asked
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return None;
        }
        for plugin in &view.plugins {
            if plugin.entry.config.connect != crate::config::Connect::Eager
                || !self.lacks_credential(plugin).await
            {
                continue;
            }
            let needed = match self.personal(plugin).await {
                Err(e @ BackendError::CredentialNeeded(_)) => e,
                _ => continue,
            };
            let BackendError::CredentialNeeded(n) = &needed else {
                continue;
            };
            match self.elicit_connect(sink, &needed, Some(EAGER_ANSWER)).await {
                None => return Some(needed.error_bytes(Some(id))),
                Some((until, true)) => {
                    let me = self.clone();
                    let (credential, elicitation) =
                        (n.credential.clone(), n.elicitation_id.clone());
                    tokio::spawn(async move {
                        if me.wait_connected(&credential, until).await {
                            me.connect_complete(&elicitation, Related::None);
                        }
                    });
                }
                Some((_, false)) => {}
            }
        }
        None
    }

    /// Sends `elicitation/create` (URL mode) for what `needed` names on `client`, and waits
    /// for the client's answer: until when the link holds, and whether the person accepted.
    /// `None` when this client cannot be asked so.
    async fn elicit_connect(
        &self,
        client: &Sink,
        needed: &BackendError,
        answer_within: Option<Duration>,
    ) -> Option<(tokio::time::Instant, bool)> {
        let BackendError::CredentialNeeded(n) = needed else {
            return None;
        };
        let (elicitation_id, url) = (&n.elicitation_id, &n.url);
        if self.for_caller {
            return None;
        }
        let params = serde_json::json!({
            "mode": "url",
            "elicitationId": elicitation_id,
            "url": url,
            "message": needed.client_message(),
        });
        let params = RawValue::from_string(params.to_string()).expect("serialized JSON");
        if self
            .client_capabilities
            .refusal("elicitation/create", Some(&params))
            .is_some()
        {
            return None;
        }
        self.supervisor.credentials()?;
        self.owner.as_ref()?;
        let n = self
            .next_server_request
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.own_requests
            .lock()
            .expect("own requests lock")
            .insert(n, tx);
        let forget = || {
            if let Some(m) = self.own_requests.if_made() {
                m.lock().expect("own requests lock").remove(&n);
            }
        };
        // One wait for both steps: the link is good for this long from now, no longer.
        let until = tokio::time::Instant::now()
            + Duration::from_millis(crate::credentials::REQUEST_TTL_MS as u64);
        let request = jsonrpc::request_bytes(
            Some(Id::from_u64(n).raw()),
            "elicitation/create",
            Some(&params),
        );
        if self
            .deliver(request, Related::Exact(client.clone()), true)
            .is_err()
        {
            forget();
            return Some((until, false));
        }
        // A request that goes on once answered (eager) waits less than the link lasts.
        let answer_by =
            answer_within.map_or(until, |d| (tokio::time::Instant::now() + d).min(until));
        let answered = tokio::select! {
            a = rx => a.ok().flatten(),
            () = tokio::time::sleep_until(answer_by) => None,
            () = self.closed.cancelled() => None,
        };
        forget();
        #[derive(serde::Deserialize)]
        struct Answer {
            action: Option<String>,
        }
        let accepted = answered
            .and_then(|a| serde_json::from_str::<Answer>(a.get()).ok())
            .and_then(|a| a.action)
            .is_some_and(|a| a == "accept");
        Some((until, accepted))
    }

    /// Waits until the person has connected `credential` (seen in the store every replica
    /// reads), or `until`; whether they did. Accepting a URL elicitation means the person is
    /// on their way, not that they arrived.
    async fn wait_connected(&self, credential: &str, until: tokio::time::Instant) -> bool {
        let (Some(broker), Some(subject)) = (self.supervisor.credentials(), self.owner.as_deref())
        else {
            return false;
        };
        tokio::time::timeout_at(until, async {
            loop {
                match broker.value(subject, credential).await {
                    Ok(Some(_)) => return true,
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(session = %self.id, credential = %credential, "credentials: {e}");
                        return false;
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(POLL) => {}
                    () = self.closed.cancelled() => return false,
                }
            }
        })
        .await
        .unwrap_or(false)
    }

    /// Tells the client the URL elicitation `elicitation_id` is complete.
    fn connect_complete(&self, elicitation_id: &str, related: Related) {
        let complete = serde_json::json!({ "elicitationId": elicitation_id });
        let complete = RawValue::from_string(complete.to_string()).expect("serialized JSON");
        let _ = self.deliver(
            jsonrpc::request_bytes(None, "notifications/elicitation/complete", Some(&complete)),
            related,
            false,
        );
    }
}
