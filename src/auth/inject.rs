//! Handing credentials to a turn, and taking refreshed ones back.
//!
//! Before a turn, the provider's part of the store becomes files of the turn's private
//! runtime directory (in the container's own scratch storage, removed with it; see
//! `session::runtime`): `auth/home/` (files the entrypoint places under HOME), `auth/env`
//! (API keys, read by the entrypoint, never container config), and `scrub` (every path under
//! HOME where this provider's credentials may lie). The entrypoint deletes all of those from
//! HOME when the turn ends, and hands back changed files in `auth/home-out/`, which
//! [`finish`] merges into the store (newest token wins).

use std::collections::HashMap;

pub use crate::auth::login::{
    json_at, placeholder_login, refreshed_login, RefreshedTokens, PLACEHOLDER_EXPIRY_SECS,
    PLACEHOLDER_MARK,
};
use crate::auth::spec::Spec;
use crate::auth::store::{self, Store};
use crate::auth::Secret;
use crate::clock::now_secs;
use crate::error::{Error, Result};
use crate::provider::ProviderKind;

/// Where credentials go in a turn's runtime directory.
pub const AUTH_SUBDIR: &str = "auth";
pub const SCRUB_FILE: &str = "scrub";

/// `p`'s credentials for one turn, as files of its runtime directory.
pub struct Prepared {
    /// Paths relative to the runtime directory, and their (secret) contents.
    pub files: Vec<(String, Vec<u8>)>,
    /// The names of the variables the CLI will have from the store and the turn's `--env`.
    pub names: Vec<String>,
    /// Brokered keys: each placeholder the CLI got (in `auth/env`) and the real key the
    /// broker puts in its place. Empty when the turn's credentials are injected.
    pub brokered: Vec<(String, Secret)>,
    /// Brokered OAuth logins: the CLI got a placeholder login file (see [`placeholder_login`]).
    pub logins: Vec<BrokeredLogin>,
}

/// An OAuth login the broker holds for a turn: the CLI's file has `placeholder` as its
/// access token, no refresh token and a far expiry; the broker swaps the placeholder for
/// the real access token and refreshes it.
pub struct BrokeredLogin {
    pub placeholder: String,
    /// The login file under HOME (as stored).
    pub target: String,
    /// The stored login file (the real tokens).
    pub real: Secret,
}

impl std::fmt::Debug for BrokeredLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokeredLogin")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths: Vec<&str> = self.files.iter().map(|(p, _)| p.as_str()).collect();
        f.debug_struct("Prepared")
            .field("files", &paths)
            .field("names", &self.names)
            .field("brokered", &self.brokered.len())
            .finish()
    }
}

/// Prepares `p`'s credentials for a turn. `turn_env` are the turn's `--env` values: a key
/// there counts as a usable credential too.
///
/// Fails with exit 4 and the exact `auth collect` command when `p` has none.
pub fn prepare(p: ProviderKind, turn_env: &[(String, String)]) -> Result<Prepared> {
    prepare_as(p, turn_env, false)
}

