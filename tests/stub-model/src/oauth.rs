//! An OAuth login for the tests of caw-box's credential broker: a token endpoint that
//! rotates refresh tokens (a used one is rejected, as the vendors' are), short-lived access
//! tokens, and the check that a model request carries the access token valid now (a
//! request with an API key in a vendor's key header and no bearer token is a key's: it
//! passes, or meets `STUB_EXPECT_KEY`).
//!
//! Off unless `STUB_OAUTH=<access>,<refresh>` (the login's first tokens) is set;
//! `STUB_OAUTH_TTL` (seconds, default 3600) is how long each issued access token is valid.
//! When the first access token is a JWT (codex's ChatGPT login, OpenAI's are), the issued
//! ones are too: its header and claims with a new `exp`, and `stub-access-…` as the
//! signature (the one secret part), as the vendor issues a token of the same shape.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

#[derive(Debug)]
struct Tokens {
    /// The first access token's JWT header and claims, when it is a JWT.
    jwt: Option<(String, Value)>,
    access: String,
    refresh: String,
    /// When `access` stops being accepted.
    until: Instant,
    /// Refreshes granted, and refresh attempts rejected (a used or unknown token).
    refreshes: u64,
    rejected: u64,
    issued: u64,
    /// Set by an expiry with a hold: model requests wait on this `HOLD:` name before their
    /// token is checked.
    gate: Option<String>,
}

/// The stub's one OAuth login (see the module docs).
#[derive(Debug)]
pub struct OAuth {
    ttl: Duration,
    tokens: Mutex<Tokens>,
}

impl OAuth {
    /// From `STUB_OAUTH` and `STUB_OAUTH_TTL`; `None` when `STUB_OAUTH` is unset.
    pub fn from_env() -> Option<OAuth> {
        let first = std::env::var("STUB_OAUTH").ok()?;
        let (access, refresh) = first.split_once(',')?;
        let ttl = std::env::var("STUB_OAUTH_TTL")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(3600);
        Some(OAuth::new(access, refresh, Duration::from_secs(ttl)))
    }

    pub fn new(access: &str, refresh: &str, ttl: Duration) -> OAuth {
        OAuth {
            ttl,
            tokens: Mutex::new(Tokens {
                jwt: jwt_parts(access),
                access: access.to_string(),
                refresh: refresh.to_string(),
                until: Instant::now() + ttl,
                refreshes: 0,
                rejected: 0,
                issued: 0,
                gate: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tokens> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `bearer` is the access token valid now.
    pub fn accepts(&self, bearer: Option<&str>) -> bool {
        let t = self.lock();
        bearer == Some(t.access.as_str()) && Instant::now() < t.until
    }

    /// `POST /v1/oauth/token` (Anthropic) or `/oauth/token` (OpenAI): a JSON or form body
    /// with `grant_type=refresh_token` and `refresh_token`. The current refresh token gets
    /// new tokens (and is used up); any other gets 400 `invalid_grant`.
    pub fn token(&self, body: &[u8]) -> (u16, Value) {
        let text = String::from_utf8_lossy(body);
        let fields: Vec<(String, String)> = match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(o)) => o
                .into_iter()
                .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
                .collect(),
            _ => text
                .split('&')
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.to_string(), decode(v)))
                .collect(),
        };
        let field = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let mut t = self.lock();
        if field("grant_type") != Some("refresh_token")
            || field("refresh_token") != Some(&t.refresh)
        {
            t.rejected += 1;
            let body = json!({"error": "invalid_grant",
                              "error_description": "refresh token is invalid or was used"});
            return (400, body);
        }
        t.issued += 1;
        let n = t.issued;
        let stamp = crate::protocol::unix_millis();
        let secret = format!("stub-access-{n}-{stamp:x}");
        t.access = match &t.jwt {
            Some((header, claims)) => {
                let mut claims = claims.clone();
                claims["exp"] = ((stamp / 1000) as u64 + self.ttl.as_secs()).into();
                format!("{header}.{}.{secret}", b64().encode(claims.to_string()))
            }
            None => secret,
        };
        t.refresh = format!("stub-refresh-{n}-{stamp:x}");
        t.until = Instant::now() + self.ttl;
        t.refreshes += 1;
        let body = json!({
            "access_token": t.access,
            "refresh_token": t.refresh,
            "expires_in": self.ttl.as_secs(),
            "token_type": "Bearer",
            "scope": field("scope").unwrap_or("user:inference"),
        });
        (200, body)
    }

