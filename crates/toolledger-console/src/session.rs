//! Console sessions, in memory: a random session id in an `HttpOnly`, `SameSite=Strict`
//! cookie names the principal who logged in, the id of the bearer token they logged in with,
//! and the CSRF token of every form they are shown. Sessions end after [`SESSION_SECS`], on
//! logout, when their token is revoked or their principal deactivated (checked on every
//! request), and when the process restarts. A principal holds at most
//! [`MAX_SESSIONS_PER_PRINCIPAL`] at once: a further login ends that principal's oldest one.
//!
//! The login form's CSRF token is issued here too ([`LoginForms`]): it is accepted only if
//! this process issued it, within [`LOGIN_FORM_SECS`], once — a cookie another page managed to
//! set is not enough.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "toolledger_console";
/// The cookie that carries the login form's CSRF token before there is a session.
pub const LOGIN_COOKIE: &str = "toolledger_console_login";
/// How long a session lasts after login (8 hours).
pub const SESSION_SECS: u64 = 8 * 3600;
/// The most sessions one principal holds at once; its oldest ends at the next login.
pub const MAX_SESSIONS_PER_PRINCIPAL: usize = 16;
/// How long a login form's CSRF token is accepted after the form was served (1 hour).
pub const LOGIN_FORM_SECS: u64 = 3600;
/// The most login forms outstanding at once; the oldest is forgotten beyond it.
const MAX_LOGIN_FORMS: usize = 10_000;

/// One logged-in principal.
#[derive(Clone, Debug)]
pub struct Session {
    /// The principal's name (re-read from the principal store on every request).
    pub principal: String,
    /// The id of the bearer token the session was opened with
    /// (`toolledger::authz::token_id`): the session ends when that token is revoked.
    pub token_id: String,
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
    /// A new session for `principal`, opened with its token `token_id`; returns its id. When
    /// the principal already holds [`MAX_SESSIONS_PER_PRINCIPAL`] sessions, its oldest ends;
    /// no other principal's session is touched.
    pub fn start(&self, principal: &str, token_id: &str) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut map = self.map.lock().expect("sessions lock");
        map.retain(|_, s| s.expires > now);
        let mut own: Vec<(Instant, String)> = map
            .iter()
            .filter(|(_, s)| s.principal == principal)
            .map(|(k, s)| (s.expires, k.clone()))
            .collect();
        if own.len() >= MAX_SESSIONS_PER_PRINCIPAL {
            own.sort();
            for (_, oldest) in own.iter().take(own.len() + 1 - MAX_SESSIONS_PER_PRINCIPAL) {
                map.remove(oldest);
            }
        }
        map.insert(
            id.clone(),
            Session {
                principal: principal.to_string(),
                token_id: token_id.to_string(),
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

/// The login forms this console served and whose CSRF token was not used yet.
#[derive(Debug, Default)]
pub struct LoginForms {
    issued: Mutex<LoginFormsInner>,
}

#[derive(Debug, Default)]
struct LoginFormsInner {
    expiry: HashMap<String, Instant>,
    order: VecDeque<String>,
}

impl LoginForms {
    /// A new login form's CSRF token, remembered until it is used or [`LOGIN_FORM_SECS`] pass.
    pub fn issue(&self) -> String {
        let token = random_token();
        let now = Instant::now();
        let mut inner = self.issued.lock().expect("login forms lock");
        while let Some(front) = inner.order.front() {
            let stale = inner.expiry.get(front).is_none_or(|e| *e <= now);
            if !stale && inner.expiry.len() < MAX_LOGIN_FORMS {
                break;
            }
            if let Some(front) = inner.order.pop_front() {
                inner.expiry.remove(&front);
            }
        }
        inner
            .expiry
            .insert(token.clone(), now + Duration::from_secs(LOGIN_FORM_SECS));
        inner.order.push_back(token.clone());
        token
    }

    /// Whether `token` is a login form's CSRF token this console issued and that is still
    /// valid; it is used up either way.
    pub fn take(&self, token: &str) -> bool {
        let mut inner = self.issued.lock().expect("login forms lock");
        match inner.expiry.remove(token) {
            Some(expires) => {
                inner.order.retain(|t| t != token);
                expires > Instant::now()
            }
            None => false,
        }
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
        let id = s.start("olga", "tok_1");
        let got = s.get(&id).unwrap();
        assert_eq!(got.principal, "olga");
        assert_eq!(got.token_id, "tok_1");
        assert_eq!(got.csrf.len(), 64);
        assert!(s.get("other").is_none());
        s.end(&id);
        assert!(s.get(&id).is_none());
    }

    /// Logging in again and again ends only the same principal's oldest sessions: another
    /// principal's session survives any number of them.
    #[test]
    fn logins_of_one_principal_never_end_another_principals_session() {
        let s = Sessions::default();
        let bob = s.start("bob", "tok_b");
        let first = s.start("mallory", "tok_m");
        let mut latest = Vec::new();
        for _ in 0..10_000 {
            latest.push(s.start("mallory", "tok_m"));
        }
        assert!(s.get(&bob).is_some(), "bob's session was evicted");
        assert!(s.get(&first).is_none(), "mallory's oldest session stays");
        let live = latest.iter().filter(|id| s.get(id).is_some()).count();
        assert_eq!(live, MAX_SESSIONS_PER_PRINCIPAL);
        for id in &latest[latest.len() - MAX_SESSIONS_PER_PRINCIPAL..] {
            assert!(s.get(id).is_some(), "a newest session ended");
        }
    }

    #[test]
    fn a_login_form_token_is_accepted_once_and_only_if_issued() {
        let forms = LoginForms::default();
        let token = forms.issue();
        assert!(
            !forms.take(&random_token()),
            "a token this console never issued"
        );
        assert!(forms.take(&token));
        assert!(!forms.take(&token), "a token is used once");
    }

    #[test]
    fn comparison_needs_equal_strings() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }
}
