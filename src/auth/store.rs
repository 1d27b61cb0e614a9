//! The auth store: caw-box's private copy of each provider's credentials.
//!
//! Layout under `<data dir>/auth/` (directories 0700, files 0600, every write atomic):
//! `<provider>/home/<path under HOME>` (credential files), `<provider>/env` (API keys,
//! NUL-separated `KEY=VALUE`), `<provider>/manifest.json` (what came from where and when,
//! with a SHA-256 of each item, never the value). One lock file serialises writers, so
//! concurrent turns of different sessions cannot corrupt it.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::auth::spec::{self, Spec};
use crate::auth::Secret;
use crate::clock::now_secs;
use crate::dirs;
use crate::error::{Error, Result};
use crate::provider::ProviderKind;

/// One collected item, as the manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// `file`, `keyring`, `env` or `derived`.
    pub kind: String,
    /// The file under HOME, or the variable's name.
    pub target: String,
    /// Where it came from: a host path, `keyring:<service>/<account>`, `env:<NAME>`.
    pub source: String,
    pub collected_at: u64,
    /// Set when a turn's CLI refreshed it and the newer copy was written back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refreshed_at: Option<u64>,
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Manifest {
    /// Where the secrets are: `files` (in this directory) or `keyring` (the OS keyring;
    /// this directory then holds only the manifest).
    #[serde(default)]
    pub store: StoreKind,
    #[serde(default)]
    pub items: Vec<Item>,
}

/// Where a provider's secrets are kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    #[default]
    Files,
    Keyring,
}

/// The keyring service caw-box keeps its own copies under (`--store keyring`).
pub const KEYRING_SERVICE: &str = "caw-box";

fn keyring_account(p: ProviderKind, what: &str) -> String {
    format!("{}/{what}", p.as_str())
}

impl Manifest {
    fn upsert(&mut self, item: Item) {
        match self
            .items
            .iter_mut()
            .find(|i| i.kind_class() == item.kind_class() && i.target == item.target)
        {
            Some(existing) => *existing = item,
            None => self.items.push(item),
        }
        self.items.sort_by(|a, b| a.target.cmp(&b.target));
    }
}