    /// The login as an authorization code's trade hands it out (`device`): the tokens valid
    /// now, and an identity token of the access token's claims (a JWT whose signature,
    /// `stub-id-…`, is its one secret part).
    pub fn login_tokens(&self) -> Value {
        let t = self.lock();
        let (header, claims) = t
            .jwt
            .clone()
            .unwrap_or_else(|| (b64().encode(r#"{"alg":"none","typ":"JWT"}"#), json!({})));
        let stamp = crate::protocol::unix_millis();
        let id_token = format!(
            "{header}.{}.stub-id-{stamp:x}",
            b64().encode(claims.to_string())
        );
        json!({
            "id_token": id_token,
            "access_token": t.access,
            "refresh_token": t.refresh,
            "expires_in": t.until.saturating_duration_since(Instant::now()).as_secs(),
            "token_type": "Bearer",
        })
    }

    /// `POST /_stub/oauth/expire`: the current access token stops being accepted now.
    /// With `gate` (`?hold=<name>`), model requests then wait until the test releases that
    /// name before their token is checked: released at once, they all meet the expired
    /// token together, a race for the refresh that does not depend on timing.
    pub fn expire(&self, gate: Option<&str>) {
        let mut t = self.lock();
        t.until = Instant::now();
        t.gate = gate.map(str::to_string);
    }

    /// The hold model requests wait on before their token is checked, if any.
    pub fn gate(&self) -> Option<String> {
        self.lock().gate.clone()
    }

    /// `GET /_stub/oauth`: how many refreshes were granted and rejected, and the newest
    /// refresh token (what the broker's store must end with).
    pub fn status(&self) -> Value {
        let t = self.lock();
        json!({"refreshes": t.refreshes, "rejected": t.rejected, "refresh_token": t.refresh})
    }
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

/// A JWT's header (as sent) and claims, if `token` is one.
fn jwt_parts(token: &str) -> Option<(String, Value)> {
    let mut parts = token.split('.');
    let (header, claims, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    let claims = serde_json::from_slice(&b64().decode(claims).ok()?).ok()?;
    Some((header.to_string(), claims))
}

/// Percent-decoding of a form value (`+` is a space).
pub fn decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(b)) => {
                out.push(b);
                i += 2;
            }
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_tokens_rotate_and_a_used_one_is_rejected() {
        let o = OAuth::new("a0", "r0", Duration::from_secs(60));
        assert!(o.accepts(Some("a0")));
        let (status, first) = o.token(br#"{"grant_type":"refresh_token","refresh_token":"r0"}"#);
        assert_eq!(status, 200);
        assert!(!o.accepts(Some("a0")), "the old access token is replaced");
        assert!(o.accepts(first["access_token"].as_str()));
        let (status, again) = o.token(b"grant_type=refresh_token&refresh_token=r0");
        assert_eq!(
            (status, again["error"].as_str()),
            (400, Some("invalid_grant"))
        );
        let next = format!(
            "grant_type=refresh_token&refresh_token={}&client_id=x",
            first["refresh_token"].as_str().unwrap()
        );
        assert_eq!(o.token(next.as_bytes()).0, 200);
        let s = o.status();
        assert_eq!(
            (s["refreshes"].as_u64(), s["rejected"].as_u64()),
            (Some(2), Some(1))
        );
        o.expire(None);
        assert!(!o.accepts(s["refresh_token"].as_str()));
        assert_eq!(o.gate(), None);
        o.expire(Some("expiry2"));
        assert_eq!(o.gate().as_deref(), Some("expiry2"));
    }

    #[test]
    fn a_jwt_login_gets_jwts_with_a_new_expiry_and_its_claims() {
        let claims = b64().encode(r#"{"exp":1,"chatgpt_account_id":"acct"}"#);
        let o = OAuth::new(
            &format!("eyJh.{claims}.sig0"),
            "r0",
            Duration::from_secs(60),
        );
        let (_, fresh) = o.token(br#"{"grant_type":"refresh_token","refresh_token":"r0"}"#);
        let access = fresh["access_token"].as_str().unwrap();
        assert!(o.accepts(Some(access)));
        let (header, claims) = jwt_parts(access).unwrap();
        assert_eq!(header, "eyJh");
        assert_eq!(claims["chatgpt_account_id"], "acct");
        assert!(claims["exp"].as_u64().unwrap() > 1_700_000_000, "{claims}");
        assert!(access
            .rsplit('.')
            .next()
            .unwrap()
            .starts_with("stub-access-"));
    }

    #[test]
    fn form_values_are_decoded() {
        assert_eq!(decode("a%2Fb+c"), "a/b c");
        assert_eq!(decode("100%"), "100%");
    }
}
