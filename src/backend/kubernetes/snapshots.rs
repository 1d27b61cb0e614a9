//! A claim made as a copy of another by the storage itself: a CSI VolumeSnapshot of the
//! source claim, and the new claim provisioned from it (`dataSource`), where the claims'
//! StorageClass has a VolumeSnapshotClass of its driver. A fork of a session's latest turn
//! then copies nothing through a pod.
//!
//! Written against `snapshot.storage.k8s.io/v1` (the external-snapshotter's CRDs and
//! controller must be installed). The test cluster's StorageClass offers no snapshots, so
//! the tests there prove only that its absence is found and the checkpoint copy used; this
//! path itself is not exercised by a test (docs/kubernetes.md says so).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, TypedObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{json, Value};

use super::{failed, is_status, meta, KubeBackend};
use crate::error::{Error, Result};

const GROUP: &str = "snapshot.storage.k8s.io";
const VERSION: &str = "v1";
/// How long a snapshot may take to be ready to use.
const READY_WITHIN: Duration = Duration::from_secs(300);
/// The annotation that marks a cluster's default StorageClass, and a driver's default
/// VolumeSnapshotClass.
const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
const DEFAULT_SNAPSHOT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, VERSION, kind))
}

/// A claim of `class` (the cluster's default when `None`) of `size`, from `source` when given.
pub(super) fn claim(
    metadata: ObjectMeta,
    class: Option<String>,
    size: String,
    source: Option<TypedObjectReference>,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: class,
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), Quantity(size))])),
                ..Default::default()
            }),
            data_source_ref: source,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The VolumeSnapshot `name` of claim `from`, by snapshot class `class`.
fn snapshot(
    name: &str,
    namespace: &str,
    class: &str,
    from: &str,
    labels: &HashMap<String, String>,
) -> Value {
    let (labels, _) = meta::split(labels);
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "VolumeSnapshot",
        "metadata": { "name": name, "namespace": namespace, "labels": labels },
        "spec": {
            "volumeSnapshotClassName": class,
            "source": { "persistentVolumeClaimName": from },
        },
    })
}

/// Of the VolumeSnapshotClasses, the one for `driver`: its default one, else the first by
/// name.
fn class_for(classes: &[DynamicObject], driver: &str) -> Option<String> {
    let mut theirs: Vec<&DynamicObject> = classes
        .iter()
        .filter(|c| c.data.get("driver").and_then(Value::as_str) == Some(driver))
        .collect();
    theirs.sort_by_key(|c| {
        let default = c
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEFAULT_SNAPSHOT_CLASS))
            .is_some_and(|v| v == "true");
        (!default, c.metadata.name.clone())
    });
    theirs.first().and_then(|c| c.metadata.name.clone())
}

