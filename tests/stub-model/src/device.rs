//! OpenAI's device-code login as codex and opencode run it (`codex login --device-auth`),
//! for the tests of `caw-box auth login`: a user code is asked for, the CLI polls until the
//! test approves or denies it at the stub (standing in for the person at the verification
//! page), then trades the authorization code for the login of `STUB_OAUTH` (`oauth`).
//!
//! - `POST /api/accounts/deviceauth/usercode` `{"client_id"}` →
//!   `{"device_auth_id","user_code","interval":"1"}` (404 once switched off);
//! - `POST /api/accounts/deviceauth/token` `{"device_auth_id","user_code"}` → 403
//!   `authorization_pending` until approved; then 200 `{"authorization_code",
//!   "code_challenge","code_verifier"}`; 400 `access_denied` once denied;
//! - `POST /oauth/token` with `grant_type=authorization_code` and an approved code → the
//!   login's tokens (with an `id_token`), once per code.

use std::sync::Mutex;

use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    Approved,
    Denied,
    /// Its authorization code was traded for tokens.
    Used,
}

#[derive(Debug)]
struct Device {
    id: String,
    user_code: String,
    state: State,
}

/// The device codes handed out, and whether the flow is switched off.
#[derive(Debug, Default)]
pub struct DeviceAuth {
    inner: Mutex<(Vec<Device>, bool)>,
}

/// A token request's fields, from JSON or a form.
pub(crate) fn fields(body: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(body);
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(o)) => o
            .into_iter()
            .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
            .collect(),
        _ => text
            .split('&')
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_string(), crate::oauth::decode(v)))
            .collect(),
    }
}

pub(crate) fn field<'a>(fields: &'a [(String, String)], key: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Whether a token request trades an authorization code (not a refresh).
pub fn is_code_grant(body: &[u8]) -> bool {
    field(&fields(body), "grant_type") == Some("authorization_code")
}

impl DeviceAuth {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<Device>, bool)> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `POST /api/accounts/deviceauth/usercode`.
    pub fn user_code(&self) -> (u16, Value) {
        let mut inner = self.lock();
        if inner.1 {
            return (404, json!({"error": "not_found"}));
        }
        let n = inner.0.len() + 1;
        let stamp = crate::protocol::unix_millis();
        let device = Device {
            id: format!("deviceauth-{n}-{stamp:x}"),
            user_code: format!("{:04X}-{n:05}", (stamp & 0xffff) as u16),
            state: State::Pending,
        };
        let body = json!({"device_auth_id": device.id, "user_code": device.user_code,
                          "interval": "1"});
        inner.0.push(device);
        (200, body)
    }

    /// `POST /api/accounts/deviceauth/token`: the poll.
    pub fn poll(&self, body: &[u8]) -> (u16, Value) {
        let f = fields(body);
        let inner = self.lock();
        let found = inner.0.iter().find(|d| {
            Some(d.id.as_str()) == field(&f, "device_auth_id")
                && Some(d.user_code.as_str()) == field(&f, "user_code")
        });
        match found.map(|d| (d, d.state)) {
            Some((_, State::Pending)) => (403, json!({"error": "authorization_pending"})),
            Some((d, State::Approved)) => (
                200,
                json!({"authorization_code": format!("ac-{}", d.id),
                       "code_challenge": "stub-challenge", "code_verifier": "stub-verifier"}),
            ),
            Some((_, State::Denied)) => (400, json!({"error": "access_denied"})),
            Some((_, State::Used)) | None => (400, json!({"error": "invalid_grant"})),
        }
    }

    /// `POST /oauth/token` with an authorization code: the login's tokens, once per
    /// approved code (`tokens` gives them).
    pub fn exchange(&self, body: &[u8], tokens: impl FnOnce() -> Value) -> (u16, Value) {
        let f = fields(body);
        let mut inner = self.lock();
        let code = field(&f, "code").unwrap_or_default();
        let device = inner
            .0
            .iter_mut()
            .find(|d| format!("ac-{}", d.id) == code && d.state == State::Approved);
        match device {
            Some(d) if field(&f, "code_verifier") == Some("stub-verifier") => {
                d.state = State::Used;
                (200, tokens())
            }
            _ => (400, json!({"error": "invalid_grant"})),
        }
    }

    /// `POST /_stub/device/{approve,deny}?code=<user code>` (the newest code when none is
    /// named); `POST /_stub/device/disable` switches the flow off.
    pub fn control(&self, action: &str, code: Option<&str>) -> Option<Value> {
        let mut inner = self.lock();
        if action == "disable" {
            inner.1 = true;
            return Some(json!({"disabled": true}));
        }
        let state = match action {
            "approve" => State::Approved,
            "deny" => State::Denied,
            _ => return None,
        };
        let d = match code {
            Some(c) => inner.0.iter_mut().find(|d| d.user_code == c)?,
            None => inner.0.last_mut()?,
        };
        if d.state != State::Pending {
            return None;
        }
        d.state = state;
        Some(json!({"user_code": d.user_code, "state": action}))
    }

    /// `GET /_stub/device`: the codes and their states.
    pub fn status(&self) -> Value {
        let inner = self.lock();
        let codes: Vec<Value> = inner
            .0
            .iter()
            .map(|d| json!({"user_code": d.user_code, "state": format!("{:?}", d.state)}))
            .collect();
        json!({"codes": codes, "disabled": inner.1})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_is_pending_until_approved_and_trades_once() {
        let d = DeviceAuth::default();
        let (_, uc) = d.user_code();
        let poll = json!({"device_auth_id": uc["device_auth_id"], "user_code": uc["user_code"]})
            .to_string();
        assert_eq!(d.poll(poll.as_bytes()).0, 403);
        assert!(d.control("approve", uc["user_code"].as_str()).is_some());
        let (status, code) = d.poll(poll.as_bytes());
        assert_eq!(status, 200);
        let form = format!(
            "grant_type=authorization_code&code={}&code_verifier=stub-verifier",
            code["authorization_code"].as_str().unwrap()
        );
        assert!(is_code_grant(form.as_bytes()));
        assert_eq!(d.exchange(form.as_bytes(), || json!({"ok": 1})).0, 200);
        assert_eq!(d.exchange(form.as_bytes(), || json!({"ok": 1})).0, 400);
    }

    #[test]
    fn a_denied_code_ends_the_poll_and_a_disabled_flow_has_no_codes() {
        let d = DeviceAuth::default();
        let (_, uc) = d.user_code();
        d.control("deny", None).unwrap();
        let poll = json!({"device_auth_id": uc["device_auth_id"], "user_code": uc["user_code"]})
            .to_string();
        assert_eq!(d.poll(poll.as_bytes()).0, 400);
        d.control("disable", None).unwrap();
        assert_eq!(d.user_code().0, 404);
    }
}
