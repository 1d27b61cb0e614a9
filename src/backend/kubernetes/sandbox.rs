//! What every container caw-box puts in a pod gets: the image pull policy, a non-root
//! sandbox with a read-only root, the pod's security context; and its volumes (claims for
//! caw-box's mounts, memory or disk for the rest). Pure.

use k8s_openapi::api::core::v1::{
    Capabilities, EmptyDirVolumeSource, PersistentVolumeClaimVolumeSource, PodSecurityContext,
    SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::backend::{MountSource, MountSpec};
use crate::error::{Error, Result};

/// `uid:gid` into numbers.
pub(super) fn parse_user(user: &str) -> Option<(i64, i64)> {
    let (u, g) = user.split_once(':').unwrap_or((user, user));
    Some((u.parse().ok()?, g.parse().ok()?))
}

/// The pod's volumes and mounts for caw-box's mounts: claims only (a host directory is not
/// something a cluster has).
pub(super) fn claim_mounts(mounts: &[&MountSpec]) -> Result<(Vec<Volume>, Vec<VolumeMount>)> {
    let mut volumes = Vec::new();
    let mut volume_mounts = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let claim = match &m.source {
            MountSource::Volume(v) => v.clone(),
            MountSource::HostDir(dir) => {
                return Err(Error::usage(format!(
                    "the kubernetes backend cannot mount the host directory {dir}"
                ))
                .with_hint("use --workspace-mode copy (the default on Kubernetes)"))
            }
        };
        let name = format!("v{i}");
        volumes.push(Volume {
            name: name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim,
                read_only: Some(m.read_only),
            }),
            ..Default::default()
        });
        volume_mounts.push(VolumeMount {
            name,
            mount_path: m.target.clone(),
            read_only: Some(m.read_only),
            ..Default::default()
        });
    }
    Ok((volumes, volume_mounts))
}

pub(super) fn empty_dir(name: &str, memory: bool, limit: &str) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: memory.then(|| "Memory".to_string()),
            size_limit: Some(Quantity(limit.to_string())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The sandbox every agent pod gets: non-root, no capabilities, no privilege escalation,
/// a read-only root filesystem.
pub(super) fn hardened(uid: i64, gid: i64) -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(uid != 0),
        run_as_user: Some(uid),
        run_as_group: Some(gid),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: None,
        }),
        ..Default::default()
    }
}

pub(super) fn pod_security(gid: i64) -> PodSecurityContext {
    PodSecurityContext {
        fs_group: Some(gid),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// Where a seeding init container mounts the volume it fills.
pub(super) const SEED_MOUNT: &str = "/caw-box-seed";

/// An init container `name` of `image` that runs `script` (as `uid:gid`, hardened) with the
/// volume `volume` at [`SEED_MOUNT`]: it fills that volume from the image before the pod's
/// containers start.
pub(super) fn seed_container(
    name: &str,
    image: &str,
    script: String,
    (uid, gid): (i64, i64),
    volume: &str,
) -> k8s_openapi::api::core::v1::Container {
    k8s_openapi::api::core::v1::Container {
        name: name.into(),
        image: Some(image.to_string()),
        command: Some(vec!["sh".into(), "-c".into(), script]),
        security_context: Some(hardened(uid, gid)),
        volume_mounts: Some(vec![k8s_openapi::api::core::v1::VolumeMount {
            name: volume.into(),
            mount_path: SEED_MOUNT.into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// `KEY=VALUE` entries as a container's variables.
pub(super) fn env_vars<'a>(
    env: impl IntoIterator<Item = &'a String>,
) -> Vec<k8s_openapi::api::core::v1::EnvVar> {
    env.into_iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            k8s_openapi::api::core::v1::EnvVar {
                name: k.to_string(),
                value: Some(v.to_string()),
                value_from: None,
            }
        })
        .collect()
}
