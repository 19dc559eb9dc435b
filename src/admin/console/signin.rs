//! Who is signed in to the console: the admin token, given once at sign-in, exchanged for a
//! random session id in an `HttpOnly`, `SameSite=Strict` cookie scoped to `/ui`, and a CSRF
//! token of its own that every change must send back in `X-CSRF-Token`. Sessions live in
//! memory (a restart signs everyone out), end after twelve hours or at sign-out, and are
//! bounded in number. Failed sign-ins are throttled per address with the admin API's
//! (`admin::guard`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The cookie's name.
pub const COOKIE: &str = "mcp_gateway_console";
/// How long a sign-in lasts.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Most console sessions at once: the oldest goes first.
const MAX_SESSIONS: usize = 64;

/// One signed-in browser.
#[derive(Debug, Clone)]
pub struct Signed {
    pub csrf: String,
    expires: Instant,
}

/// The console's sessions.
#[derive(Default)]
pub struct SignIns {
    sessions: Mutex<HashMap<String, Signed>>,
}

fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl SignIns {
    /// A new session: its id (for the cookie) and what it holds.
    pub fn open(&self) -> (String, Signed) {
        let id = random_hex();
        let signed = Signed {
            csrf: random_hex(),
            expires: Instant::now() + LIFETIME,
        };
        let mut sessions = self.sessions.lock().expect("console sessions lock");
        let now = Instant::now();
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(id.clone(), signed.clone());
        (id, signed)
    }

    /// The session a cookie names, if it is signed in.
    pub fn get(&self, id: &str) -> Option<Signed> {
        let sessions = self.sessions.lock().expect("console sessions lock");
        sessions
            .get(id)
            .filter(|s| s.expires > Instant::now())
            .cloned()
    }

    pub fn close(&self, id: &str) {
        self.sessions
            .lock()
            .expect("console sessions lock")
            .remove(id);
    }
}

/// The console session id in a request's `Cookie` headers.
pub fn cookie(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_bounded_and_closed() {
        let s = SignIns::default();
        let (first, _) = s.open();
        assert!(s.get(&first).is_some());
        for _ in 0..MAX_SESSIONS {
            s.open();
        }
        assert!(s.get(&first).is_none(), "the oldest went first");
        let (id, signed) = s.open();
        assert_eq!(s.get(&id).unwrap().csrf, signed.csrf);
        s.close(&id);
        assert!(s.get(&id).is_none());
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut h = axum::http::HeaderMap::new();
        h.append(
            "cookie",
            "a=1; mcp_gateway_console=abc; b=2".parse().unwrap(),
        );
        assert_eq!(cookie(&h), Some("abc"));
        let mut h = axum::http::HeaderMap::new();
        h.append("cookie", "mcp_gateway_consoleX=1".parse().unwrap());
        assert_eq!(cookie(&h), None);
    }
}
