//! Anthropic's paste-code login as `claude auth login` runs it (claude 2.1.332), for the
//! tests of `caw-box auth login --provider claude`: the test stands in for the person at
//! claude.ai (it hands the stub the URL the CLI printed and gets back the `code#state` the
//! browser would show once approved, or one the vendor then refuses), then the CLI trades
//! the code at the token endpoint and reads the account it belongs to.
//!
//! - the URL the CLI prints: `https://claude.ai/oauth/authorize?<flags><code_challenge>`
//!   (the CLI's short form: the client and scopes packed into a few characters before the
//!   43-character PKCE challenge; no state) or, with `CLAUDE_CODE_FULL_SIGN_IN_LINK`, the
//!   full authorize URL with `code_challenge` and `state` parameters;
//! - `POST /v1/oauth/token` (JSON) `{"grant_type":"authorization_code","code","state",
//!   "code_verifier","redirect_uri","client_id"}` → the login's tokens (`access_token`,
//!   `refresh_token`, `expires_in`, `scope`, `account`, `organization`), once per approved
//!   code whose challenge is the verifier's SHA-256; a refused code gets 400 `invalid_grant`;
//! - `GET /api/oauth/profile` and `GET /api/oauth/claude_cli/roles` with the access token:
//!   the account and organization (a Max plan), and the roles in it.

use std::sync::Mutex;

use base64::Engine;
use serde_json::{json, Value};

/// The scopes a claude.ai login is granted (the CLI's own list less `org:create_api_key`).
const SCOPES: &str =
    "user:profile user:inference user:sessions:claude_code user:mcp_servers user:file_upload";
const ACCOUNT: &str = "5e1f3c1a-0000-4000-8000-00000000acc7";
const ORGANIZATION: &str = "5e1f3c1a-0000-4000-8000-0000000000a9";

#[derive(Debug)]
struct Code {
    code: String,
    challenge: String,
    approved: bool,
    used: bool,
}

/// The codes handed out to the test's "browser".
#[derive(Debug, Default)]
pub struct ClaudeAuth {
    codes: Mutex<Vec<Code>>,
}

/// The PKCE challenge and state of an authorize URL the CLI printed (short or full form).
pub fn parse_authorize_url(url: &str) -> Option<(String, Option<String>)> {
    let (_, query) = url.split_once("/oauth/authorize?")?;
    let params: Vec<(&str, String)> = query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k, crate::oauth::decode(v)))
        .collect();
    let param = |k: &str| params.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    if let Some(challenge) = param("code_challenge") {
        return Some((challenge, param("state")));
    }
    let packed = query.split('&').next()?;
    let challenge = packed.get(packed.len().checked_sub(43)?..)?;
    let ok = challenge
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    ok.then(|| (challenge.to_string(), None))
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

/// The PKCE challenge (S256) of `verifier`.
pub fn challenge_of(verifier: &str) -> String {
    b64().encode(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()).as_ref())
}

impl ClaudeAuth {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Code>> {
        self.codes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `POST /_stub/claude/{approve,deny}?url=<the URL the CLI printed>`: what the browser
    /// shows at the end, `{"code": "<code>#<state>"}`; a denied one is refused at the token
    /// endpoint.
    pub fn control(&self, action: &str, url: &str) -> Option<Value> {
        let approved = match action {
            "approve" => true,
            "deny" => false,
            _ => return None,
        };
        let (challenge, state) = parse_authorize_url(url)?;
        let mut codes = self.lock();
        let n = codes.len() + 1;
        let stamp = crate::protocol::unix_millis();
        let code = format!("stub-ac-{n}-{stamp:x}");
        let state = state.unwrap_or_else(|| format!("stub-state-{n}"));
        codes.push(Code {
            code: code.clone(),
            challenge,
            approved,
            used: false,
        });
        Some(json!({"code": format!("{code}#{state}")}))
    }