/// [`prepare`], with the collected API keys brokered when `broker` is set and `p`'s
/// credentials are API keys only: the CLI then gets a placeholder of the key's shape in each
/// key variable, and [`Prepared::brokered`] pairs each placeholder with the real key. Login
/// files (OAuth) are still injected as today, and a store holding any keeps the whole turn
/// injected (their refresh moves into the broker in a later step). `--env` values are the
/// user's own choice of the agent's environment and pass as given.
pub fn prepare_as(
    p: ProviderKind,
    turn_env: &[(String, String)],
    broker: bool,
) -> Result<Prepared> {
    let spec = Spec::of(p);
    let store = Store::open()?;
    let manifest = store.manifest(p);
    let key_in_turn_env = turn_env.iter().any(|(k, v)| {
        !v.is_empty() && (spec.env.contains(k) || p.endpoint_key_vars().contains(&k.as_str()))
    });
    if manifest.items.is_empty() && !key_in_turn_env {
        return Err(
            Error::credentials(format!("no credentials for {p}")).with_hint(format!(
                "run `caw-box auth collect --provider {p}` (or pass a key: --env {}=...)",
                p.endpoint_key_vars()[0]
            )),
        );
    }
    warn_expired(p, &manifest, key_in_turn_env);

    let mut files = Vec::new();
    let has_files = spec
        .home_targets()
        .iter()
        .any(|t| store.file(p, t).is_some());
    let vars = store.env(p);
    // Only keys the broker knows how to swap; anything else (opencode's whole auth JSON in
    // OPENCODE_AUTH_CONTENT) keeps the turn injected.
    let broker = broker
        && vars
            .iter()
            .all(|(k, _)| BROKERED_VARS.contains(&k.as_str()));
    // A placeholder the CLI takes from a variable instead of a login file.
    let mut login_env: Vec<(String, String)> = Vec::new();
    let logins = if broker {
        broker_logins(p, &spec, &store, &mut files, &mut login_env)
    } else {
        Vec::new()
    };
    let broker =
        broker && (!has_files || !logins.is_empty()) && (!vars.is_empty() || !logins.is_empty());
    let mut brokered = Vec::new();
    // Variables a dotenv file the CLI loads itself defines (gemini's `~/.gemini/.env`): the
    // CLI's environment holds them too (names only).
    let mut file_vars = Vec::new();
    for target in spec.home_targets() {
        if logins.iter().any(|l| l.target == target) {
            continue;
        }
        if let Some(secret) = store.file(p, &target) {
            if target.ends_with("/.env") {
                file_vars.extend(dotenv_names(secret.expose()));
            }
            files.push((
                format!("{AUTH_SUBDIR}/home/{target}"),
                secret.expose().to_vec(),
            ));
        }
    }
    let mut names: Vec<String> = turn_env.iter().map(|(k, _)| k.clone()).collect();
    names.extend(file_vars);
    names.extend(vars.iter().map(|(k, _)| k.to_string()));
    names.extend(login_env.iter().map(|(k, _)| k.clone()));
    if !vars.is_empty() || !login_env.is_empty() {
        let bytes = env_file(&login_env, &vars, broker, &mut brokered);
        files.push((format!("{AUTH_SUBDIR}/env"), bytes));
    }
    let mut scrub = Vec::new();
    for t in spec.home_targets() {
        scrub.extend_from_slice(t.as_bytes());
        scrub.push(0);
    }
    files.push((SCRUB_FILE.to_string(), scrub));
    Ok(Prepared {
        files,
        names,
        brokered,
        logins,
    })
}

/// Says which stored credentials have expired: a warning where a login is all the turn has.
fn warn_expired(p: ProviderKind, manifest: &store::Manifest, key_in_turn_env: bool) {
    let now = now_secs();
    let has_key = key_in_turn_env
        || manifest
            .items
            .iter()
            .any(|i| i.kind != "file" && i.kind != "keyring");
    for item in &manifest.items {
        if let Some(exp) = item.expires_at.filter(|e| *e < now) {
            let ago = humantime::format_duration(std::time::Duration::from_secs(now - exp));
            if has_key {
                tracing::info!("the stored {} for {p} expired {ago} ago", item.target);
            } else {
                tracing::warn!(
                    "the stored {p} login ({}) expired {ago} ago; the CLI will try to refresh it, else log in again on the host and run `caw-box auth collect --provider {p}`",
                    item.target
                );
            }
        }
    }
}

/// The logins the broker holds for a turn (a login it can hold: an OAuth spec, a file of its
/// shape, and no other credential file); their placeholder files go to `files`, or their
/// placeholders to `login_env`.
fn broker_logins(
    p: ProviderKind,
    spec: &Spec,
    store: &Store,
    files: &mut Vec<(String, Vec<u8>)>,
    login_env: &mut Vec<(String, String)>,
) -> Vec<BrokeredLogin> {
    let mut logins = Vec::new();
    let Some(o) = spec.oauth.as_ref().filter(|o| o.brokered) else {
        return logins;
    };
    let others = spec
        .home_targets()
        .iter()
        .any(|t| *t != o.target && !o.companions.contains(t) && store.file(p, t).is_some());
    if let Some(real) = store.file(p, &o.target).filter(|_| !others) {
        let stand_in = format!("{}{}", o.placeholder_prefix, uuid::Uuid::new_v4().simple());
        match placeholder_login(o, real.expose(), &stand_in) {
            Some((file, stand_in)) => {
                match &o.placeholder_env {
                    Some(var) => login_env.push((var.clone(), stand_in.clone())),
                    None => files.push((format!("{AUTH_SUBDIR}/home/{}", o.target), file)),
                }
                logins.push(BrokeredLogin {
                    placeholder: stand_in,
                    target: o.target.clone(),
                    real,
                });
            }
            // (A file without the login's access token holds no login: opencode's
            // `auth.json` with API keys only.)
            None if !serde_json::from_slice::<serde_json::Value>(real.expose())
                .is_ok_and(|v| json_at(&v, &o.access).is_some()) => {}
            None => tracing::warn!(
                "the {p} login in {} is not of the shape the credential broker knows; \
                 the CLI gets it as it is (injected)",
                o.target
            ),
        }
    }
    logins
}

