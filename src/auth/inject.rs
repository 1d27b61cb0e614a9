//! Handing credentials to a turn, and taking refreshed ones back.
//!
//! Before a turn, the provider's part of the store is copied into the turn's private runtime
//! directory (host side, 0700, removed after the turn), which the container sees at
//! `/run/caw-box`: `auth/home/` (files the entrypoint places under HOME), `auth/env`
//! (API keys, read by the entrypoint, never container config), and `scrub` (every path under
//! HOME where this provider's credentials may lie). The entrypoint deletes all of those from
//! HOME when the turn ends, and hands back changed files in `auth/home-out/`, which
//! [`finish`] merges into the store (newest token wins).

use std::fs;
use std::path::Path;

use crate::auth::spec::Spec;
use crate::auth::store::{self, Store};
use crate::clock::now_secs;
use crate::dirs;
use crate::error::{Error, Result};
use crate::provider::ProviderKind;

/// Where credentials go in a turn's runtime directory.
pub const AUTH_SUBDIR: &str = "auth";
pub const SCRUB_FILE: &str = "scrub";

/// Prepares `p`'s credentials for a turn in `runtime_dir`. `turn_env` are the turn's
/// `--env` values: a key there counts as a usable credential too.
///
/// Fails with exit 4 and the exact `auth collect` command when `p` has none. Returns the
/// names of the variables the CLI will have from the store and `turn_env`.
pub fn prepare(
    p: ProviderKind,
    runtime_dir: &Path,
    turn_env: &[(String, String)],
) -> Result<Vec<String>> {
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

    let auth_dir = runtime_dir.join(AUTH_SUBDIR);
    dirs::ensure_private_dir(&auth_dir)?;
    for target in spec.home_targets() {
        if let Some(secret) = store.file(p, &target) {
            let dst = auth_dir.join("home").join(&target);
            if let Some(parent) = dst.parent() {
                dirs::ensure_private_dir(parent)?;
            }
            dirs::write_private_unsynced(&dst, secret.expose())?;
        }
    }
    let vars = store.env(p);
    let mut names: Vec<String> = turn_env.iter().map(|(k, _)| k.clone()).collect();
    names.extend(vars.iter().map(|(k, _)| k.to_string()));
    if !vars.is_empty() {
        let mut bytes = Vec::new();
        for (k, v) in &vars {
            bytes.extend_from_slice(k.as_bytes());
            bytes.push(b'=');
            bytes.extend_from_slice(v.expose());
            bytes.push(0);
        }
        dirs::write_private_unsynced(&auth_dir.join("env"), &bytes)?;
    }
    let mut scrub = Vec::new();
    for t in spec.home_targets() {
        scrub.extend_from_slice(t.as_bytes());
        scrub.push(0);
    }
    dirs::write_private_unsynced(&runtime_dir.join(SCRUB_FILE), &scrub)?;
    dirs::hand_to_agent(runtime_dir)?;
    Ok(names)
}

/// After a turn: merges the credentials the CLI refreshed back into the store.
pub fn finish(p: ProviderKind, runtime_dir: &Path) -> Result<Vec<String>> {
    let out = runtime_dir.join(AUTH_SUBDIR).join("home-out");
    if !out.is_dir() {
        return Ok(Vec::new());
    }
    let store = Store::open()?;
    let updated = store::write_back(&store, p, &out)?;
    let _ = fs::remove_dir_all(&out);
    Ok(updated)
}
