//! Leases (coordination.k8s.io/v1) in the namespace, so that what one host's caw-box holds
//! every host's sees:
//! - a brokered login's refresh lock, `caw-box-refresh-<login>`: one driver at a time
//!   refreshes a login;
//! - the slots of an account's turns in flight (`--per-account N`),
//!   `caw-box-slot-<account>-<k>` for k below N: a turn runs while it holds one.
//!
//! Taken by creating it, or by updating it when it is free (no holder) or expired (its record
//! unchanged for its duration, as this process saw it: no other host's clock is trusted);
//! every write names the version it read, so of two racing takers one wins. Renewed while
//! held, and released (holder cleared) after.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

use super::{is_status, KubeBackend, MANAGED_BY};
use crate::backend::Hold;
use crate::error::{Error, ErrorKind, Result};

/// How long a Lease holds without renewal: a holder that died is taken over after this.
const DURATION: Duration = Duration::from_secs(15);
/// How often a held Lease is renewed.
const RENEW: Duration = Duration::from_secs(5);
/// How often a waiting taker reads the Lease again.
const POLL: Duration = Duration::from_millis(150);

/// `name` as a DNS label's characters: lower case, `-` for anything else.
fn label(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// The Lease of login `login` (a provider's name, `claude_code`: a DNS label).
pub(super) fn lease_name(login: &str) -> String {
    format!("caw-box-refresh-{}", label(login))
}

/// The Lease of slot `k` of account `account`'s turns in flight.
pub(super) fn slot_name(account: &str, k: u32) -> String {
    format!("caw-box-slot-{}-{k}", label(account))
}

/// Each Lease this process saw held: its name, the version read, and when that version was
/// first read. A holder that has not renewed for the Lease's duration since is gone. Kept
/// across tries (a turn waiting for a slot tries again and again).
static SEEN: std::sync::Mutex<Vec<(String, String, Instant)>> = std::sync::Mutex::new(Vec::new());

/// What `SEEN` has of Lease `name`.
fn seen(name: &str) -> Option<(String, Instant)> {
    let seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    seen.iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, v, at)| (v.clone(), *at))
}

/// Notes that Lease `name` was read held at `version` (the first time seen kept when it is
/// the same version as before).
fn saw(name: &str, version: Option<String>) {
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let same = seen
        .iter()
        .any(|(n, v, _)| n == name && Some(v) == version.as_ref());
    if !same {
        seen.retain(|(n, _, _)| n != name);
        if let Some(v) = version {
            seen.push((name.to_string(), v, Instant::now()));
        }
    }
}

/// Who holds a Lease: this host, this process and this hold (two holds of one process
/// are two holders).
fn identity() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}/{}/{n}", crate::dirs::host_name(), std::process::id())
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Whether a Lease read is free to take: no holder, or its record (`version`) unchanged
/// since `seen` (when this process first read that version) for the Lease's duration.
fn free(spec: Option<&LeaseSpec>, version: Option<&str>, seen: &Option<(String, Instant)>) -> bool {
    let Some(spec) = spec else { return true };
    if spec.holder_identity.as_deref().unwrap_or("").is_empty() {
        return true;
    }
    let duration = spec
        .lease_duration_seconds
        .map_or(DURATION, |s| Duration::from_secs(s.max(1) as u64));
    matches!((seen, version), (Some((v, at)), Some(now)) if v == now && at.elapsed() >= duration)
}

