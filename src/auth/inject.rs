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

use crate::auth::spec::Spec;
use crate::auth::store::{self, Store};
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
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths: Vec<&str> = self.files.iter().map(|(p, _)| p.as_str()).collect();
        f.debug_struct("Prepared")
            .field("files", &paths)
            .field("names", &self.names)
            .finish()
    }
}

/// Prepares `p`'s credentials for a turn. `turn_env` are the turn's `--env` values: a key
/// there counts as a usable credential too.
///
/// Fails with exit 4 and the exact `auth collect` command when `p` has none.
pub fn prepare(p: ProviderKind, turn_env: &[(String, String)]) -> Result<Prepared> {
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

    let mut files = Vec::new();
    for target in spec.home_targets() {
        if let Some(secret) = store.file(p, &target) {
            files.push((
                format!("{AUTH_SUBDIR}/home/{target}"),
                secret.expose().to_vec(),
            ));
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
        files.push((format!("{AUTH_SUBDIR}/env"), bytes));
    }
    let mut scrub = Vec::new();
    for t in spec.home_targets() {
        scrub.extend_from_slice(t.as_bytes());
        scrub.push(0);
    }
    files.push((SCRUB_FILE.to_string(), scrub));
    Ok(Prepared { files, names })
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
