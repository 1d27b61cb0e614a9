//! Pods: create one (its name is the lock), wait for it to run (or say why it cannot),
//! build one from a spec, delete one for good.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, LogParams, PostParams};

use super::sidecars::EGRESS_INIT;
use super::status::{
    egress_init_failed, pod_progress, pod_scheduled, pod_security_refused, Progress,
};
use super::{failed, is_status, meta, KubeBackend};
use crate::backend::{Backend, CreateError};
use crate::error::{Error, Result};

/// How long a pod may take to start running (scheduling, a claim to bind, an image).
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a deleted pod may take to go.
const GONE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a turn's claims may take to bind before the turn is refused (the lab's bind
/// within a second; a provisioner in the cloud takes some seconds), unless other claims of
/// their storage class go on binding meanwhile ([`BindWatch`]).
const CLAIM_BIND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long no claim of the storage class may bind before a claim still waiting past
/// [`CLAIM_BIND_TIMEOUT`] is taken for one that never will.
const CLAIM_BIND_STALL: Duration = Duration::from_secs(15);

impl KubeBackend {
    /// Deletes pod `name` (only the one of `uid`, when given: not a newer pod that took the
    /// name) and returns once it is gone for good: a claim is free (and deletable) only then.
    pub(super) async fn delete_pod(
        &self,
        name: &str,
        uid: Option<String>,
        force: bool,
    ) -> Result<()> {
        let t0 = std::time::Instant::now();
        let params = DeleteParams {
            grace_period_seconds: force.then_some(0),
            preconditions: uid.clone().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.pods().delete(name, &params).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => return Ok(()),
            // Another pod of that name by now: the one meant is gone.
            Err(e) if uid.is_some() && is_status(&e, 409) => return Ok(()),
            Err(e) => return Err(failed(format!("delete pod '{name}'"), &e)),
        }
        let deadline = tokio::time::Instant::now() + GONE_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            match self.pods().get_opt(name).await {
                Ok(None) => {
                    super::timeline(&format!("delete ({name})"), t0);
                    return Ok(());
                }
                Ok(Some(p)) if uid.is_some() && p.metadata.uid != uid => return Ok(()),
                Ok(Some(_)) => tokio::time::sleep(super::poll_after(t0)).await,
                Err(e) => return Err(failed(format!("read pod '{name}'"), &e)),
            }
        }
        Err(Error::environment(format!(
            "pod '{name}' was deleted but is still there after {} s",
            GONE_TIMEOUT.as_secs()
        )))
    }

    /// Whether state claim `claim` holds the image's HOME already ([`meta::HOME_SEEDED`]).
    pub(super) async fn home_seeded(&self, claim: &str) -> bool {
        let t0 = std::time::Instant::now();
        let seeded = self
            .claims()
            .get_opt(claim)
            .await
            .ok()
            .flatten()
            .is_some_and(|c| {
                c.metadata
                    .annotations
                    .is_some_and(|a| a.contains_key(super::meta::HOME_SEEDED))
            });
        super::timeline("claim seeded?", t0);
        seeded
    }

    /// Annotates state claim `claim` as seeded once pod `name`'s seed-home init container
    /// ended well (best effort: without it the next turn seeds again, which changes
    /// nothing but its time).
    pub(super) async fn note_seeded(&self, name: &str, claim: &str) {
        let Ok(Some(pod)) = self.pods().get_opt(name).await else {
            return;
        };
        let done = pod
            .status
            .and_then(|s| s.init_container_statuses)
            .unwrap_or_default()
            .iter()
            .any(|c| {
                c.name == super::spec::SEED_HOME
                    && c.state
                        .as_ref()
                        .and_then(|s| s.terminated.as_ref())
                        .is_some_and(|t| t.exit_code == 0)
            });
        if done {
            let patch = serde_json::json!({"metadata": {"annotations": {super::meta::HOME_SEEDED: "true"}}});
            let params = kube::api::PatchParams::default();
            if let Err(e) = self
                .claims()
                .patch(claim, &params, &kube::api::Patch::Merge(&patch))
                .await
            {
                tracing::debug!("could not note claim '{claim}' as seeded: {e}");
            }
        }
    }

    /// Creates a pod; a taken name is `NameTaken`.
    pub(super) async fn create_pod(&self, pod: &Pod) -> std::result::Result<(), CreateError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let t0 = std::time::Instant::now();
        match self.pods().create(&PostParams::default(), pod).await {
            Ok(_) => {
                super::timeline(&format!("pod create ({name})"), t0);
                Ok(())
            }
            Err(e) if is_status(&e, 409) => Err(CreateError::NameTaken),
            Err(kube::Error::Api(r)) if r.message.contains("PodSecurity") => {
                Err(CreateError::Other(pod_security_refused(&name, &r.message)))
            }
            Err(e) => Err(CreateError::Other(failed(
                format!("create pod '{name}'"),
                &e,
            ))),
        }
    }

    /// Waits for a created pod's container to run (or to have run already); a pod whose
    /// image cannot be had is deleted and reported as `ImageMissing`.
    pub(super) async fn wait_running(
        &self,
        name: &str,
        image: &str,
    ) -> std::result::Result<(), CreateError> {
        let started = tokio::time::Instant::now();
        let deadline = started + START_TIMEOUT;
        let t0 = std::time::Instant::now();
        let mut scheduled: Option<std::time::Instant> = None;
        let mut watch = BindWatch::default();
        let mut last;
        loop {
            let pod = self
                .pods()
                .get_opt(name)
                .await
                .map_err(|e| CreateError::Other(failed(format!("read pod '{name}'"), &e)))?;
            let Some(pod) = pod else {
                return Err(CreateError::Other(Error::environment(format!(
                    "pod '{name}' was deleted before it ran"
                ))));
            };
            if egress_init_failed(&pod) {
                // Its own words (iptables missing from a custom image, a kernel without
                // nf_tables or ip_tables), then the pod goes: no turn without the rules.
                let params = LogParams {
                    container: Some(EGRESS_INIT.to_string()),
                    ..Default::default()
                };
                let said = self.pods().logs(name, &params).await.unwrap_or_default();
                let said = said.lines().rev().find(|l| !l.trim().is_empty());
                let _ = self.remove_container(name, true).await;
                return Err(CreateError::Other(
                    Error::environment(format!(
                        "the turn's egress rules (--allow-host) could not be set in pod '{name}': {}",
                        said.unwrap_or("its init container failed").trim()
                    ))
                    .with_hint(format!(
                        "the image '{image}' needs iptables (caw-box's images have it) and the node's kernel nf_tables or ip_tables"
                    )),
                ));
            }
            if scheduled.is_none() && pod_scheduled(&pod) {
                super::timeline("scheduling", t0);
                scheduled = Some(std::time::Instant::now());
            }
            match pod_progress(&pod) {
                Progress::Running | Progress::Ended(_) => {
                    super::timeline("init and start", scheduled.unwrap_or(t0));
                    return Ok(());
                }
                Progress::ImageMissing(why) => {
                    let _ = self.remove_container(name, true).await;
                    return Err(CreateError::ImageMissing(Error::environment(format!(
                        "image '{image}' is not available to the cluster ({why})"
                    ))));
                }
                Progress::Waiting(why) => last = why,
            }
            // A claim that does not bind (no default storage class, a provisioner that
            // fails) keeps the pod unscheduled for ever: told, not waited out. One queued
            // behind others (a burst of sessions, a provisioner that makes one volume at a
            // time) is waited for while its class's claims go on binding.
            if started.elapsed() > CLAIM_BIND_STALL && !pod_scheduled(&pod) {
                let unbound = self.unbound_claims(&pod).await;
                if let Some((_, class)) = unbound.first() {
                    let bound = self.bound_claims_of(class.as_deref()).await;
                    watch.observe(bound, std::time::Instant::now());
                }
                if !unbound.is_empty()
                    && started.elapsed() > CLAIM_BIND_TIMEOUT
                    && watch.stalled(std::time::Instant::now())
                {
                    let unbound: Vec<String> = unbound.into_iter().map(|(c, _)| c).collect();
                    let _ = self.remove_container(name, true).await;
                    return Err(CreateError::Other(
                        Error::environment(format!(
                            "pod '{name}' cannot start: claim {} not bound after {} s",
                            unbound.join(", claim "),
                            started.elapsed().as_secs()
                        ))
                        .with_hint(format!(
                            "`kubectl -n {} describe pvc` says why (a storage class that does not exist or cannot provision?)",
                            self.namespace
                        )),
                    ));
                }
            }
            if tokio::time::Instant::now() > deadline {
                let _ = self.remove_container(name, true).await;
                return Err(CreateError::Other(Error::environment(format!(
                    "pod '{name}' did not start within {} s: {last}",
                    START_TIMEOUT.as_secs()
                ))
                .with_hint(format!(
                    "`kubectl -n {} describe pod {name}` says why (a claim not bound, no node with room?)",
                    self.namespace
                ))));
            }
            tokio::time::sleep(super::poll_after(t0)).await;
        }
    }

    pub(super) fn pod(
        &self,
        name: &str,
        labels: &HashMap<String, String>,
        mut spec: PodSpec,
    ) -> Pod {
        super::spec::for_cluster(&mut spec, &self.cluster);
        let (labels, annotations) = meta::split(labels);
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(spec),
            ..Default::default()
        }
    }

    /// How many claims of storage class `class` (`None`: of none named) are bound in the
    /// namespace; 0 where they cannot be listed.
    async fn bound_claims_of(&self, class: Option<&str>) -> usize {
        let Ok(claims) = self.claims().list(&Default::default()).await else {
            return 0;
        };
        claims
            .items
            .iter()
            .filter(|c| {
                c.spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.as_deref())
                    == class
                    && c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
            })
            .count()
    }

    /// The claims of pod `pod` that are not bound yet, said with their phase and storage
    /// class, and the class's name.
    async fn unbound_claims(&self, pod: &Pod) -> Vec<(String, Option<String>)> {
        let mut unbound = Vec::new();
        let volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        for claim in volumes
            .into_iter()
            .filter_map(|v| v.persistent_volume_claim)
        {
            let name = claim.claim_name;
            let (phase, class) = match self.claims().get_opt(&name).await {
                Ok(Some(c)) => (
                    c.status.and_then(|s| s.phase).unwrap_or_default(),
                    c.spec.and_then(|s| s.storage_class_name),
                ),
                Ok(None) => ("missing".to_string(), None),
                Err(_) => continue,
            };
            if phase != "Bound" {
                let said = class
                    .as_ref()
                    .map(|c| format!("storage class '{c}'"))
                    .unwrap_or_else(|| "the default storage class".to_string());
                unbound.push((format!("'{name}' ({phase}, {said})"), class));
            }
        }
        unbound
    }
}