    /// `POST /v1/oauth/token` with `grant_type=authorization_code`: `tokens` (access and
    /// refresh token, seconds left) for an approved, unused code whose challenge the verifier
    /// meets.
    pub fn exchange(
        &self,
        body: &[u8],
        tokens: impl FnOnce() -> (String, String, u64),
    ) -> (u16, Value) {
        let v: Value = serde_json::from_slice(body).unwrap_or_default();
        let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default();
        let mut codes = self.lock();
        let found = codes.iter_mut().find(|c| c.code == field("code"));
        let refused = || {
            let body = json!({"error": "invalid_grant",
                              "error_description": "Invalid 'code' in request."});
            (400, body)
        };
        let Some(c) = found else { return refused() };
        if !c.approved || c.used || challenge_of(field("code_verifier")) != c.challenge {
            return refused();
        }
        c.used = true;
        let (access, refresh, expires_in) = tokens();
        let body = json!({
            "token_type": "Bearer",
            "access_token": access,
            "refresh_token": refresh,
            "expires_in": expires_in,
            "scope": SCOPES,
            "account": {"uuid": ACCOUNT, "email_address": "stub@example.invalid"},
            "organization": {"uuid": ORGANIZATION, "name": "Stub Org"},
        });
        (200, body)
    }

    /// `GET /api/oauth/profile`.
    pub fn profile() -> Value {
        json!({
            "account": {"uuid": ACCOUNT, "email": "stub@example.invalid",
                        "display_name": "Stub", "full_name": "Stub User",
                        "created_at": "2025-01-01T00:00:00Z"},
            "organization": {"uuid": ORGANIZATION, "name": "Stub Org",
                             "organization_type": "claude_max", "rate_limit_tier": "default_claude_max_20x",
                             "billing_type": "stripe_subscription", "has_extra_usage_enabled": false,
                             "subscription_created_at": "2025-01-01T00:00:00Z"},
        })
    }

    /// `GET /api/oauth/claude_cli/roles`.
    pub fn roles() -> Value {
        json!({"organization_role": "admin", "workspace_role": null, "organization_name": "Stub Org"})
    }

    /// `GET /_stub/claude`: the codes and whether each was traded.
    pub fn status(&self) -> Value {
        let codes: Vec<Value> = self
            .lock()
            .iter()
            .map(|c| json!({"approved": c.approved, "used": c.used}))
            .collect();
        json!({"codes": codes})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_approved_code_trades_once_against_its_verifier() {
        let a = ClaudeAuth::default();
        let verifier = "v".repeat(43);
        let url = format!(
            "https://claude.ai/oauth/authorize?z-W{}",
            challenge_of(&verifier)
        );
        let code = a.control("approve", &url).unwrap()["code"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, state) = code.split_once('#').unwrap();
        assert!(state.starts_with("stub-state-"));
        let body = |v: &str| {
            json!({"grant_type": "authorization_code", "code": code, "code_verifier": v})
                .to_string()
        };
        let tokens = || ("a".to_string(), "r".to_string(), 60);
        assert_eq!(a.exchange(body("wrong").as_bytes(), tokens).0, 400);
        let (status, got) = a.exchange(body(&verifier).as_bytes(), tokens);
        assert_eq!((status, got["refresh_token"].as_str()), (200, Some("r")));
        assert_eq!(a.exchange(body(&verifier).as_bytes(), tokens).0, 400);
    }

    #[test]
    fn a_denied_code_is_refused_and_a_full_url_keeps_its_state() {
        let a = ClaudeAuth::default();
        let verifier = "w".repeat(43);
        let url = format!(
            "https://claude.com/cai/oauth/authorize?code=true&code_challenge={}&state=st8",
            challenge_of(&verifier)
        );
        let code = a.control("deny", &url).unwrap()["code"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(code.ends_with("#st8"), "{code}");
        let body =
            json!({"code": code.split('#').next().unwrap(), "code_verifier": verifier}).to_string();
        assert_eq!(
            a.exchange(body.as_bytes(), || ("a".into(), "r".into(), 1))
                .0,
            400
        );
        assert!(parse_authorize_url("https://claude.ai/oauth/authorize?short").is_none());
    }
}
