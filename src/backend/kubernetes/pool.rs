//! A pool's ready boxes on Kubernetes (`caw-box pool`, `session::lifecycle::pool`): a box is
//! a warm pod made for no turn ([`super::warm`]) under the name of the session it will be,
//! idle, with its claims bound. A pod cannot be renamed, so it is shown under its box's
//! name by a label, [`POOL_BOX`] (also an annotation, as every caw-box label here), and a
//! claim is a patch of that label made with the pod's `resourceVersion` as read: of racing
//! claims the API server takes one and refuses the others (409). A claim for the session
//! whose name the pod has takes the label away (the pod is that session's idle warm pod); a
//! claim for any other name (a stale box taken aside to be removed) sets it to that name's
//! idle name, as Docker's rename does.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};

use super::warm::{idle_name, POOL_BOX};
use super::{failed, is_status, meta, KubeBackend};
use crate::error::{Error, Result};

/// `name`, where it can be the value of the [`POOL_BOX`] label; an error where not.
fn label_value(name: &str) -> Result<()> {
    match meta::valid_label_value(name) {
        true => Ok(()),
        false => Err(Error::environment(format!(
            "'{name}' cannot name a pool's box on Kubernetes"
        ))),
    }
}

impl KubeBackend {
    /// The pod shown as the pool's box `box_name`, unless it is being deleted.
    async fn box_pod(&self, box_name: &str) -> Result<Option<Pod>> {
        if !meta::valid_label_value(box_name) {
            return Ok(None);
        }
        let pods = self.list_pods(&format!("{POOL_BOX}={box_name}")).await?;
        Ok(pods
            .into_iter()
            .find(|p| p.metadata.deletion_timestamp.is_none()))
    }

    /// Notes the idle warm pod `name`, made for no turn, as the pool's box `box_name`, once
    /// it runs (a box is ready when its pod is: its claims bound, its image's HOME seeded).
    pub(super) async fn pool_park(&self, name: &str, box_name: &str) -> Result<()> {
        label_value(box_name)?;
        let image = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?
            .and_then(|p| p.spec?.containers.first()?.image.clone())
            .unwrap_or_default();
        self.wait_running(name, &image).await?;
        let patch = serde_json::json!({"metadata": {
            "labels": { POOL_BOX: box_name },
            "annotations": { POOL_BOX: box_name },
        }});
        self.pods()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| failed(format!("park pod '{name}' in its pool"), &e))
    }

    /// Claims the pool's box `box_name` for turn `name` (see the module docs): `false` when
    /// it is gone or a racing claim took it first.
    pub(super) async fn pool_claim(&self, box_name: &str, name: &str) -> Result<bool> {
        let Some(pod) = self.box_pod(box_name).await? else {
            return Ok(false);
        };
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let shown = match name == pod_name {
            true => serde_json::Value::Null,
            false => {
                let idle = idle_name(name);
                label_value(&idle)?;
                idle.into()
            }
        };
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": pod.metadata.resource_version,
            "labels": { POOL_BOX: shown },
            "annotations": { POOL_BOX: shown },
        }});
        match self
            .pods()
            .patch(&pod_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(false),
            Err(e) => Err(failed(format!("claim the pool's box '{box_name}'"), &e)),
        }
    }

    /// Deletes the pod shown as the pool's box `box_name` (only the one of `uid` when
    /// given), once it is gone.
    pub(super) async fn remove_box(&self, box_name: &str, uid: Option<String>) -> Result<()> {
        let Some(pod) = self.box_pod(box_name).await? else {
            return Ok(());
        };
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        // Not forced: its idle loop ends on SIGTERM at once (see `warm::remove_idle`).
        self.delete_pod(&pod_name, uid.or(pod.metadata.uid), false)
            .await
    }

    /// Runs `argv` to its end in the pool's box `box_name`, as its user, with no stdin: its
    /// exit code.
    pub(super) async fn pool_prime(&self, box_name: &str, argv: Vec<String>) -> Result<i64> {
        let pod = self
            .box_pod(box_name)
            .await?
            .ok_or_else(|| Error::environment(format!("the pool's box '{box_name}' is gone")))?;
        let pod_name = pod.metadata.name.unwrap_or_default();
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        // (An exec that ends non-zero is an error here: its code is in its message.)
        match self.exec(&pod_name, &argv, None).await {
            Ok(_) => Ok(0),
            Err(e) => {
                tracing::debug!("{e}");
                Ok(1)
            }
        }
    }
}