/// The `auth/env` file: NUL-separated `K=V`, each brokered key replaced by a placeholder
/// (the pair goes to `brokered`).
fn env_file(
    login_env: &[(String, String)],
    vars: &[(String, Secret)],
    broker: bool,
    brokered: &mut Vec<(String, Secret)>,
) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (k, v) in login_env {
        bytes.extend_from_slice(format!("{k}={v}").as_bytes());
        bytes.push(0);
    }
    for (k, v) in vars {
        bytes.extend_from_slice(k.as_bytes());
        bytes.push(b'=');
        if broker && !v.is_empty() {
            let stand_in = placeholder(k);
            bytes.extend_from_slice(stand_in.as_bytes());
            brokered.push((stand_in, v.clone()));
        } else {
            bytes.extend_from_slice(v.expose());
        }
        bytes.push(0);
    }
    bytes
}

/// The names a dotenv file defines (`NAME=value` lines; `export ` and comments allowed).
fn dotenv_names(text: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (name, _) = line.split_once('=')?;
            let name = name.trim();
            let ok = !name.is_empty()
                && !name.starts_with('#')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            ok.then(|| name.to_string())
        })
        .collect()
}

/// The key variables whose values the broker swaps in (sent as `x-api-key`,
/// `Authorization: Bearer`, `x-goog-api-key` or `?key=`).
pub const BROKERED_VARS: [&str; 7] = [
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
];

/// A stand-in for the key in variable `var`, of the shape the vendor's keys have (a CLI
/// that checks a key's prefix accepts it), fresh for every turn: worth nothing outside the
/// turn's broker.
pub fn placeholder(var: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    let prefix = match var {
        "ANTHROPIC_API_KEY" => "sk-ant-api03-cawbox-placeholder-",
        "ANTHROPIC_AUTH_TOKEN" | "CLAUDE_CODE_OAUTH_TOKEN" => "sk-ant-oat01-cawbox-placeholder-",
        "OPENAI_API_KEY" | "CODEX_API_KEY" => "sk-proj-cawbox-placeholder-",
        "GEMINI_API_KEY" | "GOOGLE_API_KEY" => "AIzaCawBoxPlaceholder",
        _ => "cawbox-placeholder-",
    };
    format!("{prefix}{random}")
}

/// Where the entrypoint hands back the credential files the CLI changed, relative to the
/// runtime directory.
pub const HOME_OUT: &str = "auth/home-out";

/// Whether a turn of `p` gets credential files the CLI may refresh (so that [`HOME_OUT`] is
/// worth reading after the turn).
pub fn has_files(prepared: &Prepared) -> bool {
    prepared
        .files
        .iter()
        .any(|(path, _)| path.starts_with(&format!("{AUTH_SUBDIR}/home/")))
}