impl Item {
    /// Files and keyring entries both land as files; env and derived both as variables.
    fn kind_class(&self) -> &'static str {
        match self.kind.as_str() {
            "env" | "derived" => "env",
            _ => "file",
        }
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The store root: `<data dir>/auth`.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// Held while the store is written; released on drop.
#[derive(Debug)]
pub struct StoreLock(#[allow(dead_code)] fs::File);

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::environment(format!("failed to {what} '{}': {e}", path.display()))
}

impl Store {
    pub fn open() -> Result<Store> {
        let root = dirs::data_dir()?.join("auth");
        dirs::ensure_private_dir(&root)?;
        Ok(Store { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn provider_dir(&self, p: ProviderKind) -> PathBuf {
        self.root.join(p.as_str())
    }

    /// An exclusive lock over the whole store.
    pub fn lock(&self) -> Result<StoreLock> {
        let path = self.root.join(".lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_err("open the auth store lock", &path, e))?;
        file.lock()
            .map_err(|e| io_err("lock the auth store", &path, e))?;
        Ok(StoreLock(file))
    }

    pub fn manifest(&self, p: ProviderKind) -> Manifest {
        fs::read(self.provider_dir(p).join("manifest.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn save_manifest(&self, p: ProviderKind, m: &Manifest) -> Result<()> {
        let json = serde_json::to_vec_pretty(m).expect("manifests serialize");
        dirs::write_private(&self.provider_dir(p).join("manifest.json"), &json)
    }

    /// The stored file at `target` (under HOME), if any.
    pub fn file(&self, p: ProviderKind, target: &str) -> Option<Secret> {
        if self.manifest(p).store == StoreKind::Keyring {
            return crate::auth::keyring::read(
                KEYRING_SERVICE,
                &keyring_account(p, &format!("file:{target}")),
            )
            .ok()
            .flatten();
        }
        fs::read(self.provider_dir(p).join("home").join(target))
            .ok()
            .map(Secret::new)
    }

    fn put_file(&self, p: ProviderKind, target: &str, secret: &Secret) -> Result<()> {
        if self.manifest(p).store == StoreKind::Keyring {
            return crate::auth::keyring::write(
                KEYRING_SERVICE,
                &keyring_account(p, &format!("file:{target}")),
                secret,
            );
        }
        let path = self.provider_dir(p).join("home").join(target);
        let mut dir = path.parent().map(Path::to_path_buf);
        // Every directory between the store and the file is private too.
        let base = self.provider_dir(p);
        let mut dirs_to_make = Vec::new();
        while let Some(d) = dir {
            if d == base || !d.starts_with(&base) {
                break;
            }
            dirs_to_make.push(d.clone());
            dir = d.parent().map(Path::to_path_buf);
        }
        dirs::ensure_private_dir(&base)?;
        for d in dirs_to_make.iter().rev() {
            dirs::ensure_private_dir(d)?;
        }
        dirs::write_private(&path, secret.expose())
    }

    /// The stored API-key variables.
    pub fn env(&self, p: ProviderKind) -> Vec<(String, Secret)> {
        let bytes = if self.manifest(p).store == StoreKind::Keyring {
            match crate::auth::keyring::read(KEYRING_SERVICE, &keyring_account(p, "env")) {
                Ok(Some(s)) => s.expose().to_vec(),
                _ => return Vec::new(),
            }
        } else {
            match fs::read(self.provider_dir(p).join("env")) {
                Ok(b) => b,
                Err(_) => return Vec::new(),
            }
        };
        bytes
            .split(|b| *b == 0)
            .filter(|r| !r.is_empty())
            .filter_map(|r| {
                let eq = r.iter().position(|b| *b == b'=')?;
                Some((
                    String::from_utf8_lossy(&r[..eq]).to_string(),
                    Secret::new(&r[eq + 1..]),
                ))
            })
            .collect()
    }

    fn put_env(&self, p: ProviderKind, vars: &[(String, Secret)]) -> Result<()> {
        let mut bytes = Vec::new();
        for (k, v) in vars {
            bytes.extend_from_slice(k.as_bytes());
            bytes.push(b'=');
            bytes.extend_from_slice(v.expose());
            bytes.push(0);
        }
        if self.manifest(p).store == StoreKind::Keyring {
            return crate::auth::keyring::write(
                KEYRING_SERVICE,
                &keyring_account(p, "env"),
                &Secret::new(bytes),
            );
        }
        dirs::write_private(&self.provider_dir(p).join("env"), &bytes)
    }

    /// Whether anything is stored for `p`.
    pub fn has_any(&self, p: ProviderKind) -> bool {
        !self.manifest(p).items.is_empty()
    }

    /// Deletes everything stored for `p`.
    pub fn remove(&self, p: ProviderKind) -> Result<bool> {
        let _lock = self.lock()?;
        let manifest = self.manifest(p);
        if manifest.store == StoreKind::Keyring {
            self.forget_keyring(p, &manifest)?;
        }
        let dir = self.provider_dir(p);
        if !dir.exists() {
            return Ok(false);
        }
        fs::remove_dir_all(&dir).map_err(|e| io_err("remove", &dir, e))?;
        Ok(true)
    }
}

impl Store {
    fn forget_keyring(&self, p: ProviderKind, manifest: &Manifest) -> Result<()> {
        for item in &manifest.items {
            if item.kind == "file" || item.kind == "keyring" {
                crate::auth::keyring::delete(
                    KEYRING_SERVICE,
                    &keyring_account(p, &format!("file:{}", item.target)),
                )?;
            }
        }
        crate::auth::keyring::delete(KEYRING_SERVICE, &keyring_account(p, "env"))
    }

    /// Moves `p`'s secrets to `kind` (a no-op when they are there already).
    fn switch_store(&self, p: ProviderKind, kind: StoreKind) -> Result<()> {
        let mut manifest = self.manifest(p);
        if manifest.store == kind {
            return Ok(());
        }
        // Read everything from where it is, write it where it goes, then forget the old.
        let files: Vec<(String, Secret)> = Spec::of(p)
            .home_targets()
            .into_iter()
            .filter_map(|t| self.file(p, &t).map(|s| (t, s)))
            .collect();
        let vars = self.env(p);
        let old = manifest.clone();
        manifest.store = kind;
        self.save_manifest(p, &manifest)?;
        for (t, s) in &files {
            self.put_file(p, t, s)?;
        }
        if !vars.is_empty() {
            self.put_env(p, &vars)?;
        }
        match old.store {
            StoreKind::Keyring => self.forget_keyring(p, &old)?,
            StoreKind::Files => {
                let _ = fs::remove_dir_all(self.provider_dir(p).join("home"));
                let _ = fs::remove_file(self.provider_dir(p).join("env"));
            }
        }
        Ok(())
    }
}

/// What `collect` found for one provider.
#[derive(Debug, Default)]
pub struct CollectReport {
    pub found: Vec<Item>,
    /// Items kept from the store because the stored copy is newer (a refreshed token).
    pub kept_newer: Vec<String>,
    pub warnings: Vec<String>,
}

/// Collects `p`'s credentials from the host (files, keyring entries, variables) into the
/// store. `env` looks variables up (the process environment in production). Idempotent.
pub fn collect(
    store: &Store,
    p: ProviderKind,
    keep_in: StoreKind,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<CollectReport> {
    let spec = Spec::of(p);
    let _lock = store.lock()?;
    dirs::ensure_private_dir(&store.provider_dir(p))?;
    store.switch_store(p, keep_in)?;
    let mut manifest = store.manifest(p);
    let mut report = CollectReport::default();
    let now = now_secs();

    let mut put_file = |target: &str,
                        source: String,
                        kind: &str,
                        secret: Secret,
                        report: &mut CollectReport|
     -> Result<()> {
        let rule = spec.expiry_of(target);
        let expires = rule.and_then(|r| spec::expiry_secs(r, secret.expose()));
        // A token a turn refreshed is newer than the host's copy: keep it.
        if let (Some(rule), Some(stored)) = (rule, store.file(p, target)) {
            let stored_exp = spec::expiry_secs(rule, stored.expose());
            if stored_exp.is_some() && stored_exp > expires {
                report.kept_newer.push(target.to_string());
                return Ok(());
            }
        }
        store.put_file(p, target, &secret)?;
        let item = Item {
            kind: kind.to_string(),
            target: target.to_string(),
            source,
            collected_at: now,
            refreshed_at: None,
            sha256: sha256_hex(secret.expose()),
            expires_at: expires,
        };
        report.found.push(item.clone());
        manifest.upsert(item);
        Ok(())
    };

    for f in &spec.files {
        let Some(path) = spec::expand(&f.source, env) else {
            continue;
        };
        match fs::read(&path) {
            Ok(bytes) if !bytes.is_empty() => {
                put_file(&f.target, path, "file", Secret::new(bytes), &mut report)?
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => report.warnings.push(format!("cannot read {path}: {e}")),
        }
    }
    // On Linux a keyring needs a D-Bus session; without one there is nothing to read.
    let keyring_reachable = !cfg!(target_os = "linux")
        || env("DBUS_SESSION_BUS_ADDRESS").is_some_and(|v| !v.is_empty());
    for k in spec.keyring.iter().filter(|_| keyring_reachable) {
        let services = keyring_services(k, env);
        let account = crate::auth::keyring::default_account();
        for service in services {
            match crate::auth::keyring::read(&service, &account) {
                Ok(Some(secret)) if !secret.is_empty() => {
                    put_file(
                        &k.target,
                        format!("keyring:{service}/{account}"),
                        "keyring",
                        secret,
                        &mut report,
                    )?;
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    report.warnings.push(format!("keyring not read: {e}"));
                    break;
                }
            }
        }
    }

    let (vars, env_items) = collect_vars(store, p, &spec, env, now);
    // The manifest says where secrets go: save it before the first write.
    manifest.store = keep_in;
    store.save_manifest(p, &manifest)?;
    if !env_items.is_empty() {
        store.put_env(p, &vars)?;
    }
    for item in env_items {
        report.found.push(item.clone());
        manifest.upsert(item);
    }
    if !manifest.items.is_empty() {
        store.save_manifest(p, &manifest)?;
    }
    Ok(report)
}

/// The keyring services a keyring source is read from (Claude's are named after its
/// config directory).
fn keyring_services(k: &spec::KeyringSource, env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let config_dir = match k.hashed_by.as_deref() {
        Some("CLAUDE_CONFIG_DIR") => crate::auth::keyring::claude_secure_storage_dir(env),
        Some(var) => env(var),
        None => None,
    };
    if k.service == crate::auth::keyring::CLAUDE_SERVICE {
        crate::auth::keyring::claude_services(config_dir.as_deref())
    } else {
        vec![k.service.clone()]
    }
}

/// `p`'s variables: the stored ones with those the host's environment sets (or the stored
/// files derive) put over them, and an item for each one collected now.
fn collect_vars(
    store: &Store,
    p: ProviderKind,
    spec: &Spec,
    env: &dyn Fn(&str) -> Option<String>,
    now: u64,
) -> (Vec<(String, Secret)>, Vec<Item>) {
    let mut vars: Vec<(String, Secret)> = store.env(p);
    let mut set_var = |name: &str, value: Secret, kind: &str, source: String| {
        vars.retain(|(k, _)| k != name);
        let item = Item {
            kind: kind.to_string(),
            target: name.to_string(),
            source,
            collected_at: now,
            refreshed_at: None,
            sha256: sha256_hex(value.expose()),
            expires_at: None,
        };
        vars.push((name.to_string(), value));
        item
    };
    let mut env_items = Vec::new();
    for name in &spec.env {
        if let Some(v) = env(name).filter(|v| !v.is_empty()) {
            env_items.push(set_var(name, Secret::new(v), "env", format!("env:{name}")));
        }
    }
    for d in &spec.derived_env {
        if env_items.iter().any(|i| i.target == d.env) {
            continue;
        }
        let value = store
            .file(p, &d.file)
            .and_then(|f| serde_json::from_slice::<serde_json::Value>(f.expose()).ok())
            .and_then(|j| spec::lookup(&j, &d.json).and_then(|v| v.as_str().map(str::to_string)))
            .filter(|v| !v.is_empty());
        if let Some(v) = value {
            env_items.push(set_var(
                &d.env,
                Secret::new(v),
                "derived",
                format!("{}:{}", d.file, d.json),
            ));
        }
    }
    (vars, env_items)
}

/// What `caw-box auth login` stores for one provider: files under HOME the vendor's CLI
/// wrote, and variables (a key read from stdin).
#[derive(Debug, Default)]
pub struct LoginResult {
    pub files: Vec<(String, Secret)>,
    pub vars: Vec<(String, Secret)>,
}

/// The source `auth status` shows for what `auth login` stored.
pub const LOGIN_SOURCE: &str = "login";

/// Stores a login of `p` (`caw-box auth login`), under the store's lock, where `p`'s
/// secrets are kept now (files, or the keyring): each item recorded with source
/// [`LOGIN_SOURCE`], downstream the same as a collected one. Returns the items stored.
pub fn store_login(store: &Store, p: ProviderKind, login: &LoginResult) -> Result<Vec<Item>> {
    let spec = Spec::of(p);
    let _lock = store.lock()?;
    dirs::ensure_private_dir(&store.provider_dir(p))?;
    let mut manifest = store.manifest(p);
    // A first write of this provider: the manifest says where secrets go.
    store.save_manifest(p, &manifest)?;
    let now = now_secs();
    let mut stored = Vec::new();
    for (target, secret) in &login.files {
        store.put_file(p, target, secret)?;
        let expires = spec
            .expiry_of(target)
            .and_then(|r| spec::expiry_secs(r, secret.expose()));
        stored.push(login_item("file", target, secret, expires, now));
    }
    if !login.vars.is_empty() {
        let mut vars = store.env(p);
        for (name, value) in &login.vars {
            vars.retain(|(k, _)| k != name);
            vars.push((name.clone(), value.clone()));
            stored.push(login_item("env", name, value, None, now));
        }
        store.put_env(p, &vars)?;
    }
    for item in &stored {
        manifest.upsert(item.clone());
    }
    store.save_manifest(p, &manifest)?;
    Ok(stored)
}

fn login_item(kind: &str, target: &str, secret: &Secret, expires: Option<u64>, now: u64) -> Item {
    Item {
        kind: kind.to_string(),
        target: target.to_string(),
        source: LOGIN_SOURCE.to_string(),
        collected_at: now,
        refreshed_at: None,
        sha256: sha256_hex(secret.expose()),
        expires_at: expires,
    }
}

/// Writes back what a turn's CLI changed (`changed`: files under HOME, as the entrypoint
/// handed them out), keeping for each file whichever copy states the later expiry.
/// Returns the targets that were updated.
pub fn write_back(
    store: &Store,
    p: ProviderKind,
    changed: &std::collections::HashMap<String, Vec<u8>>,
) -> Result<Vec<String>> {
    let spec = Spec::of(p);
    let _lock = store.lock()?;
    let mut manifest = store.manifest(p);
    let mut updated = Vec::new();
    for target in spec.home_targets() {
        let Some(bytes) = changed.get(&target).cloned() else {
            continue;
        };
        // A brokered turn's placeholder login: the real one stays (the broker refreshes it).
        let mark = crate::auth::login::PLACEHOLDER_MARK.as_bytes();
        if bytes.windows(mark.len()).any(|w| w == mark) {
            continue;
        }
        let fresh = Secret::new(bytes);
        let rule = spec.expiry_of(&target);
        let fresh_exp = rule.and_then(|r| spec::expiry_secs(r, fresh.expose()));
        if let (Some(rule), Some(stored)) = (rule, store.file(p, &target)) {
            let stored_exp = spec::expiry_secs(rule, stored.expose());
            if stored_exp.is_some() && stored_exp >= fresh_exp && stored != fresh {
                continue; // another turn wrote a newer one meanwhile
            }
        }
        store.put_file(p, &target, &fresh)?;
        let now = now_secs();
        let item = match manifest.items.iter().find(|i| i.target == target) {
            Some(i) => Item {
                refreshed_at: Some(now),
                sha256: sha256_hex(fresh.expose()),
                expires_at: fresh_exp,
                ..i.clone()
            },
            None => Item {
                kind: "file".into(),
                target: target.clone(),
                source: "written by the CLI in a turn".into(),
                collected_at: now,
                refreshed_at: Some(now),
                sha256: sha256_hex(fresh.expose()),
                expires_at: fresh_exp,
            },
        };
        manifest.upsert(item);
        updated.push(target);
    }
    if !updated.is_empty() {
        store.save_manifest(p, &manifest)?;
    }
    Ok(updated)
}

/// Stores the tokens of a refresh the credential broker made for `p`'s OAuth login, under
/// the store's lock, if the stored login still has `previous` as its refresh token (else a
/// newer one is stored already: nothing changes). Returns whether it was stored.
pub fn store_refresh(
    store: &Store,
    p: ProviderKind,
    previous: &str,
    tokens: &crate::auth::login::RefreshedTokens,
) -> Result<bool> {
    let spec = Spec::of(p);
    let Some(o) = &spec.oauth else {
        return Ok(false);
    };
    let _lock = store.lock()?;
    let Some(stored) = store.file(p, &o.target) else {
        return Ok(false);
    };
    let Some(fresh) = crate::auth::login::refreshed_login(o, stored.expose(), previous, tokens)
    else {
        return Ok(false);
    };
    let fresh = Secret::new(fresh);
    store.put_file(p, &o.target, &fresh)?;
    let mut manifest = store.manifest(p);
    let now = now_secs();
    if let Some(i) = manifest.items.iter().find(|i| i.target == o.target) {
        let item = Item {
            refreshed_at: Some(now),
            sha256: sha256_hex(fresh.expose()),
            expires_at: spec
                .expiry_of(&o.target)
                .map_or(Some(tokens.expires_ms / 1000), |r| {
                    spec::expiry_secs(r, fresh.expose())
                }),
            ..i.clone()
        };
        manifest.upsert(item);
        store.save_manifest(p, &manifest)?;
    }
    Ok(true)
}
