//! Console sessions, in memory: a random session id in an `HttpOnly`, `SameSite=Strict`
//! cookie names the principal who logged in and the CSRF token of every form they are shown.
//! Sessions end after [`SESSION_SECS`], on logout, and when the process restarts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "toolledger_console";
/// The cookie that carries the login form's CSRF token before there is a session.
pub const LOGIN_COOKIE: &str = "toolledger_console_login";
/// How long a session lasts after login (8 hours).
pub const SESSION_SECS: u64 = 8 * 3600;
/// The most sessions held at once; the oldest is dropped beyond it.
const MAX_SESSIONS: usize = 10_000;

/// One logged-in principal.
#[derive(Clone, Debug)]
pub struct Session {
    /// The principal's name (re-read from the principal store on every request).
    pub principal: String,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
    expires: Instant,
}

/// The sessions of one console.
#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

/// 32 random bytes, hex.
pub fn random_token() -> String {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the operating system's random source");
    hex::encode(b)
}

/// Whether `a` equals `b`, in time independent of where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The value of cookie `name` in `headers`.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value for `name=value` on the console's paths, `HttpOnly` and
/// `SameSite=Strict`, lasting `max_age` seconds (0 deletes it).
pub fn set_cookie(name: &str, value: &str, max_age: u64) -> String {
    format!("{name}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age}")
}

impl Sessions {
    /// A new session for `principal`; returns its id.
    pub fn start(&self, principal: &str) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut map = self.map.lock().expect("sessions lock");
        map.retain(|_, s| s.expires > now);
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(
            id.clone(),
            Session {
                principal: principal.to_string(),
                csrf: random_token(),
                expires: now + Duration::from_secs(SESSION_SECS),
            },
        );
        id
    }

    /// The live session `id` names.
    pub fn get(&self, id: &str) -> Option<Session> {
        let mut map = self.map.lock().expect("sessions lock");
        match map.get(id) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                map.remove(id);
                None
            }
            None => None,
        }
    }

    /// Ends session `id`.
    pub fn end(&self, id: &str) {
        self.map.lock().expect("sessions lock").remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; toolledger_console_login=x; toolledger_console=sid"
                .parse()
                .unwrap(),
        );
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("sid"));
        assert_eq!(cookie(&h, LOGIN_COOKIE), Some("x"));
        assert_eq!(cookie(&h, "b"), None);
    }

    #[test]
    fn a_session_is_found_until_it_ends() {
        let s = Sessions::default();
        let id = s.start("olga");
        let got = s.get(&id).unwrap();
        assert_eq!(got.principal, "olga");
        assert_eq!(got.csrf.len(), 64);
        assert!(s.get("other").is_none());
        s.end(&id);
        assert!(s.get(&id).is_none());
    }

    #[test]
    fn comparison_needs_equal_strings() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }
}
