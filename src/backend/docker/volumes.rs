//! Volumes (a session's state, workspace and turn records) and networks (a turn's egress).

use std::collections::HashMap;

use bollard::models::{Volume, VolumeCreateRequest};
use bollard::query_parameters::{ListVolumesOptions, RemoveVolumeOptions};

use super::{is_not_found, DockerBackend};
use crate::backend::VolumeInfo;
use crate::error::Result;

fn info(v: Volume) -> VolumeInfo {
    VolumeInfo {
        name: v.name,
        labels: v.labels,
    }
}

/// Whether `labels` has every one of `filters` (`key=value`, or a bare `key`), as Docker's
/// `label` filter means it.
/// Podman's "route ip+net: no such network interface": Go's listing of the host's
/// interface addresses lost a race with an interface being removed.
fn is_interface_race(e: &bollard::errors::Error) -> bool {
    matches!(e, bollard::errors::Error::DockerResponseServerError { status_code: 500, message }
        if message.contains("no such network interface"))
}

fn carries_all(labels: &HashMap<String, String>, filters: &[String]) -> bool {
    filters.iter().all(|f| match f.split_once('=') {
        Some((key, value)) => labels.get(key).is_some_and(|v| v == value),
        None => labels.contains_key(f.as_str()),
    })
}

impl DockerBackend {
    pub async fn create_volume(&self, name: &str, labels: HashMap<String, String>) -> Result<()> {
        self.docker
            .create_volume(VolumeCreateRequest {
                name: Some(name.to_string()),
                labels: Some(labels),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| self.failed(format_args!("create volume '{name}'"), &e))
    }

    pub async fn inspect_volume(&self, name: &str) -> Result<Option<VolumeInfo>> {
        match self.docker.inspect_volume(name).await {
            Ok(v) => Ok(Some(info(v))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.failed(format_args!("inspect volume '{name}'"), &e)),
        }
    }

    /// Volumes carrying all of `labels` (`key=value` or bare `key`): one Docker call.
    pub async fn list_volumes(&self, labels: &[String]) -> Result<Vec<VolumeInfo>> {
        let filters = HashMap::from([("label".to_string(), labels.to_vec())]);
        let res = self
            .docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| self.failed("list volumes", &e))?;
        // Podman (4.3) returns the volumes carrying *any* of the labels: filter again here.
        Ok(res
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter(|v| carries_all(&v.labels, labels))
            .map(info)
            .collect())
    }

    pub async fn remove_volume(&self, name: &str) -> Result<()> {
        match self
            .docker
            .remove_volume(name, Some(RemoveVolumeOptions { force: false }))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.failed(format_args!("remove volume '{name}'"), &e)),
        }
    }

    /// Removes the volumes carrying all of `labels` that no container uses (Docker's
    /// `dangling`); their names. The daemon refuses to remove one a container uses: it stays.
    pub async fn remove_unused_volumes(&self, labels: &[String]) -> Result<Vec<String>> {
        let filters = HashMap::from([
            ("label".to_string(), labels.to_vec()),
            ("dangling".to_string(), vec!["true".to_string()]),
        ]);
        let listed = self
            .docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| self.failed("list unused volumes", &e))?;
        let mut removed = Vec::new();
        // Podman (4.3) returns the volumes carrying *any* of the labels: filter again here.
        for v in listed.volumes.unwrap_or_default() {
            if !carries_all(&v.labels, labels) {
                continue;
            }
            let options = Some(RemoveVolumeOptions { force: false });
            match self.docker.remove_volume(&v.name, options).await {
                Ok(()) => removed.push(v.name),
                // In use (Docker and Podman answer 409), or gone meanwhile: not this one.
                Err(e) if super::is_conflict(&e) || is_not_found(&e) => {}
                Err(e) => return Err(self.failed(format_args!("remove volume '{}'", v.name), &e)),
            }
        }
        Ok(removed)
    }

    /// Creates a network (`internal`: no route out of it) with labels.
    pub async fn create_network(
        &self,
        name: &str,
        internal: bool,
        labels: HashMap<String, String>,
    ) -> Result<()> {
        let request = bollard::models::NetworkCreateRequest {
            name: name.to_string(),
            internal: Some(internal),
            labels: Some(labels),
            ..Default::default()
        };
        // Podman checks a new network's subnet against the host's interface addresses; a
        // veth that another container's teardown removes mid-listing fails that check
        // ("route ip+net: no such network interface"). Nothing was made: ask again.
        let mut attempts = 0;
        loop {
            match self.docker.create_network(request.clone()).await {
                Err(e) if attempts < 20 && is_interface_race(&e) => {
                    attempts += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                other => {
                    return other
                        .map(|_| ())
                        .map_err(|e| self.failed(format_args!("create network '{name}'"), &e))
                }
            }
        }
    }

    /// The names of the networks carrying every one of `labels` ("key=value").
    pub async fn list_networks(&self, labels: &[String]) -> Result<Vec<String>> {
        let filters = HashMap::from([("label".to_string(), labels.to_vec())]);
        let networks = self
            .docker
            .list_networks(Some(bollard::query_parameters::ListNetworksOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| self.failed("list networks", &e))?;
        Ok(networks.into_iter().filter_map(|n| n.name).collect())
    }

    pub async fn remove_network(&self, name: &str) -> Result<()> {
        match self.docker.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.failed(format_args!("remove network '{name}'"), &e)),
        }
    }

    /// Attaches a (created) container to a network under `alias`.
    pub async fn connect_network(&self, network: &str, container: &str, alias: &str) -> Result<()> {
        self.docker
            .connect_network(
                network,
                bollard::models::NetworkConnectRequest {
                    container: container.to_string(),
                    endpoint_config: Some(bollard::models::EndpointSettings {
                        aliases: Some(vec![alias.to_string()]),
                        ..Default::default()
                    }),
                },
            )
            .await
            .map_err(|e| {
                self.failed(
                    format_args!("attach container '{container}' to network '{network}'"),
                    &e,
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_must_carry_every_label_asked_for() {
        let labels = HashMap::from([
            ("io.caw-box.session".to_string(), "s1".to_string()),
            ("io.caw-box.role".to_string(), "state".to_string()),
        ]);
        let ask = |f: &[&str]| {
            carries_all(
                &labels,
                &f.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
        };
        assert!(ask(&[]));
        assert!(ask(&["io.caw-box.session=s1", "io.caw-box.role=state"]));
        assert!(ask(&["io.caw-box.session"]));
        // What Podman 4.3 returned for a turn-record listing: the state volume.
        assert!(!ask(&[
            "io.caw-box.session=s1",
            "io.caw-box.role=turn-record"
        ]));
        assert!(!ask(&["io.caw-box.other"]));
        assert!(!ask(&["io.caw-box.session=s"]));
    }

    #[test]
    fn only_podmans_interface_race_is_asked_again() {
        let answer =
            |status_code, message: &str| bollard::errors::Error::DockerResponseServerError {
                status_code,
                message: message.to_string(),
            };
        // What Podman 4.3 answered in CI while other containers came and went.
        assert!(is_interface_race(&answer(
            500,
            "route ip+net: no such network interface"
        )));
        assert!(!is_interface_race(&answer(
            409,
            "network with name x already exists"
        )));
        assert!(!is_interface_race(&answer(500, "no such image: x")));
    }
}
