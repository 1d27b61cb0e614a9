//! `caw-box auth collect|status|flags|rm`: the credential store from the user's side.

use serde::Serialize;

use crate::auth::spec::Spec;
use crate::auth::store::{self, Item, Store};
use crate::clock::now_secs;
use crate::error::{Error, Result};
use crate::output;
use crate::provider::ProviderKind;

fn providers(names: &[String]) -> Result<Vec<ProviderKind>> {
    if names.is_empty() {
        return Ok(ProviderKind::ALL.to_vec());
    }
    let mut ps = names
        .iter()
        .map(|n| n.parse::<ProviderKind>().map_err(Error::from))
        .collect::<Result<Vec<_>>>()?;
    ps.sort();
    ps.dedup();
    Ok(ps)
}

pub fn collect(names: &[String], kind: store::StoreKind, quiet: bool) -> Result<i32> {
    let store = Store::open()?;
    let env = |k: &str| std::env::var(k).ok();
    for p in providers(names)? {
        let report = store::collect(&store, p, kind, &env)?;
        for w in &report.warnings {
            output::eprintln(&format!("warning: {p}: {w}"));
        }
        if quiet {
            continue;
        }
        if report.found.is_empty() && report.kept_newer.is_empty() {
            output::println(&format!("{p}: nothing to collect"));
            continue;
        }
        for item in &report.found {
            output::println(&format!("{p}: {} from {}", item.target, item.source));
        }
        for t in &report.kept_newer {
            output::println(&format!(
                "{p}: {t} kept: the stored copy was refreshed in a turn and is newer than the host's"
            ));
        }
    }
    if !quiet {
        output::eprintln(&match kind {
            store::StoreKind::Files => format!("stored in {}", store.root().display()),
            store::StoreKind::Keyring => format!(
                "secrets stored in the OS keyring (service '{}'); manifest in {}",
                store::KEYRING_SERVICE,
                store.root().display()
            ),
        });
    }
    Ok(0)
}

/// How an expiry reads: "in 3h", "expired 2d ago". Public for the property tests only.
#[doc(hidden)]
pub fn expiry_text(exp: Option<u64>) -> (String, &'static str) {
    let Some(exp) = exp else {
        return ("-".into(), "");
    };
    let now = now_secs();
    if exp <= now {
        let d = humantime::format_duration(std::time::Duration::from_secs((now - exp) / 60 * 60));
        (format!("expired {d} ago"), "expired")
    } else {
        let left = exp - now;
        let d = humantime::format_duration(std::time::Duration::from_secs(left / 60 * 60));
        (
            format!("in {d}"),
            if left < 3600 { "expiring" } else { "ok" },
        )
    }
}

#[derive(Serialize)]
struct StatusItem<'a> {
    #[serde(flatten)]
    item: &'a Item,
    state: &'static str,
}

#[derive(Serialize)]
struct ProviderStatus<'a> {
    provider: ProviderKind,
    present: bool,
    /// The account the stored credentials spend: a fingerprint, never the secret.
    account: Option<String>,
    /// What the account has left, as the latest brokered responses said (`null`: no
    /// brokered turn has seen its limits yet).
    windows: Option<crate::auth::windows::Standing>,
    /// How the account's back-off from a 429/529 holds its turns now, if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    backoff: Option<crate::auth::backoff::Holding>,
    items: Vec<StatusItem<'a>>,
}

pub fn status(json: bool) -> Result<i32> {
    let store = Store::open()?;
    let manifests: Vec<(ProviderKind, store::Manifest)> = ProviderKind::ALL
        .iter()
        .map(|p| (*p, store.manifest(*p)))
        .collect();
    if json {
        output::print_json(&status_rows(&manifests));
        return Ok(0);
    }
    let mut rows = vec![[
        "PROVIDER".to_string(),
        "ACCOUNT".to_string(),
        "CREDENTIAL".to_string(),
        "FROM".to_string(),
        "COLLECTED".to_string(),
        "EXPIRES".to_string(),
    ]];
    for (p, m) in &manifests {
        if m.items.is_empty() {
            rows.push([
                p.to_string(),
                "-".into(),
                "(none)".into(),
                format!("run: caw-box auth collect --provider {p}"),
                "-".into(),
                "-".into(),
            ]);
        }
        for i in &m.items {
            let (exp, state) = expiry_text(i.expires_at);
            let flag = match state {
                "expired" => " (EXPIRED)",
                "expiring" => " (expiring soon)",
                _ => "",
            };
            let collected = match i.refreshed_at {
                Some(r) => format!(
                    "{} (refreshed {})",
                    super::ago::ago(i.collected_at),
                    super::ago::ago(r)
                ),
                None => super::ago::ago(i.collected_at),
            };
            rows.push([
                p.to_string(),
                crate::auth::account::of_manifest(*p, m).unwrap_or_default(),
                i.target.clone(),
                i.source.clone(),
                collected,
                format!("{exp}{flag}"),
            ]);
        }
    }
    output::print_table(&rows);
    print_windows(&manifests);
    Ok(0)
}

