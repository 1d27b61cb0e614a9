//! The paste-code logins, for the tests of `caw-box auth login`: the test stands in for the
//! person at the vendor's page (it hands the stub the URL the CLI printed and gets back the
//! code the browser would show once approved, or one the vendor then refuses), then the CLI
//! trades the code at the token endpoint and reads the account it belongs to. Two vendors:
//!
//! Anthropic's, as `claude auth login` runs it (claude 2.1.332; `/_stub/claude/…`):
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
//!
//! Google's, as gemini's manual code flow runs it (gemini 0.61.0, `NO_BROWSER=true`;
//! `/_stub/google/…`):
//! - the URL the CLI prints: `https://accounts.google.com/o/oauth2/v2/auth?redirect_uri=
//!   https://codeassist.google.com/authcode&access_type=offline&scope=…&code_challenge_method=
//!   S256&code_challenge=…&state=…&response_type=code&client_id=…`; the page shows the code
//!   alone;
//! - `POST oauth2.googleapis.com/token` (form) `grant_type=authorization_code&code&
//!   code_verifier&redirect_uri&client_id&client_secret` → `{"access_token","expires_in",
//!   "refresh_token","scope","token_type"}`; a refused code gets 400 `invalid_grant`;
//! - `GET www.googleapis.com/oauth2/v2/userinfo` with the access token → the account's
//!   `email` (which gemini keeps in `~/.gemini/google_accounts.json`).

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

/// Whose login: what the page shows and what the token endpoint answers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    #[default]
    Anthropic,
    Google,
}

/// The codes handed out to the test's "browser".
#[derive(Debug, Default)]
pub struct PasteAuth {
    vendor: Vendor,
    codes: Mutex<Vec<Code>>,
}

/// The PKCE challenge and state of an authorize URL the CLI printed (claude's short or full
/// form, Google's).
pub fn parse_authorize_url(url: &str) -> Option<(String, Option<String>)> {
    let (_, query) = url
        .split_once("/oauth/authorize?")
        .or_else(|| url.split_once("/o/oauth2/v2/auth?"))?;
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

impl PasteAuth {
    pub fn new(vendor: Vendor) -> Self {
        PasteAuth {
            vendor,
            codes: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Code>> {
        self.codes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `POST /_stub/{claude,google}/{approve,deny}?url=<the URL the CLI printed>`: what the
    /// browser shows at the end, `{"code": "<code>#<state>"}` (Anthropic's) or `{"code":
    /// "<code>"}` (Google's); a denied one is refused at the token endpoint.
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
        let shown = match self.vendor {
            Vendor::Anthropic => format!("{code}#{state}"),
            Vendor::Google => code,
        };
        Some(json!({"code": shown}))
    }

    /// `POST /v1/oauth/token` (Anthropic's, JSON) or `POST /token` (Google's, a form) with
    /// `grant_type=authorization_code`: `tokens` (access and refresh token, seconds left) for
    /// an approved, unused code whose challenge the verifier meets.
    pub fn exchange(
        &self,
        body: &[u8],
        tokens: impl FnOnce() -> (String, String, u64),
    ) -> (u16, Value) {
        let fields = crate::device::fields(body);
        let field = |k: &str| crate::device::field(&fields, k).unwrap_or_default();
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
        if self.vendor == Vendor::Google {
            let scope = "https://www.googleapis.com/auth/cloud-platform \
                https://www.googleapis.com/auth/userinfo.email \
                https://www.googleapis.com/auth/userinfo.profile openid";
            let body = json!({"access_token": access, "expires_in": expires_in,
                              "refresh_token": refresh, "scope": scope, "token_type": "Bearer"});
            return (200, body);
        }
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

    /// `GET /oauth2/v2/userinfo` (Google's).
    pub fn userinfo() -> Value {
        json!({"id": "100000000000000000001", "email": "stub@example.invalid",
               "verified_email": true, "picture": ""})
    }

    /// `GET /api/oauth/claude_cli/roles`.
    pub fn roles() -> Value {
        json!({"organization_role": "admin", "workspace_role": null, "organization_name": "Stub Org"})
    }

    /// `GET /_stub/{claude,google}`: the codes and whether each was traded.
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
        let a = PasteAuth::default();
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
        let a = PasteAuth::default();
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

    #[test]
    fn googles_page_shows_the_code_alone_and_its_form_trades_it() {
        let a = PasteAuth::new(Vendor::Google);
        let verifier = "g".repeat(43);
        let url = format!(
            "https://accounts.google.com/o/oauth2/v2/auth?redirect_uri=https%3A%2F%2Fcodeassist.google.com%2Fauthcode&code_challenge_method=S256&code_challenge={}&state=ab12&response_type=code",
            challenge_of(&verifier)
        );
        let code = a.control("approve", &url).unwrap()["code"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(!code.contains('#'), "{code}");
        let form = format!("grant_type=authorization_code&code={code}&code_verifier={verifier}");
        let (status, got) = a.exchange(form.as_bytes(), || ("a".into(), "r".into(), 60));
        assert_eq!((status, got["refresh_token"].as_str()), (200, Some("r")));
        assert!(got.get("account").is_none(), "{got}");
    }
}
