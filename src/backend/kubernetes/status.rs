//! What a pod's status says in caw-box's terms: how far it is on its way to running, how it
//! ended and why (an OOM kill, an eviction, a PodSecurity refusal), as a [`ContainerInfo`].
//! Pure: no API calls.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use super::meta;
use super::sidecars::EGRESS_INIT;
use crate::backend::{ContainerInfo, ContainerState};
use crate::error::Error;

/// Where a pod is on its way to running.
pub(super) enum Progress {
    Waiting(String),
    Running,
    Ended(i64),
    ImageMissing(String),
}

/// Whether pod's egress init container ([`egress_init`]) ended in failure.
///
/// [`egress_init`]: super::sidecars::egress_init
pub(super) fn egress_init_failed(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.name == EGRESS_INIT)
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .any(|t| t.exit_code != 0)
}

pub(super) fn pod_progress(pod: &Pod) -> Progress {
    let status = pod.status.clone().unwrap_or_default();
    // An init container that cannot get its image (the turn's own): the main container
    // only says PodInitializing meanwhile.
    let init_waiting = status
        .init_container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.clone())
        .find_map(|w| {
            w.reason
                .filter(|r| r.contains("Image"))
                .map(|r| (r, w.message))
        });
    if let Some((reason, message)) = init_waiting {
        if reason != "ImagePulled" {
            return Progress::ImageMissing(format!("{reason}: {}", message.unwrap_or_default()));
        }
    }
    // The agent's container (a broker beside it ends after it); else the only one.
    let main = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone());
    let statuses = status.container_statuses.clone().unwrap_or_default();
    let container = statuses
        .iter()
        .find(|c| Some(&c.name) == main.as_ref())
        .or(statuses.first())
        .cloned();
    if let Some(state) = container.as_ref().and_then(|c| c.state.clone()) {
        if let Some(t) = state.terminated {
            return Progress::Ended(t.exit_code.into());
        }
        if state.running.is_some() {
            return Progress::Running;
        }
        if let Some(w) = state.waiting {
            let reason = w.reason.unwrap_or_default();
            if matches!(
                reason.as_str(),
                "ErrImageNeverPull" | "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName"
            ) {
                return Progress::ImageMissing(format!(
                    "{reason}: {}",
                    w.message.unwrap_or_default()
                ));
            }
            return Progress::Waiting(format!("{reason} {}", w.message.unwrap_or_default()));
        }
    }
    let phase = status.phase.clone().unwrap_or_default();
    if phase == "Failed" || phase == "Succeeded" {
        // Ended before its container ran (an init container failed).
        return Progress::Ended(if phase == "Failed" { 1 } else { 0 });
    }
    let why = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.status != "True")
        .filter_map(|c| c.message)
        .next()
        .unwrap_or_default();
    Progress::Waiting(format!("{phase} {why}").trim().to_string())
}

/// Reads a pod's memory cgroup counters (cgroup v1 and v2; one of them is there).
pub(super) const OOM_COUNTERS: &str =
    "cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null; true";

/// The kernel's OOM kills in [`OOM_COUNTERS`]' output (`oom_kill N` lines).
pub(super) fn oom_kills(counters: &str) -> u64 {
    counters
        .lines()
        .filter_map(|l| l.trim().strip_prefix("oom_kill "))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum()
}

/// The result line of a turn whose pod hit its memory limit.
pub(super) fn out_of_memory(pod: &Pod) -> String {
    let limit = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| {
            c.resources
                .as_ref()?
                .limits
                .as_ref()?
                .get("memory")
                .cloned()
        })
        .map(|q| format!("its memory limit of {} (--memory)", readable_bytes(&q.0)))
        .unwrap_or_else(|| "the node's memory".to_string());
    format!("the turn's pod was OOM-killed: a process of it used up {limit}")
}

/// A quantity of bytes as written (`134217728` is `128Mi`).
pub(super) fn readable_bytes(quantity: &str) -> String {
    match quantity.parse::<u64>() {
        Ok(n) if n > 0 && n % (1 << 30) == 0 => format!("{}Gi", n >> 30),
        Ok(n) if n > 0 && n % (1 << 20) == 0 => format!("{}Mi", n >> 20),
        _ => quantity.to_string(),
    }
}

/// Why the cluster ended a pod, when its status says: the kubelet evicted it (node
/// pressure), or killed its container for memory.
pub(super) fn pod_failure(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if status.reason.as_deref() == Some("Evicted") {
        return Some(format!(
            "the turn's pod was evicted by its node: {}",
            status
                .message
                .as_deref()
                .unwrap_or("no reason given")
                .trim()
        ));
    }
    let oom = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .any(|t| t.reason.as_deref() == Some("OOMKilled"));
    oom.then(|| out_of_memory(pod))
}

/// A turn's pod gone before the turn ended: the API's eviction (a node drain) deletes the
/// pod, and on this side that looks as a deletion does.
/// The namespace's PodSecurity admission refused pod `name` (`message`, the API server's):
/// under `--allow-host` its egress init container needs NET_ADMIN and root, which the
/// `baseline` and `restricted` levels forbid.
pub fn pod_security_refused(name: &str, message: &str) -> Error {
    let why = if message.contains(EGRESS_INIT) || message.contains("NET_ADMIN") {
        "holding the turn's egress (--egress balanced or locked, the default balanced) needs an init container with NET_ADMIN and NET_RAW running as root, which the namespace's PodSecurity level (baseline or restricted) forbids"
    } else {
        "the namespace's PodSecurity level forbids it"
    };
    let first = message.lines().next().unwrap_or(message);
    Error::environment(format!(
        "the API server refused pod '{name}': {why} ({first})"
    ))
    .with_hint("run the turn in a namespace labelled pod-security.kubernetes.io/enforce=privileged, or choose --egress open")
}

pub(super) fn deleted_under_turn(name: &str) -> Error {
    let id = name.strip_prefix("caw-box-").unwrap_or(name);
    Error::environment(format!(
        "the turn's pod '{name}' was deleted before the turn ended: evicted (a node drain, the Eviction API) or deleted by someone"
    ))
    .with_hint(format!(
        "the session is kept: resume it with `caw-box resume {id}`"
    ))
}

pub(super) fn pod_scheduled(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "PodScheduled" && c.status == "True")
}

pub(super) fn container_info(pod: &Pod) -> ContainerInfo {
    let status = pod.status.clone().unwrap_or_default();
    let (state, finished) = if pod.metadata.deletion_timestamp.is_some() {
        (ContainerState::Removing, false)
    } else {
        match pod_progress(pod) {
            Progress::Running => (ContainerState::Running, false),
            Progress::Ended(_) => (ContainerState::Exited, true),
            _ => match status.phase.as_deref() {
                Some("Succeeded") | Some("Failed") => (ContainerState::Exited, true),
                _ => (ContainerState::Created, false),
            },
        }
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let claims: HashMap<String, String> = spec
        .volumes
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| Some((v.name, v.persistent_volume_claim?.claim_name)))
        .collect();
    let mounts = spec
        .containers
        .first()
        .and_then(|c| c.volume_mounts.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| Some((m.mount_path, claims.get(&m.name)?.clone())))
        .collect();
    ContainerInfo {
        id: pod.metadata.uid.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        labels: meta::merged(&pod.metadata),
        state,
        created: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| std::time::SystemTime::from(t.0)),
        finished,
        mounts,
    }
}
