//! Per-provider credential specs: the data under auth/ (compiled in), parsed. Pure: where
//! credentials live on a host and where they go under the agent's HOME. No I/O here.

use serde::Deserialize;

use crate::provider::ProviderKind;

#[derive(Debug, Clone, Deserialize)]
pub struct Spec {
    pub provider: ProviderKind,
    #[serde(default)]
    pub files: Vec<FileSource>,
    #[serde(default)]
    pub keyring: Vec<KeyringSource>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub derived_env: Vec<DerivedEnv>,
    /// The CLI's non-secret user-level setup that `--user-config` copies (see
    /// `auth::user_config`).
    #[serde(default)]
    pub user_config: Vec<UserConfigSource>,
    /// How the credential broker stands in for this CLI's API key.
    pub broker: BrokerSpec,
    /// How the broker stands in for this CLI's OAuth login and refreshes it; `None`: the
    /// login cannot be brokered (it stays injected).
    #[serde(default)]
    pub oauth: Option<OAuthSpec>,
    /// How `caw-box auth login` logs in with the vendor's own CLI (`auth::login_flow`).
    pub login: LoginSpec,
}

/// The vendor's own headless login, as `caw-box auth login` runs it in a short-lived
/// container of the provider's image (evidence and the vendors' flows: docs/credentials.md).
#[derive(Debug, Clone, Deserialize)]
pub struct LoginSpec {
    /// The variable a key from `--with-api-key` is stored as.
    pub api_key_env: String,
    /// The CLI's login command; empty: no headless flow that finishes in a container.
    #[serde(default)]
    pub argv: Vec<String>,
    /// Why there is none, and what to do instead (when `argv` is empty).
    #[serde(default)]
    pub unavailable: Option<String>,
    /// The hosts the flow reaches (`host:port`): the login's only egress.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// The variables that make the CLI trust an extra CA (`--ca-cert`): a file's path.
    #[serde(default)]
    pub ca_env: Vec<String>,
    /// Other variables the flow needs (`KEY=VALUE`, no secret).
    #[serde(default)]
    pub env: Vec<String>,
    /// The files under HOME the CLI writes the login to: what is stored.
    #[serde(default)]
    pub files: Vec<String>,
    /// The CLI's HOME for `files` when it is not the image's: the login's private directory
    /// (`/run/caw-box-login`), where `env` points the CLI (gemini's `GEMINI_CLI_HOME`), so
    /// that `config_files` are its own settings there.
    #[serde(default)]
    pub home: Option<String>,
    /// Texts of the CLI's output that mean the vendor has this flow switched off for the
    /// account or workspace, and the one line saying so.
    #[serde(default)]
    pub disabled: Vec<String>,
    #[serde(default)]
    pub disabled_message: Option<String>,
    /// A paste-code flow (claude's, gemini's): the CLI prints a URL and reads the code the
    /// vendor's page shows from its stdin, which caw-box forwards; `None`: a device-code
    /// flow (the code is entered at the vendor's page, the CLI polls).
    #[serde(default)]
    pub paste_code: Option<PasteCodeSpec>,
    /// The CLI runs its flow only on a terminal (gemini's manual code flow is part of its
    /// interactive UI): the container gets one.
    #[serde(default)]
    pub tty: bool,
    /// Files the CLI reads (`path` → contents, no secret), put in the login's private
    /// directory (`/run/caw-box-login`) before it starts: a settings file naming the flow.
    #[serde(default)]
    pub config_files: std::collections::BTreeMap<String, String>,
    /// The CLI does not exit after its login (gemini goes on into its UI): the flow is done
    /// once the first of `files` is written whole, and caw-box then ends the container.
    #[serde(default)]
    pub stays: bool,
}

/// How a paste-code flow asks for the code.
#[derive(Debug, Clone, Deserialize)]
pub struct PasteCodeSpec {
    /// The prompt the CLI prints before the code, with no line end (taken off the line
    /// that follows it).
    pub prompt: String,
    /// The page shows `code#state` (claude's), not a code alone (Google's).
    #[serde(default)]
    pub with_state: bool,
    /// Texts of the CLI's output that mean the vendor refused the code (or the CLI gave up
    /// waiting for it): the flow ends there, where the CLI would ask again.
    #[serde(default)]
    pub refused: Vec<String>,
}