impl KubeBackend {
    /// A claim of a storage class that does not exist would stay Pending for ever: refused
    /// before it is made. Where the user may not read storage classes (cluster-scoped), the
    /// claim's binding tells instead ([`Self::wait_running`]).
    pub(super) async fn check_storage_class(&self, claim: &str, class: &str) -> Result<()> {
        let classes: kube::Api<k8s_openapi::api::storage::v1::StorageClass> =
            kube::Api::all(self.client.clone());
        match classes.get_opt(class).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(Error::environment(format!(
                "cannot create claim '{claim}': storage class '{class}' (CAW_BOX_STORAGE_CLASS) does not exist, so the claim would stay Pending"
            ))
            .with_hint("`kubectl get storageclass` lists the classes; unset CAW_BOX_STORAGE_CLASS for the default one")),
            Err(e) if is_status(&e, 403) => Ok(()),
            Err(e) => Err(failed(format!("read storage class '{class}'"), &e)),
        }
    }
}

/// Whether a storage class's claims go on binding: the count of its bound claims, seen
/// over the polls of a pod waiting for its own claims. Stalled once no new one has bound
/// for [`CLAIM_BIND_STALL`] (the first look starts the clock).
#[derive(Debug, Default)]
struct BindWatch {
    seen: Option<(usize, std::time::Instant)>,
}

