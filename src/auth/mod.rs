//! Credentials: what each vendor CLI needs (specs under auth/, compiled in), collecting it
//! from the host into caw-box's private store, and handing it to turns without leaks.

pub mod account;
pub mod backoff;
pub mod inject;
pub mod intercept;
pub mod keyring;
pub mod login;
pub mod secret;
pub mod spec;
pub mod store;
pub mod user_config;
pub mod windows;

pub use secret::Secret;

use crate::provider::ProviderKind;

/// Key values caw-box knows for `p`: stored by `auth collect`, or in this process's
/// environment under the provider's key variables. What must never leave in a copy of
/// files (an exported session, the user's setup). Values shorter than 12 bytes are not keys.
pub fn known_secrets(p: ProviderKind) -> Vec<Vec<u8>> {
    let spec = spec::Spec::of(p);
    let mut names: Vec<String> = spec.env.clone();
    names.extend(p.endpoint_key_vars().iter().map(|s| s.to_string()));
    let mut values: Vec<Vec<u8>> = names
        .iter()
        .filter_map(|n| std::env::var(n).ok())
        .map(String::into_bytes)
        .collect();
    if let Ok(store) = store::Store::open() {
        values.extend(store.env(p).into_iter().map(|(_, v)| v.expose().to_vec()));
    }
    values.retain(|v| v.len() >= 12);
    values.sort();
    values.dedup();
    values
}

/// Whether `data` holds any of `secrets`.
pub fn holds_any(data: &[u8], secrets: &[Vec<u8>]) -> bool {
    secrets
        .iter()
        .any(|s| data.windows(s.len()).any(|w| w == &s[..]))
}