/// A vendor's OAuth login as the broker holds it (evidence: tests/fixtures/README.md).
#[derive(Debug, Clone, Deserialize)]
pub struct OAuthSpec {
    /// The login file (its target under HOME).
    pub target: String,
    /// Where the CLI sends the access token (as `Bearer`).
    pub places: Vec<String>,
    /// The token endpoint refresh posts to.
    pub token_url: String,
    /// The CLI's OAuth client id, sent with each refresh, and the client secret where the
    /// vendor's installed-app client has one (Google's; published in the CLI's source, so
    /// no secret of the user's).
    pub client_id: String,
    #[serde(default)]
    pub client_secret: Option<String>,
    /// The refresh body's encoding: `json` or `form`.
    pub body: String,
    /// Dotted JSON paths in the login file.
    pub access: String,
    pub refresh: String,
    /// Where the expiry sits: a number (`expiry_unit` `ms` or `s`, epoch), or, with
    /// `expiry_unit` `jwt`, the JWT whose `exp` claim it is (then the access token's path).
    pub expiry: String,
    pub expiry_unit: String,
    /// A JWT identity token the CLI decodes (its claims kept in the placeholder's).
    #[serde(default)]
    pub id_token: Option<String>,
    /// When the CLI last refreshed (RFC 3339): set to now, so it does not refresh by age.
    #[serde(default)]
    pub last_refresh: Option<String>,
    /// The model API a login is used with, when not the API key's (no `--endpoint`), and
    /// the path prefix the CLI puts before its paths (replaced by the upstream's path).
    #[serde(default)]
    pub upstream: Option<String>,
    #[serde(default)]
    pub cli_prefix: Option<String>,
    /// Where the login lists its scopes (sent back on refresh), and the CLI's default.
    #[serde(default)]
    pub scopes: Option<String>,
    #[serde(default)]
    pub default_scope: Option<String>,
    /// Other credentials the login file may hold beside the login (codex keeps an API key
    /// there): `null` in the placeholder file (the key reaches the CLI, brokered, through
    /// `derived_env`).
    #[serde(default)]
    pub clear: Vec<String>,
    /// The placeholder access token's prefix (the shape of the vendor's tokens).
    pub placeholder_prefix: String,
    /// Where the CLI gets the placeholder: this variable (gemini's
    /// `GOOGLE_CLOUD_ACCESS_TOKEN`: a file login makes gemini check it with Google first)
    /// instead of a placeholder login file.
    #[serde(default)]
    pub placeholder_env: Option<String>,
    /// Other files of the provider that may come with the login, holding no credential
    /// (gemini's `google_accounts.json`, an e-mail address): injected as they are, beside a
    /// brokered login.
    #[serde(default)]
    pub companions: Vec<String>,
    /// Whether logins are brokered (`false`: the data is known, the login stays injected;
    /// why, in tests/fixtures/README.md).
    #[serde(default = "yes")]
    pub brokered: bool,
    /// Hosts the CLI reaches directly with a login, whatever its configuration (opencode's
    /// built-in ChatGPT plugin posts to `chatgpt.com`): the turn's own broker stands in for
    /// them with a certificate of a CA made for the turn, which only that turn's container
    /// trusts (`NODE_EXTRA_CA_CERTS`), and the container resolves them to the broker.
    #[serde(default)]
    pub intercept: Vec<String>,
}

fn yes() -> bool {
    true
}

/// The broker's data of a vendor in API-key mode (evidence: tests/fixtures/README.md).
#[derive(Debug, Clone, Deserialize)]
pub struct BrokerSpec {
    /// The vendor's API base when the session has no `--endpoint`.
    pub upstream: String,
    /// Where the CLI sends its key: header names (lower case), or `query:<name>`.
    pub key_places: Vec<String>,
}