impl BindWatch {
    fn observe(&mut self, bound: usize, now: std::time::Instant) {
        match &mut self.seen {
            Some((count, since)) if bound > *count => (*count, *since) = (bound, now),
            // Fewer: claims were deleted meanwhile; a bind counts from this count on.
            Some((count, _)) => *count = bound,
            None => self.seen = Some((bound, now)),
        }
    }

    fn stalled(&self, now: std::time::Instant) -> bool {
        self.seen
            .is_none_or(|(_, since)| now.duration_since(since) > CLAIM_BIND_STALL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_claim_queued_behind_binding_ones_is_waited_for_and_a_stalled_class_is_not() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut watch = BindWatch::default();
        assert!(
            watch.stalled(at(0)),
            "never looked: nothing says it goes on"
        );
        watch.observe(3, at(15));
        assert!(!watch.stalled(at(29)));
        // Others bind: the clock starts again.
        watch.observe(5, at(29));
        assert!(!watch.stalled(at(40)));
        // Some deleted, none bound since: stalled 15 s after the last bind.
        watch.observe(2, at(42));
        assert!(!watch.stalled(at(44)));
        assert!(watch.stalled(at(45)));
        // A bind after the deletions counts.
        watch.observe(3, at(46));
        assert!(!watch.stalled(at(50)));
    }
}
