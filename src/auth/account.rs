//! Which account a provider's stored credentials spend: a stable fingerprint, never the
//! secret, so that everything caw-box does per account (`--per-account`'s admission, `auth
//! status`, `show`) can name it.
//!
//! It is derived from the store's manifest, which holds no secret: an API key by the
//! SHA-256 the manifest keeps of it (the same key collected again is the same account), a
//! login's files by where and when they were collected (a refresh keeps both: the account
//! does not change when the broker or the CLI refreshes its tokens; a new login is a new
//! account). The manifest's SHA-256 of a key goes through a second hash here, so the
//! fingerprint cannot be matched against the manifest either.

use sha2::{Digest, Sha256};

use crate::auth::store::{Manifest, Store};
use crate::provider::ProviderKind;

/// How many hex digits of the fingerprint name an account.
const DIGITS: usize = 12;

/// The account `p`'s stored credentials spend, as `<provider>-<12 hex digits>`; `None`
/// when nothing is stored for `p`.
pub fn of_manifest(p: ProviderKind, manifest: &Manifest) -> Option<String> {
    if manifest.items.is_empty() {
        return None;
    }
    let mut parts: Vec<String> = manifest
        .items
        .iter()
        .map(|i| match i.kind.as_str() {
            "env" | "derived" => format!("key {} {}", i.target, i.sha256),
            _ => format!("login {} {} {}", i.target, i.source, i.collected_at),
        })
        .collect();
    parts.sort();
    let mut hash = Sha256::new();
    hash.update(b"caw-box account\0");
    hash.update(p.as_str().as_bytes());
    for part in &parts {
        hash.update(b"\0");
        hash.update(part.as_bytes());
    }
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("{}-{}", p.as_str(), &hex[..DIGITS]))
}

/// The account of `p`'s stored credentials in the store of this data directory.
pub fn of(p: ProviderKind) -> Option<String> {
    let store = Store::open().ok()?;
    of_manifest(p, &store.manifest(p))
}

/// What a turn of `p` with no stored credentials spends: the key its environment gives it
/// (`--env`, a variable passed on), one account per provider as far as caw-box can tell.
pub fn unstored(p: ProviderKind) -> String {
    format!("{}-unstored", p.as_str())
}

/// The account a turn of `p` spends: the stored credentials', else [`unstored`].
pub fn spent_by(p: ProviderKind) -> String {
    of(p).unwrap_or_else(|| unstored(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::store::Item;

    fn item(kind: &str, target: &str, sha: &str, at: u64) -> Item {
        Item {
            kind: kind.into(),
            target: target.into(),
            source: "env:X".into(),
            collected_at: at,
            refreshed_at: None,
            sha256: sha.into(),
            expires_at: None,
        }
    }

    fn manifest(items: Vec<Item>) -> Manifest {
        Manifest {
            items,
            ..Manifest::default()
        }
    }

    #[test]
    fn a_key_is_its_account_whenever_it_was_collected() {
        let p = ProviderKind::Codex;
        let a = of_manifest(p, &manifest(vec![item("env", "OPENAI_API_KEY", "aa", 1)])).unwrap();
        let again = of_manifest(p, &manifest(vec![item("env", "OPENAI_API_KEY", "aa", 9)]));
        let other = of_manifest(p, &manifest(vec![item("env", "OPENAI_API_KEY", "bb", 1)]));
        assert_eq!(Some(a.clone()), again);
        assert_ne!(Some(a.clone()), other);
        assert!(
            a.starts_with("codex-") && a.len() == "codex-".len() + DIGITS,
            "{a}"
        );
        assert!(!a.contains("aa"), "{a}");
        // The same key of another provider is another account.
        let claude = of_manifest(
            ProviderKind::ClaudeCode,
            &manifest(vec![item("env", "OPENAI_API_KEY", "aa", 1)]),
        );
        assert_ne!(Some(a), claude);
    }

    #[test]
    fn a_login_keeps_its_account_through_refreshes() {
        let p = ProviderKind::ClaudeCode;
        let first = item("file", ".claude/.credentials.json", "aa", 5);
        let refreshed = Item {
            refreshed_at: Some(50),
            sha256: "bb".into(),
            expires_at: Some(99),
            ..first.clone()
        };
        let relogin = item("file", ".claude/.credentials.json", "cc", 60);
        let a = of_manifest(p, &manifest(vec![first]));
        assert_eq!(a, of_manifest(p, &manifest(vec![refreshed])));
        assert_ne!(a, of_manifest(p, &manifest(vec![relogin])));
        assert_eq!(None, of_manifest(p, &manifest(vec![])));
    }
}