/// One try at Lease `name` for `me`: `Some` when it is now held (made, or taken free or
/// expired); `None` when another holds it, or won a race for it.
async fn try_take(api: &Api<Lease>, name: &str, me: &str) -> kube::Result<Option<Lease>> {
    let taken = match api.get_opt(name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some([(MANAGED_BY.0.into(), MANAGED_BY.1.into())].into()),
                    ..Default::default()
                },
                spec: Some(held_spec(me, None)),
            };
            api.create(&PostParams::default(), &lease).await
        }
        Some(mut lease) => {
            let version = lease.metadata.resource_version.clone();
            if free(lease.spec.as_ref(), version.as_deref(), &seen(name)) {
                lease.spec = Some(held_spec(me, lease.spec.as_ref()));
                api.replace(name, &PostParams::default(), &lease).await
            } else {
                saw(name, version);
                return Ok(None);
            }
        }
    };
    match taken {
        Ok(lease) => Ok(Some(lease)),
        // Another taker won the race.
        Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Keeps the taken `lease` (renewed in the background) until the returned hold goes.
fn kept(api: Api<Lease>, name: String, lease: Lease) -> Hold {
    let (end, ended) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(keep(api, name, lease, ended));
    Hold::kept(end, task)
}

impl KubeBackend {
    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Holds the Lease of `login`, waiting up to `limit` (see the module docs); `None`:
    /// not had in time, or the API server refused (it is logged: the refresh goes on as
    /// when a lock is not had in time).
    pub(super) async fn hold_refresh_lease(&self, login: &str, limit: Duration) -> Option<Hold> {
        let (api, name, me) = (self.leases(), lease_name(login), identity());
        let deadline = Instant::now() + limit;
        loop {
            if Instant::now() >= deadline {
                tracing::debug!("the refresh Lease {name} was not had within {limit:?}");
                return None;
            }
            match try_take(&api, &name, &me).await {
                Ok(Some(lease)) => {
                    tracing::debug!("holding the refresh Lease {name} as {me}");
                    return Some(kept(api, name, lease));
                }
                Ok(None) => tokio::time::sleep(POLL).await,
                Err(e) => {
                    tracing::warn!("could not take the refresh Lease {name}: {e}");
                    return None;
                }
            }
        }
    }

    /// One try at a free slot of `account`'s `cap` turns in flight across every host: the
    /// first of its slot Leases not held. `None`: all `cap` are held.
    pub(super) async fn try_slot_lease(&self, account: &str, cap: u32) -> Result<Option<Hold>> {
        let (api, me) = (self.leases(), identity());
        for k in 0..cap.max(1) {
            let name = slot_name(account, k);
            let taken = try_take(&api, &name, &me).await.map_err(|e| {
                Error::new(
                    ErrorKind::Environment,
                    format!(
                        "cannot take a slot of account {account} (Lease {name} in namespace {}): {e}",
                        self.namespace
                    ),
                )
            })?;
            if let Some(lease) = taken {
                tracing::debug!("holding the slot Lease {name} as {me}");
                return Ok(Some(kept(api, name, lease)));
            }
        }
        Ok(None)
    }
}

/// A Lease's spec held by `me` from now, after `before` (its transitions counted).
fn held_spec(me: &str, before: Option<&LeaseSpec>) -> LeaseSpec {
    let transitions = before.and_then(|s| s.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(DURATION.as_secs() as i32),
        acquire_time: Some(now()),
        renew_time: Some(now()),
        lease_transitions: Some(transitions + before.is_some() as i32),
        ..Default::default()
    }
}

/// Renews the held `lease` until `ended` (sent or dropped), then releases it (clears its
/// holder). A renewal that finds the Lease changed lost it (it expired meanwhile).
async fn keep(
    api: Api<Lease>,
    name: String,
    mut lease: Lease,
    mut ended: tokio::sync::oneshot::Receiver<()>,
) {
    let mut renewal = tokio::time::interval_at(tokio::time::Instant::now() + RENEW, RENEW);
    loop {
        tokio::select! {
            _ = &mut ended => break,
            _ = renewal.tick() => {
                if let Some(spec) = lease.spec.as_mut() {
                    spec.renew_time = Some(now());
                }
                match api.replace(&name, &PostParams::default(), &lease).await {
                    Ok(renewed) => lease = renewed,
                    Err(e) => {
                        tracing::warn!("lost the Lease {name}: {e}");
                        return;
                    }
                }
            }
        }
    }
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
        spec.renew_time = Some(now());
    }
    if let Err(e) = api.replace(&name, &PostParams::default(), &lease).await {
        tracing::debug!("could not release the Lease {name}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_named_by_its_login_or_account_as_a_dns_label() {
        assert_eq!(lease_name("codex"), "caw-box-refresh-codex");
        assert_eq!(lease_name("claude_code"), "caw-box-refresh-claude-code");
        assert_eq!(
            slot_name("claude_code-3f9a0c1d2b7e", 1),
            "caw-box-slot-claude-code-3f9a0c1d2b7e-1"
        );
    }

    /// Free: no spec, no holder, or a record seen unchanged for the Lease's duration; a
    /// record that changed since (renewed) is held again.
    #[test]
    fn a_lease_is_free_without_holder_or_once_unrenewed_for_its_duration() {
        let held = held_spec("a", None);
        assert_eq!(held.lease_transitions, Some(0));
        assert_eq!(held_spec("b", Some(&held)).lease_transitions, Some(1));
        assert!(free(None, Some("1"), &None));
        let released = LeaseSpec {
            holder_identity: None,
            ..held.clone()
        };
        assert!(free(Some(&released), Some("1"), &None));
        assert!(!free(Some(&held), Some("1"), &None));
        let just = Some(("1".to_string(), Instant::now()));
        assert!(!free(Some(&held), Some("1"), &just));
        let short = LeaseSpec {
            lease_duration_seconds: Some(1),
            ..held.clone()
        };
        let long_ago = Some(("1".to_string(), Instant::now() - Duration::from_secs(2)));
        assert!(free(Some(&short), Some("1"), &long_ago));
        assert!(!free(Some(&short), Some("2"), &long_ago), "renewed since");
        assert!(!free(Some(&held), Some("1"), &long_ago), "15 s not over");
    }
}