/// Each account's windows, as its latest brokered responses said.
fn print_windows(manifests: &[(ProviderKind, store::Manifest)]) {
    let now = crate::clock::now_secs();
    for (p, m) in manifests {
        let Some(account) = crate::auth::account::of_manifest(*p, m) else {
            continue;
        };
        let said = match crate::auth::windows::read(&account) {
            None if *p == ProviderKind::Gemini => {
                "Google's responses name no limits: not known".to_string()
            }
            Some(s) => format!(
                "{} (as of {})",
                crate::auth::windows::summary(&s, now),
                super::ago::ago(s.updated_at)
            ),
            None => "not known yet: no brokered turn has seen its limits".to_string(),
        };
        output::println(&format!("\n{account}  {said}"));
        let now_ms = crate::clock::now_ms();
        if let Some(h) = crate::auth::backoff::holding(&account, now_ms) {
            output::println(&format!(
                "{account}  {}",
                crate::auth::backoff::summary(&h, now_ms)
            ));
        }
    }
}

/// `auth status --json`'s rows, from each provider's manifest.
fn status_rows(manifests: &[(ProviderKind, store::Manifest)]) -> Vec<ProviderStatus<'_>> {
    manifests
        .iter()
        .map(|(p, m)| ProviderStatus {
            provider: *p,
            present: !m.items.is_empty(),
            account: crate::auth::account::of_manifest(*p, m),
            windows: crate::auth::account::of_manifest(*p, m)
                .and_then(|a| crate::auth::windows::read(&a)),
            backoff: crate::auth::account::of_manifest(*p, m)
                .and_then(|a| crate::auth::backoff::holding(&a, crate::clock::now_ms())),
            items: m
                .items
                .iter()
                .map(|i| StatusItem {
                    item: i,
                    state: match expiry_text(i.expires_at).1 {
                        "" => "ok",
                        s => s,
                    },
                })
                .collect(),
        })
        .collect()
}

/// What `auth status --json` prints, as a value (for the library's `embed`).
pub(crate) fn status_value() -> Result<serde_json::Value> {
    let store = Store::open()?;
    let manifests: Vec<(ProviderKind, store::Manifest)> = ProviderKind::ALL
        .iter()
        .map(|p| (*p, store.manifest(*p)))
        .collect();
    Ok(serde_json::to_value(status_rows(&manifests)).expect("status serializes"))
}

/// `auth collect` for `names` (all providers when empty) as a value: per provider, what was
/// `found` (items without secrets), `kept_newer` and the `warnings` (for the library's `embed`).
pub(crate) fn collect_value(names: &[String], keyring: bool) -> Result<serde_json::Value> {
    let store = Store::open()?;
    let kind = if keyring {
        store::StoreKind::Keyring
    } else {
        store::StoreKind::Files
    };
    let env = |k: &str| std::env::var(k).ok();
    let mut out = serde_json::Map::new();
    for p in providers(names)? {
        let report = store::collect(&store, p, kind, &env)?;
        out.insert(
            p.to_string(),
            serde_json::json!({
                "found": report.found,
                "kept_newer": report.kept_newer,
                "warnings": report.warnings,
            }),
        );
    }
    out.insert(
        "stored_in".into(),
        store.root().display().to_string().into(),
    );
    Ok(out.into())
}

/// The flags a plain `docker run` of a caw-box image needs for `p`'s credentials: the
/// provider's part of the store as a directory mount (the image's entrypoint places the
/// files under HOME and reads the keys from it), and by name any key variable that is set
/// here but not stored. Never a value.
pub fn flags(name: &str) -> Result<i32> {
    let p: ProviderKind = name.parse()?;
    let store = Store::open()?;
    let spec = Spec::of(p);
    let mut flags = Vec::new();
    if store.has_any(p) {
        flags.push(format!(
            "-v {}:/run/caw-box/auth:ro",
            store.provider_dir(p).display()
        ));
    }
    let stored: Vec<String> = store.env(p).into_iter().map(|(k, _)| k).collect();
    for var in &spec.env {
        if !stored.contains(var) && std::env::var_os(var).is_some_and(|v| !v.is_empty()) {
            flags.push(format!("-e {var}"));
        }
    }
    if flags.is_empty() {
        return Err(Error::credentials(format!("no credentials for {p}"))
            .with_hint(format!("run `caw-box auth collect --provider {p}` first")));
    }
    output::println(&flags.join(" "));
    Ok(0)
}

pub fn rm(names: &[String], quiet: bool) -> Result<i32> {
    let store = Store::open()?;
    for p in providers(names)? {
        let removed = store.remove(p)?;
        if !quiet {
            output::println(&format!(
                "{p}: {}",
                if removed { "removed" } else { "nothing stored" }
            ));
        }
    }
    Ok(0)
}