/// A snapshot's state: `Ok(Some(size))` once it is ready to use (the size a claim made from
/// it needs, when it says), `Ok(None)` while it is not, `Err` when it failed.
fn readiness(snapshot: &DynamicObject) -> Result<Option<Option<String>>> {
    let status = snapshot.data.get("status");
    if let Some(message) = status
        .and_then(|s| s.get("error"))
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
    {
        return Err(Error::environment(format!(
            "the snapshot '{}' failed: {message}",
            snapshot.metadata.name.as_deref().unwrap_or("?")
        )));
    }
    let ready = status
        .and_then(|s| s.get("readyToUse"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(ready.then(|| {
        status
            .and_then(|s| s.get("restoreSize"))
            .and_then(Value::as_str)
            .map(str::to_string)
    }))
}

impl KubeBackend {
    /// The VolumeSnapshotClass of the driver of the claims' StorageClass (the named one, else
    /// the cluster's default), if the cluster has the snapshot API and such a class.
    pub(super) async fn snapshot_class(&self) -> Result<Option<String>> {
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        let storage = match &self.cluster.storage_class {
            Some(name) => classes.get_opt(name).await,
            None => classes.list(&Default::default()).await.map(|l| {
                l.items.into_iter().find(|c| {
                    c.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(DEFAULT_CLASS))
                        .is_some_and(|v| v == "true")
                })
            }),
        };
        let driver = match storage {
            Ok(Some(c)) => c.provisioner,
            Ok(None) => return Ok(None),
            // Not allowed to read classes: no snapshots then, the copy through a pod.
            Err(e) if is_status(&e, 403) => return Ok(None),
            Err(e) => return Err(failed("read the storage classes", &e)),
        };
        let snapshot_classes: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &resource("VolumeSnapshotClass"));
        match snapshot_classes.list(&Default::default()).await {
            Ok(list) => Ok(class_for(&list.items, &driver)),
            // No snapshot API on this cluster (404), or not for us (403).
            Err(e) if is_status(&e, 404) || is_status(&e, 403) => Ok(None),
            Err(e) => Err(failed("list the volume snapshot classes", &e)),
        }
    }

    /// Makes claim `to` (labelled `labels`) a copy of claim `from` as it is now: a snapshot
    /// of `from` by `class`, then `to` provisioned from it. The snapshot is deleted either
    /// way: a claim being provisioned from it holds it until it is (the snapshot
    /// controller's source protection).
    pub(super) async fn clone_claim(
        &self,
        class: &str,
        from: &str,
        to: &str,
        labels: &HashMap<String, String>,
    ) -> Result<()> {
        let snapshots: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &resource("VolumeSnapshot"),
        );
        let name = format!("{to}-source");
        let object: DynamicObject =
            serde_json::from_value(snapshot(&name, &self.namespace, class, from, labels))
                .map_err(|e| Error::environment(format!("a snapshot object: {e}")))?;
        snapshots
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| {
                failed(
                    format!("create the snapshot '{name}' of claim '{from}'"),
                    &e,
                )
            })?;
        let made = async {
            let size = self.ready(&snapshots, &name).await?;
            let (k8s_labels, annotations) = meta::split(labels);
            let metadata = ObjectMeta {
                name: Some(to.to_string()),
                namespace: Some(self.namespace.clone()),
                labels: Some(k8s_labels),
                annotations: Some(annotations),
                ..Default::default()
            };
            let size = size
                .or_else(|| self.cluster.volume_size.clone())
                .unwrap_or_else(|| "1Gi".into());
            let source = TypedObjectReference {
                api_group: Some(GROUP.into()),
                kind: "VolumeSnapshot".into(),
                name: name.clone(),
                namespace: None,
            };
            let claim = claim(
                metadata,
                self.cluster.storage_class.clone(),
                size,
                Some(source),
            );
            self.claims()
                .create(&PostParams::default(), &claim)
                .await
                .map(|_| ())
                .map_err(|e| failed(format!("create claim '{to}' from snapshot '{name}'"), &e))
        }
        .await;
        if let Err(e) = snapshots.delete(&name, &DeleteParams::default()).await {
            if !is_status(&e, 404) {
                tracing::warn!("{}", failed(format!("delete the snapshot '{name}'"), &e));
            }
        }
        made
    }

    /// Waits for snapshot `name` to be ready to use; its restore size, when it says one.
    async fn ready(&self, snapshots: &Api<DynamicObject>, name: &str) -> Result<Option<String>> {
        let deadline = std::time::Instant::now() + READY_WITHIN;
        loop {
            let now = snapshots
                .get(name)
                .await
                .map_err(|e| failed(format!("read the snapshot '{name}'"), &e))?;
            if let Some(size) = readiness(&now)? {
                return Ok(size);
            }
            if std::time::Instant::now() > deadline {
                return Err(Error::environment(format!(
                    "the snapshot '{name}' was not ready to use within {} s",
                    READY_WITHIN.as_secs()
                ))
                .with_hint("`kubectl describe volumesnapshot` says why; the fork was not made"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    /// The class of the claims' driver, its default one first; none for another driver.
    #[test]
    fn the_snapshot_class_is_the_drivers_default_else_its_first() {
        let class = |name: &str, driver: &str, default: bool| {
            let mut v = json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
                "metadata": {"name": name}, "driver": driver, "deletionPolicy": "Delete",
            });
            if default {
                v["metadata"]["annotations"] = json!({DEFAULT_SNAPSHOT_CLASS: "true"});
            }
            object(v)
        };
        let classes = [
            class("b-ebs", "ebs.csi.aws.com", false),
            class("a-ebs", "ebs.csi.aws.com", false),
            class("gold", "pd.csi.storage.gke.io", true),
        ];
        assert_eq!(
            class_for(&classes, "ebs.csi.aws.com").as_deref(),
            Some("a-ebs")
        );
        let mut with_default = classes.to_vec();
        with_default.push(class("z-ebs", "ebs.csi.aws.com", true));
        assert_eq!(
            class_for(&with_default, "ebs.csi.aws.com").as_deref(),
            Some("z-ebs")
        );
        assert_eq!(class_for(&classes, "rancher.io/local-path"), None);
    }

    /// A snapshot is waited for until ready (its restore size then), and its error is one.
    #[test]
    fn a_snapshot_is_ready_pending_or_failed() {
        let snap = |status: Value| {
            object(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": "s"}, "spec": {}, "status": status,
            }))
        };
        assert_eq!(readiness(&snap(json!({}))).unwrap(), None);
        assert_eq!(
            readiness(&snap(json!({"readyToUse": true, "restoreSize": "2Gi"}))).unwrap(),
            Some(Some("2Gi".to_string()))
        );
        let e = readiness(&snap(
            json!({"readyToUse": false, "error": {"message": "quota"}}),
        ))
        .unwrap_err();
        assert!(e.message.contains("quota"), "{}", e.message);
    }

    /// The snapshot names its class and source claim; the claim made from it names it as
    /// its data source, with the session's labels.
    #[test]
    fn a_clone_is_a_snapshot_and_a_claim_from_it() {
        let labels = HashMap::from([("io.caw-box.session".to_string(), "f".to_string())]);
        let s = snapshot("caw-box-f-source", "ns", "csi-snap", "caw-box-s", &labels);
        assert_eq!(s["spec"]["volumeSnapshotClassName"], "csi-snap");
        assert_eq!(
            s["spec"]["source"]["persistentVolumeClaimName"],
            "caw-box-s"
        );
        assert_eq!(s["metadata"]["labels"]["io.caw-box.session"], "f");
        let _: DynamicObject = serde_json::from_value(s).unwrap();
        let source = TypedObjectReference {
            api_group: Some(GROUP.into()),
            kind: "VolumeSnapshot".into(),
            name: "caw-box-f-source".into(),
            namespace: None,
        };
        let c = claim(ObjectMeta::default(), None, "3Gi".into(), Some(source));
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["spec"]["dataSourceRef"]["kind"], "VolumeSnapshot");
        assert_eq!(json["spec"]["dataSourceRef"]["apiGroup"], GROUP);
        assert_eq!(json["spec"]["resources"]["requests"]["storage"], "3Gi");
    }
}