/// A file or directory of the user's own CLI setup (instructions, skills, settings).
#[derive(Debug, Clone, Deserialize)]
pub struct UserConfigSource {
    /// Host path; `~` and `${VAR:-default}` are expanded. A directory is copied whole.
    pub source: String,
    /// Path under the agent's HOME.
    pub target: String,
    /// What it is for, in a few words (shown by `--user-config`).
    pub what: String,
    /// A JSON settings file: merged into the session's own, with `drop` and every
    /// credential-shaped key removed first.
    #[serde(default)]
    pub json: bool,
    /// Dotted JSON paths removed before the copy (credential helpers, the auth choice).
    #[serde(default)]
    pub drop: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FileSource {
    /// Host path; `~` and `${VAR:-default}` are expanded.
    pub source: String,
    /// Path under the agent's HOME.
    pub target: String,
    #[serde(default)]
    pub expiry: Option<Expiry>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct KeyringSource {
    pub service: String,
    /// The variable whose value selects a hashed variant of the service name.
    #[serde(default)]
    pub hashed_by: Option<String>,
    pub target: String,
    #[serde(default)]
    pub expiry: Option<Expiry>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DerivedEnv {
    /// A collected file (its target under HOME).
    pub file: String,
    /// A JSON path in it.
    pub json: String,
    pub env: String,
}

/// Where a credential states its own expiry.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Expiry {
    Json {
        json: String,
        #[serde(default = "default_unit")]
        unit: String,
    },
    Jwt {
        jwt: String,
    },
}

fn default_unit() -> String {
    "s".to_string()
}

impl Spec {
    /// The spec of `provider`.
    pub fn of(provider: ProviderKind) -> Spec {
        let text = match provider {
            ProviderKind::ClaudeCode => include_str!("../../auth/claude_code.json"),
            ProviderKind::Codex => include_str!("../../auth/codex.json"),
            ProviderKind::Opencode => include_str!("../../auth/opencode.json"),
            ProviderKind::Gemini => include_str!("../../auth/gemini.json"),
        };
        serde_json::from_str(text).expect("the built-in credential specs parse")
    }

    /// Every path under HOME where this provider's credentials may lie: what a turn must
    /// leave no copy of.
    pub fn home_targets(&self) -> Vec<String> {
        let mut t: Vec<String> = self
            .files
            .iter()
            .map(|f| f.target.clone())
            .chain(self.keyring.iter().map(|k| k.target.clone()))
            .collect();
        t.sort();
        t.dedup();
        t
    }

    /// The expiry rule of a file target.
    pub fn expiry_of(&self, target: &str) -> Option<&Expiry> {
        self.files
            .iter()
            .filter(|f| f.target == target)
            .find_map(|f| f.expiry.as_ref())
            .or_else(|| {
                self.keyring
                    .iter()
                    .filter(|k| k.target == target)
                    .find_map(|k| k.expiry.as_ref())
            })
    }
}

/// Expands `~` and `${VAR:-default}` in a spec path, with `env` looking variables up.
pub fn expand(path: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let mut out = String::new();
    let mut rest = path;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}')? + start;
        let inner = &rest[start + 2..end];
        let (var, default) = inner.split_once(":-").unwrap_or((inner, ""));
        match env(var).filter(|v| !v.is_empty()) {
            Some(v) => out.push_str(&v),
            None => out.push_str(default),
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    if out == "~" || out.starts_with("~/") {
        let home = env("HOME").filter(|h| !h.is_empty())?;
        out = format!("{home}{}", &out[1..]);
    }
    Some(out)
}

/// The expiry (Unix seconds) a credential states, if it states one.
pub fn expiry_secs(rule: &Expiry, contents: &[u8]) -> Option<u64> {
    let json: serde_json::Value = serde_json::from_slice(contents).ok()?;
    match rule {
        Expiry::Json { json: path, unit } => {
            let n = lookup(&json, path)?.as_f64()?;
            Some(if unit == "ms" {
                (n / 1000.0) as u64
            } else {
                n as u64
            })
        }
        Expiry::Jwt { jwt } => {
            let token = lookup(&json, jwt)?.as_str()?;
            jwt_exp(token)
        }
    }
}

/// A value at a dotted JSON path; `*` matches the first key that has the rest of the path.
pub fn lookup<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    let (head, tail) = match path.split_once('.') {
        Some((h, t)) => (h, Some(t)),
        None => (path, None),
    };
    let candidates: Vec<&serde_json::Value> = if head == "*" {
        v.as_object()?.values().collect()
    } else {
        vec![v.get(head)?]
    };
    candidates.into_iter().find_map(|c| match tail {
        Some(t) => lookup(c, t),
        None => Some(c),
    })
}

/// The `exp` claim of a JWT, without verifying it (we only compare ages).
pub fn jwt_exp(token: &str) -> Option<u64> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("exp")?.as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_parses_and_names_its_provider() {
        for p in ProviderKind::ALL {
            let s = Spec::of(p);
            assert_eq!(s.provider, p);
            assert!(!s.env.is_empty(), "{p}");
            assert!(!s.home_targets().is_empty(), "{p}");
        }
        assert!(Spec::of(ProviderKind::ClaudeCode)
            .keyring
            .iter()
            .any(|k| k.service == "Claude Code-credentials"));
    }

    #[test]
    fn paths_expand_home_and_defaults() {
        let env = |k: &str| match k {
            "HOME" => Some("/home/u".to_string()),
            "CODEX_HOME" => Some("/opt/codex".to_string()),
            _ => None,
        };
        assert_eq!(
            expand("${CLAUDE_CONFIG_DIR:-~/.claude}/.credentials.json", &env).unwrap(),
            "/home/u/.claude/.credentials.json"
        );
        assert_eq!(
            expand("${CODEX_HOME:-~/.codex}/auth.json", &env).unwrap(),
            "/opt/codex/auth.json"
        );
    }

    #[test]
    fn expiries_from_json_and_jwt() {
        let claude = br#"{"claudeAiOauth":{"accessToken":"x","expiresAt":1700000000000}}"#;
        let rule = Spec::of(ProviderKind::ClaudeCode).files[0]
            .expiry
            .clone()
            .unwrap();
        assert_eq!(expiry_secs(&rule, claude), Some(1_700_000_000));
        // header {"alg":"none"} . payload {"exp":1800000000} . no signature
        let jwt = "eyJhbGciOiJub25lIn0.eyJleHAiOjE4MDAwMDAwMDB9.";
        let codex = format!(r#"{{"tokens":{{"access_token":"{jwt}"}}}}"#);
        let rule = Spec::of(ProviderKind::Codex).files[0]
            .expiry
            .clone()
            .unwrap();
        assert_eq!(expiry_secs(&rule, codex.as_bytes()), Some(1_800_000_000));
        let opencode = br#"{"anthropic":{"type":"oauth","expires":1750000000000}}"#;
        let rule = Spec::of(ProviderKind::Opencode).files[0]
            .expiry
            .clone()
            .unwrap();
        assert_eq!(expiry_secs(&rule, opencode), Some(1_750_000_000));
    }
}