/// After a turn: merges the credentials the CLI refreshed back into the store. `home_out`
/// is [`HOME_OUT`] as a tar archive (paths under HOME, as the backend archives a directory).
pub fn finish(p: ProviderKind, home_out: &[u8]) -> Result<Vec<String>> {
    let mut changed = HashMap::new();
    let mut archive = tar::Archive::new(home_out);
    let entries = archive
        .entries()
        .map_err(|e| Error::environment(format!("bad archive of refreshed credentials: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            Error::environment(format!("bad archive of refreshed credentials: {e}"))
        })?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let Ok(path) = entry.path() else { continue };
        // Docker names the entries `home-out/<path under HOME>`.
        let rel: Vec<String> = path
            .components()
            .skip(1)
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let mut bytes = Vec::new();
        if std::io::Read::read_to_end(&mut entry, &mut bytes).is_ok() {
            changed.insert(rel.join("/"), bytes);
        }
    }
    if changed.is_empty() {
        return Ok(Vec::new());
    }
    let store = Store::open()?;
    store::write_back(&store, p, &changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGIN: &str = r#"{"claudeAiOauth":{"accessToken":"real-a","refreshToken":"real-r","expiresAt":1700000000000,"scopes":["user:inference"],"subscriptionType":"max"}}"#;

    #[test]
    fn a_placeholder_login_holds_no_real_token_and_never_expires() {
        let spec = Spec::of(ProviderKind::ClaudeCode).oauth.unwrap();
        let (file, placeholder) =
            placeholder_login(&spec, LOGIN.as_bytes(), "sk-ant-oat01-cawbox-placeholder-1")
                .unwrap();
        assert_eq!(placeholder, "sk-ant-oat01-cawbox-placeholder-1");
        let text = String::from_utf8(file).unwrap();
        assert!(
            !text.contains("real-a") && !text.contains("real-r"),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let o = &v["claudeAiOauth"];
        assert_eq!(o["accessToken"], "sk-ant-oat01-cawbox-placeholder-1");
        assert_eq!(o["expiresAt"], PLACEHOLDER_EXPIRY_SECS * 1000);
        assert!(o["refreshToken"]
            .as_str()
            .unwrap()
            .contains(PLACEHOLDER_MARK));
        // What the CLI reads besides the tokens stays.
        assert_eq!(o["subscriptionType"], "max");
        // Not a login of that shape: not brokered.
        assert!(placeholder_login(&spec, br#"{"OPENAI_API_KEY":"k"}"#, "p").is_none());
    }

    /// opencode's ChatGPT login: a plain placeholder access token (no JWT), `expires` in ms
    /// far off, the account id kept; an API-key entry is no login (brokered as a key).
    #[test]
    fn an_opencode_placeholder_login_keeps_the_account() {
        let spec = Spec::of(ProviderKind::Opencode).oauth.unwrap();
        assert_eq!(spec.intercept, ["chatgpt.com"]);
        let real = br#"{"openai":{"type":"oauth","access":"real-a","refresh":"real-r","expires":1700000000000,"accountId":"acct-1"}}"#;
        let (file, placeholder) = placeholder_login(&spec, real, "cawbox-placeholder-1").unwrap();
        assert_eq!(placeholder, "cawbox-placeholder-1");
        let v: serde_json::Value = serde_json::from_slice(&file).unwrap();
        let o = &v["openai"];
        assert_eq!(o["access"], "cawbox-placeholder-1");
        assert_eq!(o["expires"], PLACEHOLDER_EXPIRY_SECS * 1000);
        assert_eq!(
            (&o["type"], &o["accountId"]),
            (&"oauth".into(), &"acct-1".into())
        );
        assert!(!String::from_utf8_lossy(&file).contains("real-"));
        let key = br#"{"openai":{"type":"api","key":"sk-real"}}"#;
        assert!(placeholder_login(&spec, key, "p").is_none());
    }

    /// gemini's Google login: its placeholder goes in a variable (no file), and a refresh
    /// Google answers without a new refresh token keeps the stored one.
    #[test]
    fn a_gemini_login_is_brokered_through_a_variable() {
        let spec = Spec::of(ProviderKind::Gemini).oauth.unwrap();
        assert_eq!(
            spec.placeholder_env.as_deref(),
            Some("GOOGLE_CLOUD_ACCESS_TOKEN")
        );
        assert_eq!(spec.body, "form");
        assert!(spec.client_secret.is_some());
        assert!(spec
            .companions
            .contains(&".gemini/google_accounts.json".to_string()));
        let login = br#"{"access_token":"ya29.real","refresh_token":"1//real","token_type":"Bearer","expiry_date":1700000000000}"#;
        let stand_in = format!("{}1", spec.placeholder_prefix);
        let (_, placeholder) = placeholder_login(&spec, login, &stand_in).unwrap();
        assert_eq!(placeholder, stand_in);
        assert!(placeholder.starts_with("ya29."));
        let tokens = RefreshedTokens {
            access: "ya29.new".into(),
            refresh: "1//real".into(),
            id_token: None,
            expires_ms: 1800000000000,
        };
        let stored = refreshed_login(&spec, login, "1//real", &tokens).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&stored).unwrap();
        assert_eq!(
            (&v["access_token"], &v["refresh_token"], &v["expiry_date"]),
            (
                &serde_json::json!("ya29.new"),
                &serde_json::json!("1//real"),
                &serde_json::json!(1800000000000u64)
            )
        );
    }

    #[test]
    fn a_codex_placeholder_keeps_the_jwt_claims_with_a_far_expiry() {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let claims =
            b64.encode(br#"{"exp":1,"https://api.openai.com/auth":{"chatgpt_account_id":"acct"}}"#);
        let real = format!(
            r#"{{"OPENAI_API_KEY":"sk-realkey","tokens":{{"access_token":"h.{claims}.realsig","id_token":"h.{claims}.realidsig","refresh_token":"rt","account_id":"acct"}},"last_refresh":"2020-01-01T00:00:00Z"}}"#
        );
        let spec = Spec::of(ProviderKind::Codex).oauth.unwrap();
        let (file, placeholder) =
            placeholder_login(&spec, real.as_bytes(), "cawbox-placeholder-7").unwrap();
        let text = String::from_utf8(file).unwrap();
        assert!(
            !text.contains("realsig") && !text.contains("realidsig") && !text.contains("\"rt\"")
        );
        // The API key codex may keep beside its login is not in the placeholder file.
        assert!(!text.contains("sk-realkey"), "{text}");
        assert!(
            placeholder.ends_with(".cawbox-placeholder-7"),
            "{placeholder}"
        );
        assert_eq!(
            crate::auth::spec::jwt_exp(&placeholder),
            Some(PLACEHOLDER_EXPIRY_SECS)
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["tokens"]["access_token"], placeholder.as_str());
        assert_ne!(v["last_refresh"], "2020-01-01T00:00:00Z");
        let claims = placeholder.split('.').nth(1).unwrap();
        let claims: serde_json::Value =
            serde_json::from_slice(&b64.decode(claims).unwrap()).unwrap();
        assert_eq!(
            claims["https://api.openai.com/auth"]["chatgpt_account_id"],
            "acct"
        );
        assert!(spec.brokered);
    }

    #[test]
    fn a_refresh_is_stored_only_over_the_login_it_replaces() {
        let spec = Spec::of(ProviderKind::ClaudeCode).oauth.unwrap();
        let tokens = |a: &str, r: &str, ms| RefreshedTokens {
            access: a.into(),
            refresh: r.into(),
            id_token: None,
            expires_ms: ms,
        };
        let new =
            refreshed_login(&spec, LOGIN.as_bytes(), "real-r", &tokens("a2", "r2", 42)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&new).unwrap();
        assert_eq!(v["claudeAiOauth"]["accessToken"], "a2");
        assert_eq!(v["claudeAiOauth"]["refreshToken"], "r2");
        assert_eq!(v["claudeAiOauth"]["expiresAt"], 42);
        assert_eq!(v["claudeAiOauth"]["subscriptionType"], "max");
        // Another process stored a newer login meanwhile: left alone.
        assert!(refreshed_login(&spec, &new, "real-r", &tokens("a3", "r3", 43)).is_none());
    }

    #[test]
    fn a_dotenv_file_names_its_variables_and_never_its_values() {
        let names = dotenv_names(b"# keys\nGEMINI_API_KEY=AIza-secret\nexport GOOGLE_CLOUD_PROJECT=p\n\nnot a line\nBAD NAME=x\n");
        assert_eq!(names, ["GEMINI_API_KEY", "GOOGLE_CLOUD_PROJECT"]);
    }

    #[test]
    fn placeholders_have_the_vendors_shape_and_are_fresh() {
        assert!(placeholder("ANTHROPIC_API_KEY").starts_with("sk-ant-api03-"));
        assert!(placeholder("OPENAI_API_KEY").starts_with("sk-"));
        assert!(placeholder("GEMINI_API_KEY").starts_with("AIza"));
        assert_ne!(placeholder("OPENAI_API_KEY"), placeholder("OPENAI_API_KEY"));
        for var in BROKERED_VARS {
            assert!(placeholder(var).len() >= 39, "{var}");
        }
    }
}
